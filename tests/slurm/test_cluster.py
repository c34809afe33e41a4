"""What a user, an operator or an attacker notices of the Slurm backend, on a real Slurm cluster: jobs
through slurmrestd, GPUs as GRES with device isolation, the portal's image as a job, and failures."""

import http.server
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from provisioning.slurm.job import batch_script, job_request
from provisioning.slurm.rest import (
    SlurmAuthError,
    SlurmBadToken,
    SlurmRejected,
    SlurmRest,
    SlurmUnreachable,
    _jwt_expiry,
)
from tests.support.images import build_cpu_image
from tests.support.slurm import SlurmUnavailable, check_machine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180, func_only=True)]

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Opens every render node of the node's stand-in /dev and records what the devices cgroup decided
# (ENXIO: allowed, no driver behind it; EPERM: blocked), then holds its GPUs until cancelled.
PROBE = r"""#!/bin/bash
python3 - <<'EOF'
import errno, json, os
dri = os.path.join(os.environ["DEVICE_DIR"], "dri")
opened = {}
for name in sorted(os.listdir(dri)):
    try:
        os.close(os.open(os.path.join(dri, name), os.O_RDWR))
        opened[name] = "opened"
    except OSError as error:
        opened[name] = errno.errorcode[error.errno]
result = {"job_gpus": os.environ.get("SLURM_JOB_GPUS"), "rocr": os.environ.get("ROCR_VISIBLE_DEVICES"),
          "opened": opened}
path = os.path.join(os.environ["RESULT_DIR"], os.environ["SLURM_JOB_ID"] + ".json")
with open(path + ".part", "w") as handle:
    json.dump(result, handle)
os.rename(path + ".part", path)
EOF
exec sleep 300
"""


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s")
        time.sleep(0.05)


def sleeper(name, *, gres="gpu:1", node=None, directory="/tmp", **extra):
    job = {"name": name, "gres": gres, "no_requeue": True, "time_limit": 10, "current_working_directory": directory,
           "standard_output": f"{directory}/%j.out", "environment": {"PATH": PATH}, **extra}
    if node:
        job["nodelist"] = node
    return job


def probe_job(name, cluster, node, result_dir, gres="gpu:1"):
    job = sleeper(name, gres=gres, node=node.name, directory=str(result_dir))
    job["environment"].update(DEVICE_DIR=str(cluster.device_dir(node)), RESULT_DIR=str(result_dir))
    return job


def probe_result(result_dir, job_id, timeout=20):
    path = Path(result_dir) / f"{job_id}.json"
    wait_for(path.exists, timeout, f"job {job_id}'s probe result")
    return json.loads(path.read_text())


# --- jobs through REST ------------------------------------------------------------------------------


def test_it_runs_a_job_submitted_through_rest_until_it_is_cancelled(slurm_cluster, slurm_rest):
    job_id = slurm_rest.submit(script="#!/bin/sh\nexec sleep 300\n", job=sleeper("devcloud-rest-1"))

    running = wait_for(lambda: (job := slurm_rest.job(job_id)).state == "RUNNING" and job, 15, "RUNNING")
    assert running.nodes in {node.name for node in slurm_cluster.nodes}
    assert running.gres_detail[0].startswith("gpu:1(IDX:")
    assert running.requeue is False
    # A retried submission finds the job by its name instead of making a second one.
    assert slurm_rest.find_job("devcloud-rest-1").job_id == job_id

    slurm_rest.cancel(job_id)

    ended = wait_for(lambda: (job := slurm_rest.job(job_id)).ended and job, 10, "the cancelled job ending")
    assert ended.state == "CANCELLED"
    assert ended.end_time is not None
    slurm_rest.cancel(job_id)  # already ended: still fine
    assert slurm_rest.job(67108000) is None


def test_it_reports_a_job_submitted_to_an_unknown_partition_as_rejected(slurm_rest):
    with pytest.raises(SlurmRejected) as refused:
        slurm_rest.submit(script="#!/bin/sh\ntrue\n", job=sleeper("devcloud-nopart", partition="nope"))

    assert refused.value.permanent
    assert "Invalid partition" in refused.value.message

    with pytest.raises(SlurmRejected) as too_big:
        slurm_rest.submit(script="#!/bin/sh\ntrue\n", job=sleeper("devcloud-9gpus", gres="gpu:9"))
    assert "can ever hold" in too_big.value.message


