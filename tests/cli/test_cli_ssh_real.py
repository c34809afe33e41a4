"""`devcloud ssh` for real: the CLI asks the live portal where the gateway is, which key it has and which
instance the short id names, then becomes the real OpenSSH client, which runs a command in a real
container through the real gateway process, checking the gateway's host key strictly.

The CI tests run the CLI as a CI job would: an empty HOME, no terminal, no known_hosts, and only PATH,
DEVCLOUD_URL, DEVCLOUD_TOKEN and the job's ssh-agent (SSH_AUTH_SOCK) in the environment."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.api import services
from portal.sshgateway.models import SshSession
from tests.sshgateway.conftest import add_key, start_gateway, stop_gateway

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300, func_only=True),
]

REFUSED = 1
# OpenSSH's own exit code for a connection it refused or lost.
SSH_FAILED = 255


class CiJob:
    """`devcloud` run as a CI step: its own empty HOME, stdin not a terminal, no controlling terminal,
    and nothing in the environment but what the job sets."""

    def __init__(self, home: Path, env: dict):
        self.home = home
        self.env = env

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        devcloud = Path(sys.executable).with_name("devcloud")
        return subprocess.run(
            [str(devcloud), *args],
            env=self.env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
            check=False,
        )


@pytest.fixture
def ci_job(alice, keygen, ssh_agent, launch, portal_with_gateway, tmp_path):
    """(CiJob, instance): Alice's running instance, and a CI job holding her key in its agent and a
    launch-scoped token in DEVCLOUD_TOKEN."""
    key = keygen("ci")
    add_key(alice, key, "ci")
    instance = launch(alice)
    token = services.token_create(user=alice, name="ci", scope="launch", days=1)[1]
    home = tmp_path / "ci-home"
    home.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "DEVCLOUD_URL": portal_with_gateway,
        "DEVCLOUD_TOKEN": token,
        "SSH_AUTH_SOCK": ssh_agent(key),
    }
    return CiJob(home, env), instance


def test_devcloud_ssh_runs_a_command_from_a_ci_job_with_an_empty_home_and_no_terminal(ci_job, gateway):
    job, instance = ci_job

    result = job("ssh", instance.short_id, "--", "python3", "-c", "print(6 * 7)")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"
    # The gateway's key was pinned from the API on first use, and checked strictly.
    pinned = (job.home / ".config" / "devcloud" / "known_hosts").read_text()
    assert pinned == f"[127.0.0.1]:{gateway.port} {' '.join(gateway.host_key.with_suffix('.pub').read_text().split()[:2])}\n"
    assert "Pinned the SSH gateway's host key SHA256:" in result.stderr
    assert "Host key verification failed" not in result.stderr


def test_devcloud_ssh_passes_the_remote_command_exit_code_through(ci_job):
    job, instance = ci_job
    assert job("ssh", instance.short_id, "--", "python3", "-c", "print(6 * 7)").returncode == 0

    result = job("ssh", instance.short_id, "--", "sh", "-c", "exit 3")

    assert result.returncode == 3, result.stderr


def test_devcloud_ssh_refuses_when_the_pinned_gateway_key_is_not_the_published_one(ci_job, keygen, gateway):
    job, instance = ci_job
    other = keygen("not-the-gateway")
    known_hosts = job.home / ".config" / "devcloud" / "known_hosts"
    known_hosts.parent.mkdir(parents=True)
    known_hosts.write_text(f"[127.0.0.1]:{gateway.port} {' '.join(other.public_line.split()[:2])}\n")

    result = job("ssh", instance.short_id, "--", "python3", "-c", "print(6 * 7)")

    assert result.returncode == REFUSED
    assert "The SSH gateway's host key has changed" in result.stderr
    assert "devcloud ssh-config --accept-new-gateway-key" in result.stderr
    assert result.stdout == ""
    assert not SshSession.objects.filter(instance=instance).exists()


def test_devcloud_ssh_never_reaches_the_instance_through_a_gateway_with_another_key(
    ci_job, gateway, settings, tmp_path
):
    """Someone answers on the gateway's address with a gateway of their own (another host key): OpenSSH,
    holding the key the portal publishes, refuses it before it authenticates."""
    job, instance = ci_job
    impostor = start_gateway(tmp_path, host_key=tmp_path / "impostor_host_key")
    try:
        # People are sent to the impostor's port; the portal still publishes the real gateway's key.
        settings.SSH_GATEWAY_PORT = impostor.port

        result = job("ssh", instance.short_id, "--", "python3", "-c", "print(6 * 7)")

        assert result.returncode == SSH_FAILED
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
        assert "Host key verification failed" in result.stderr
        assert result.stdout == ""
        assert "Authenticated" not in impostor.log()
        assert not SshSession.objects.filter(instance=instance).exists()
    finally:
        stop_gateway(impostor)


def test_devcloud_ssh_runs_a_command_with_a_persons_own_ssh_config(
    alice, keygen, launch, portal_with_gateway, devcloud, tmp_path
):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    token = services.token_create(user=alice, name="laptop", scope="read", days=1)[1]
    assert devcloud("login", "--url", portal_with_gateway, "--token", token).returncode == 0
    # -F: the identity a person's ~/.ssh/config gives them; host keys are the CLI's to check.
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  IdentityFile {key.private}\n  IdentitiesOnly yes\n  IdentityAgent none\n")

    result = devcloud(
        "ssh", instance.short_id, "-F", str(config), "--", "python3 -c 'print(6*7)'; id -un", input=""
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["42", "developer"]
