"""A person reaches their own running instance with the real OpenSSH client through the real gateway:
a command, scp both ways, and `ssh -L` to JupyterLab inside. The instance's sshd is published like
JupyterLab, on the host's private address only."""

import subprocess
import time
import uuid

import httpx
import pytest

from portal.sshgateway.models import SshSession
from provisioning.drivers.docker import container_name
from tests.support.docker_instances import docker_client, wait_for_jupyter

from .conftest import add_key, free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300, func_only=True)]


def test_it_runs_a_command_in_the_instance(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)

    result = ssh_as(key).run(instance.short_id, "python3 -c 'print(6*7)'; id -un; hostname")

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["42", "developer", f"devcloud-{instance.short_id}"]


def test_it_copies_a_file_both_ways_with_scp(alice, keygen, ssh_as, launch, tmp_path):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    ssh = ssh_as(key)
    sent = tmp_path / "train.py"
    sent.write_bytes(b"print('hello from the laptop')\n" * 2000)

    up = ssh.scp(str(sent), f"developer@{instance.short_id}:/workspace/train.py")
    down = ssh.scp(f"developer@{instance.short_id}:/workspace/train.py", str(tmp_path / "back.py"))

    assert up.returncode == 0, up.stderr
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back.py").read_bytes() == sent.read_bytes()
    assert ssh.run(instance.short_id, "wc -c < /workspace/train.py").stdout.strip() == str(sent.stat().st_size)


@pytest.mark.parametrize(
    "instance_id",
    [
        # OpenSSH reads an all-digit hostname as inet_aton does: this one arrives as 3.194.143.158 ...
        "63082398-0000-4000-8000-000000000001",
        # ... and with a leading zero as octal: this one arrives as 0.5.57.119.
        "01234567-0000-4000-8000-000000000002",
    ],
)
def test_an_instance_whose_short_id_is_all_digits_is_reached_by_it(alice, keygen, ssh_as, launch, instance_id):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice, id=uuid.UUID(instance_id))

    result = ssh_as(key).run(instance.short_id, "hostname")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"devcloud-{instance.short_id}"


def test_ssh_L_reaches_jupyterlab_inside(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    wait_for_jupyter(instance.driver_state["endpoint"], instance)
    local_port = free_port()
    tunnel = subprocess.Popen(
        [*ssh_as(key).args(), "-N", "-L", f"{local_port}:localhost:8888", f"developer@{instance.short_id}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        status = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and status is None:
            try:
                status = httpx.get(
                    f"http://127.0.0.1:{local_port}/instances/{instance.id}/lab/api/status",
                    headers={"Authorization": f"token {instance.jupyter_token}"},
                    timeout=5,
                )
            except httpx.TransportError:
                assert tunnel.poll() is None, tunnel.stderr.read().decode()
                time.sleep(0.2)
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)

    assert status is not None and status.status_code == 200
    assert "last_activity" in status.json()


def test_it_accepts_the_container_hostname_and_the_full_id(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    ssh = ssh_as(key)

    by_hostname = ssh.run(f"devcloud-{instance.short_id}", "echo ok")
    by_full_id = ssh.run(str(instance.id), "echo ok")

    assert (by_hostname.stdout.strip(), by_full_id.stdout.strip()) == ("ok", "ok"), (
        by_hostname.stderr + by_full_id.stderr
    )


def test_sshd_is_published_on_the_private_address_only(alice, launch):
    instance = launch(alice)

    ports = docker_client().containers.get(container_name(instance.id)).attrs["NetworkSettings"]["Ports"]

    assert [binding["HostIp"] for binding in ports["2222/tcp"]] == ["127.0.0.1"]
    assert instance.driver_state["ssh_port"] == int(ports["2222/tcp"][0]["HostPort"])


def test_each_session_is_recorded_with_its_bytes(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)

    result = ssh_as(key).run(instance.short_id, "head -c 200000 /dev/zero")
    session = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        session = SshSession.objects.filter(instance=instance, ended_at__isnull=False).first()
        if session:
            break
        time.sleep(0.1)

    assert result.returncode == 0
    assert session is not None, "no ended session recorded"
    assert session.user == alice
    assert session.key_name == "laptop" and session.key_fingerprint == key.fingerprint
    assert session.client_address.startswith("127.0.0.1:")
    # The command's 200 kB of output came back through the gateway, inside the encrypted stream.
    assert session.bytes_to_client > 200_000
    assert session.bytes_from_client > 0
    assert session.started_at <= session.ended_at


def test_rsync_and_sftp_work_through_the_gateway(alice, keygen, ssh_as, launch, tmp_path):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    ssh = ssh_as(key)
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "model.py").write_text("WIDTH = 4096\n")
    (project / "README").write_text("notes\n")
    remote_shell = " ".join([*ssh.args(), "-l", "developer"])

    synced = subprocess.run(
        ["rsync", "-a", "-e", remote_shell, f"{project}/", f"{instance.short_id}:/workspace/project/"],
        capture_output=True, text=True, timeout=60,
    )
    fetched = subprocess.run(
        [*ssh.args("sftp"), "-b", "-", f"developer@{instance.short_id}"],
        input=f"get /workspace/project/src/model.py {tmp_path / 'model.py'}\n",
        capture_output=True, text=True, timeout=60,
    )

    assert synced.returncode == 0, synced.stderr
    assert ssh.run(instance.short_id, "cat /workspace/project/README").stdout == "notes\n"
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "model.py").read_text() == "WIDTH = 4096\n"