def test_it_refuses_a_bad_token_with_the_bad_token_error(slurm_cluster):
    good = slurm_cluster.token()
    header, payload, signature = good.split(".")
    forged = f"{header}.{payload}.{signature[::-1]}"
    expiring = slurm_cluster.token(lifespan=1)

    with SlurmRest(slurm_cluster.rest_url, user_name="root", token=forged) as client:
        for call in (client.nodes, client.jobs, lambda: client.submit(script="#!/bin/sh\n", job=sleeper("x"))):
            with pytest.raises(SlurmBadToken) as refused:
                call()
            assert refused.value.permanent
            assert "scontrol token" in refused.value.message
    with SlurmRest(slurm_cluster.rest_url, user_name="root", token="") as client:
        with pytest.raises(SlurmAuthError) as missing:
            client.ping()
        assert missing.value.status == 401
    # Whole seconds: wait until the token's last second has certainly passed.
    time.sleep(max(0.0, _jwt_expiry(expiring) + 1.05 - time.time()))
    with SlurmRest(slurm_cluster.rest_url, user_name="root", token=expiring) as client, pytest.raises(
        SlurmBadToken, match="expired"
    ):
        client.jobs()


def test_it_reports_an_unreachable_slurmrestd_as_transient(slurm_cluster):
    client = SlurmRest(slurm_cluster.rest_url, user_name="root", token=slurm_cluster.token(), timeout=3)
    slurm_cluster.stop_rest()
    try:
        with pytest.raises(SlurmUnreachable) as unreachable:
            client.nodes()
        assert not unreachable.value.permanent
        assert slurm_cluster.rest_url in unreachable.value.message
    finally:
        slurm_cluster.start_rest()

    assert client.ping()["ping"] == "UP"


def test_it_keeps_jobs_and_nodes_across_a_controller_restart(slurm_cluster, slurm_rest):
    job_id = slurm_rest.submit(script="#!/bin/sh\nexec sleep 300\n", job=sleeper("devcloud-restart"))
    wait_for(lambda: slurm_rest.job(job_id).state == "RUNNING", 15, "RUNNING")

    slurm_cluster.restart_controller()

    assert slurm_rest.job(job_id).state == "RUNNING"
    assert {node.state for node in slurm_rest.nodes()} <= {"IDLE", "MIXED"}


# --- GPUs ---------------------------------------------------------------------------------------------


def test_it_gives_two_one_gpu_jobs_on_a_node_different_gpus_that_only_they_can_open(
    slurm_cluster, slurm_rest, tmp_path
):
    node = slurm_cluster.nodes[0]
    first = slurm_rest.submit(script=PROBE, job=probe_job("devcloud-gpu-a", slurm_cluster, node, tmp_path))
    second = slurm_rest.submit(script=PROBE, job=probe_job("devcloud-gpu-b", slurm_cluster, node, tmp_path))

    results = [probe_result(tmp_path, first), probe_result(tmp_path, second)]

    gpus = [int(result["job_gpus"]) for result in results]
    assert len(set(gpus)) == 2
    for gpu, result in zip(gpus, results):
        own = f"renderD{128 + gpu}"
        assert result["rocr"] == "0"  # renumbered from 0 inside the job
        assert result["opened"][own] == "ENXIO", result
        assert {name: error for name, error in result["opened"].items() if name != own} == {
            f"renderD{128 + other}": "EPERM" for other in range(8) if other != gpu
        }


def test_it_gives_an_eight_gpu_job_a_whole_node_and_makes_a_further_job_wait_for_resources(
    slurm_cluster, slurm_rest
):
    whole = [
        slurm_rest.submit(script="#!/bin/sh\nexec sleep 300\n",
                          job=sleeper(f"devcloud-8gpu-{node.name}", gres="gpu:8", node=node.name))
        for node in slurm_cluster.nodes
    ]
    for job_id in whole:
        wait_for(lambda: slurm_rest.job(job_id).state == "RUNNING", 15, "RUNNING")  # noqa: B023
        assert slurm_rest.job(job_id).gres_detail == ["gpu:8(IDX:0-7)"]
    assert {node.gres_used for node in slurm_rest.nodes()} == {"gpu:8"}

    waiting = slurm_rest.submit(script="#!/bin/sh\nexec sleep 300\n", job=sleeper("devcloud-waits"))

    pending = wait_for(lambda: (job := slurm_rest.job(waiting)).reason == "Resources" and job, 10, "Resources")
    assert pending.state == "PENDING"
    slurm_rest.cancel(whole[0])
    wait_for(lambda: slurm_rest.job(waiting).state == "RUNNING", 15, "the waiting job starting")


# --- the portal's image as a job -------------------------------------------------------------------------


class CallbackReceiver:
    """An HTTP server on the controller's address that records each POST (headers and JSON body)."""

    def __init__(self, address):
        self.calls = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.calls.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                                       "body": json.loads(body), "at": time.monotonic()})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_port}/api/instances/callback"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def callback(slurm_cluster):
    receiver = CallbackReceiver(slurm_cluster.controller_address)
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def cpu_rootfs(slurm_cluster):
    return slurm_cluster.rootfs_for(build_cpu_image())


