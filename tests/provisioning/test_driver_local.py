"""The local driver: JupyterLab as a subprocess of the worker, for `make run` without Docker."""

import json
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from provisioning.drivers import driver_for
from provisioning.models import GpuHost
from tests.support.docker_instances import make_image, make_instance, status_url, wait_for_jupyter
from tests.support.drivers import instance_ref, start_on

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def driver(db, settings, tmp_path):
    settings.DEVCLOUD_LOCAL_ROOT = str(tmp_path)
    driver = driver_for(GpuHost.objects.create(name="localhost"), "local")
    yield driver
    # Whatever a failed test left running.
    for state_file in (tmp_path / "local-instances").glob("*/state.json"):
        pid = json.loads(state_file.read_text())["pid"]
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def instance(alice, driver):
    return make_instance(alice, make_image("devcloud/cpu:local"), driver.host)


def pid_alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def children_of(pid):
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except FileNotFoundError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def port_open(port):
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_it_serves_jupyterlab_to_the_token_only(driver, instance, alice, settings):
    result = start_on(driver, instance, gpus=[])

    status = wait_for_jupyter(result.endpoint, instance, timeout=60)
    anonymous = httpx.get(status_url(result.endpoint, instance))

    assert driver.isolates_gpus is False
    assert result.endpoint == f"http://127.0.0.1:{result.state['port']}"
    assert "last_activity" in status
    assert anonymous.status_code in (401, 403)
    assert result.state["workspace"] == str(Path(settings.DEVCLOUD_LOCAL_ROOT) / "workspaces" / str(alice.id))


def test_it_reuses_the_running_process_when_started_twice(driver, instance):
    first = start_on(driver, instance, gpus=[])
    second = start_on(driver, instance, gpus=[])

    assert second.state["pid"] == first.state["pid"]
    assert second.endpoint == first.endpoint


def test_it_stops_jupyterlab_and_its_kernels(driver, instance):
    result = start_on(driver, instance, gpus=[])
    wait_for_jupyter(result.endpoint, instance, timeout=60)
    kernel = httpx.post(
        f"{result.endpoint}/instances/{instance.id}/lab/api/kernels",
        headers={"Authorization": f"token {instance.jupyter_token}"},
        json={"name": "python3"},
        timeout=30,
    )
    assert kernel.status_code == 201, kernel.text
    pid = result.state["pid"]
    deadline = time.monotonic() + 30
    while not children_of(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    kernels = children_of(pid)
    assert kernels, "the kernel process did not appear"

    driver.stop(instance_ref(instance))
    driver.stop(instance_ref(instance))

    assert not pid_alive(pid)
    assert not any(pid_alive(kernel_pid) for kernel_pid in kernels)
    assert not port_open(result.state["port"])
    assert driver.poll(instance_ref(instance)).status == "missing"


def test_it_polls_missing_running_and_exited(driver, instance):
    before = driver.poll(instance_ref(instance))
    result = start_on(driver, instance, gpus=[])
    running = driver.poll(instance_ref(instance))
    os.killpg(result.state["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(result.state["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)

    exited = driver.poll(instance_ref(instance))
    managed = driver.managed_instance_ids()

    assert (before.status, running.status, exited.status) == ("missing", "running", "exited")
    assert managed == {str(instance.id)}