def status(url, token=None, timeout=2):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None
    except OSError:  # not listening yet
        return None, None


def ssh(key, address, port, command, timeout=20):
    result = subprocess.run(
        ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"developer@{address}", command],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


INSIDE = r"""python3 - <<'EOF'
import errno, json, os
opened = {}
for path in ["/dev/kfd"] + sorted("/dev/dri/" + name for name in os.listdir("/dev/dri")):
    try:
        os.close(os.open(path, os.O_RDWR))
        opened[path] = "opened"
    except OSError as error:
        opened[path] = errno.errorcode[error.errno]
environ = dict(line.split("=", 1) for line in open("/proc/1/environ").read().split("\0") if "=" in line)
with open("/workspace/written-inside", "w") as handle:
    handle.write("hello")
try:
    open("/etc/written-inside", "w")
    root = "writable"
except OSError as error:
    root = errno.errorcode[error.errno]
print(json.dumps({"uid": os.getuid(), "opened": opened, "environ": environ, "root": root}))
EOF"""


def test_it_runs_the_portal_image_as_a_job_that_answers_calls_back_and_holds_only_its_gpus(
    slurm_cluster, slurm_rest, callback, cpu_rootfs, tmp_path
):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    workspace, run_dir = tmp_path / "workspace", tmp_path / "run"
    run_dir.mkdir()
    request = job_request(
        name="devcloud-instance-1", gpus=2, time_limit_minutes=10,
        jupyter_token="the-jupyter-token", jupyter_base_url="/instances/1/lab/",
        rootfs=str(cpu_rootfs), workspace_dir=str(workspace), run_dir=str(run_dir),
        callback_url=callback.url, callback_token="the-callback-token",
        authorized_keys=(tmp_path / "key.pub").read_text(),
        device_dir=str(slurm_cluster.directory / "dev" / "{node}"),
    )
    submitted = time.monotonic()

    job_id = slurm_rest.submit(script=batch_script(), job=request)

    wait_for(lambda: callback.calls, 30, "the callback")
    call = callback.calls[0]
    assert call["authorization"] == "Bearer the-callback-token"
    assert call["body"]["job_id"] == job_id
    node = slurm_cluster.node(call["body"]["node"])
    assert slurm_rest.job(job_id).nodes == node.name
    url = f"http://{node.address}:{call['body']['jupyter_port']}/instances/1/lab/api/status"
    answered = wait_for(lambda: status(url, "the-jupyter-token")[0] == 200, 60, "JupyterLab's /api/status")
    print(f"submit to callback {call['at'] - submitted:.2f}s, to /api/status {time.monotonic() - submitted:.2f}s")
    assert answered
    assert status(url)[0] == 403

    inside = json.loads(ssh(tmp_path / "key", node.address, call["body"]["ssh_port"], INSIDE))
    # The keys sshd trusts are root's, read-only in the container: the tenant cannot add one.
    tampered = ssh(
        tmp_path / "key", node.address, call["body"]["ssh_port"],
        "for f in /etc/devcloud/ssh/keys/authorized_keys /etc/devcloud/ssh/sshd_config; do"
        " (echo x >> $f) 2>/dev/null && echo wrote || echo refused; done",
    )

    assert inside["uid"] == 1000
    assert tampered.split() == ["refused", "refused"]
    assert (workspace / "written-inside").read_text() == "hello"
    assert (workspace / "written-inside").stat().st_uid == 1000
    assert inside["root"] == "EROFS"
    job = slurm_rest.job(job_id)
    indices = _indices(job.gres_detail[0])
    assert len(indices) == 2
    assert inside["opened"] == {
        "/dev/kfd": "ENXIO",
        **{f"/dev/dri/renderD{128 + gpu}": "ENXIO" if gpu in indices else "EPERM" for gpu in range(8)},
    }
    assert inside["environ"]["ROCR_VISIBLE_DEVICES"] == "0,1"
    assert inside["environ"]["JUPYTER_TOKEN"] == "the-jupyter-token"
    assert not any("the-callback-token" in value for value in inside["environ"].values())
    assert os.listdir(slurm_cluster.oci_state_dir)

    slurm_rest.cancel(job_id)

    wait_for(lambda: slurm_rest.job(job_id).ended, 15, "the cancelled instance ending")
    wait_for(lambda: not os.listdir(slurm_cluster.oci_state_dir), 10, "runc's state being removed")
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)



# Holds a port in a node's network namespace, as another program on the node would: listening, like the
# socket that made a JupyterLab say "The port ... is already in use".
SQUAT = r"""
import socket, sys, time
holder = socket.socket()
holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
holder.bind(("0.0.0.0", int(sys.argv[1])))
holder.listen()
print("holding", flush=True)
time.sleep(600)
"""

PICKED = re.compile(r"job \d+ on (\S+), JupyterLab on port (\d+), sshd on (\d+)")


@pytest.mark.parametrize("taken", ["jupyter", "ssh"])
def test_a_port_taken_between_the_jobs_pick_and_the_containers_bind_moves_the_instance_to_a_free_one(
    slurm_cluster, slurm_rest, callback, cpu_rootfs, tmp_path, taken
):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    request = job_request(
        name="devcloud-instance-2", gpus=1, time_limit_minutes=10,
        jupyter_token="the-jupyter-token", jupyter_base_url="/instances/2/lab/",
        rootfs=str(cpu_rootfs), workspace_dir=str(tmp_path / "workspace"), run_dir=str(run_dir),
        callback_url=callback.url, callback_token="the-callback-token",
        authorized_keys=(tmp_path / "key.pub").read_text(),
        device_dir=str(slurm_cluster.directory / "dev" / "{node}"),
    )
    # The moment the job has picked its ports, another program on its node takes one of them. The test's
    # squatter starts a process to do that, and sshd can bind first: then the job is cancelled and the
    # scenario begins again (the race is the test's own set-up, not what it proves).
    for attempt in range(1, 4):
        job_id = slurm_rest.submit(script=batch_script(), job=request)
        output = run_dir / f"{job_id}.out"
        picked = wait_for(lambda: output.exists() and PICKED.search(output.read_text()), 30, "the job picking ports")
        node, ports = slurm_cluster.node(picked[1]), {"jupyter": int(picked[2]), "ssh": int(picked[3])}
        squatter = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.netns}", "python3", "-c", SQUAT, str(ports[taken])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        if squatter.stdout.readline().strip() == "holding":
            break
        lost = squatter.stderr.read()
        squatter.wait()
        slurm_rest.cancel(job_id)
        wait_for(lambda: (job := slurm_rest.job(job_id)) is None or job.ended, 30, "the cancelled job to end")
        callback.calls.clear()
        assert attempt < 3, f"the test could not take port {ports[taken]} before the container did: {lost}"
    try:

        wait_for(lambda: callback.calls, 60, "the job's report")
        report = callback.calls[0]["body"]
        assert report["node"] == node.name
        assert ports[taken] not in (report["jupyter_port"], report["ssh_port"])
        url = f"http://{node.address}:{report['jupyter_port']}/instances/2/lab/api/status"
        assert wait_for(lambda: status(url, "the-jupyter-token")[0] == 200, 30, "JupyterLab at the reported port")
        assert ssh(tmp_path / "key", node.address, report["ssh_port"], "id -u").strip() == "1000"
        assert len(callback.calls) == 1
    finally:
        squatter.kill()
        squatter.wait()


def _indices(gres_detail):
    """"gpu:2(IDX:3-4)" or "gpu:2(IDX:1,5)" -> {3, 4} / {1, 5}."""
    indices = set()
    for part in gres_detail.split("IDX:", 1)[1].rstrip(")").split(","):
        first, _, last = part.partition("-")
        indices.update(range(int(first), int(last or first) + 1))
    return indices


# --- a node that dies -------------------------------------------------------------------------------------


def test_it_ends_the_job_of_a_dead_node_instead_of_requeuing_it_and_takes_the_node_back(
    slurm_cluster, slurm_rest
):
    node = slurm_cluster.nodes[-1]
    job_id = slurm_rest.submit(script="#!/bin/sh\nexec sleep 300\n", job=sleeper("devcloud-dies", node=node.name))
    wait_for(lambda: slurm_rest.job(job_id).state == "RUNNING", 15, "RUNNING")
    killed = time.monotonic()

    slurm_cluster.kill_node(node.name)

    ended = wait_for(lambda: (job := slurm_rest.job(job_id)).ended and job, 45, "the dead node's job ending")
    print(f"kill -9 to {ended.state}: {time.monotonic() - killed:.1f}s")
    assert ended.state == "NODE_FAIL"
    assert ended.restarts == 0
    assert {n.name: n.state for n in slurm_rest.nodes()}[node.name].startswith("DOWN")

    slurm_cluster.start_node(node.name)

    assert {n.name: n.state for n in slurm_rest.nodes()}[node.name] == "IDLE"


# --- a machine that cannot run it ---------------------------------------------------------------------------


def test_it_says_which_tool_is_missing_when_the_machine_cannot_run_a_cluster(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")

    with pytest.raises(SlurmUnavailable, match="slurmctld .Debian package slurmctld."):
        check_machine()


def test_it_fails_rather_than_skips_under_ci_when_the_cluster_is_missing(monkeypatch):
    from tests.support.slurm import _missing

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no munged"):
        _missing("no munged")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        _missing("no munged")
