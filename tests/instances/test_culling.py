"""Idle culling against a real JupyterLab: instances are provisioned with the local driver (JupyterLab as
a subprocess, exactly as `make run` serves them) and the culler reads their real /api/status, kernels and
terminals. GPU use comes from gpu_busy_percent files in a copy of the 8x MI300X sysfs fixture.

Time moves forward by passing the culler a later `now`: JupyterLab's clock keeps running for real, so
"61 minutes later" is now + 61 minutes for everything the culler compares.
"""

import json
import os
import secrets
import shutil
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import websocket
from django.utils import timezone

from portal.credits import services as credits
from portal.instances import culling, lifecycle
from portal.instances.models import Image, Instance, LaunchPolicy
from portal.notifications.models import Kind, Notification
from provisioning.drivers import driver_for
from provisioning.inventory import read_inventory
from provisioning.models import Gpu, GpuHost
from tests.conftest import KFD_FIXTURES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MINUTE = timedelta(minutes=1)
IDLE_WARNING = "is idle and will be stopped in 10 minutes"
STOPPED_IDLE = "was stopped because it was idle"


def gpu_busy_file(sysfs_root, minor):
    return sysfs_root / "sys" / "class" / "drm" / f"renderD{minor}" / "device" / "gpu_busy_percent"


def set_gpu_busy(sysfs_root, minor, percent):
    """What amdgpu reports for the GPU behind renderD<minor>: its utilisation, in percent."""
    path = gpu_busy_file(sysfs_root, minor)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{percent}\n")


@pytest.fixture
def sysfs(tmp_path):
    """A copy of the 8x MI300X sysfs fixture, with every GPU reading 0% busy."""
    root = tmp_path / "sysfs"
    shutil.copytree(KFD_FIXTURES / "mi300x-8gpu", root)
    for gpu in read_inventory(root):
        set_gpu_busy(root, gpu.drm_render_minor, 0)
    return root


@pytest.fixture
def host(db, sysfs, settings, tmp_path):
    settings.DEVCLOUD_LOCAL_ROOT = str(tmp_path / "local")
    settings.READY_TIMEOUT_SECONDS = 90
    host = GpuHost.objects.create(name="gpu-idle", sysfs_root=str(sysfs))
    for gpu in read_inventory(sysfs):
        Gpu.objects.create(
            host=host, node_id=gpu.node_id, gpu_id=gpu.gpu_id, render_minor=gpu.drm_render_minor
        )
    yield host
    # Whatever a test left running.
    for state_file in (tmp_path / "local" / "local-instances").glob("*/state.json"):
        try:
            os.killpg(json.loads(state_file.read_text())["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(autouse=True)
def policy(db):
    policy = LaunchPolicy.current()
    policy.idle_minutes = {"1x": 60, "8x": 30}
    policy.idle_grace_minutes = 10
    policy.save()
    return policy


@pytest.fixture
def launch(alice, host):
    """Factory: provision a `size` instance of alice's on the local driver; returns it RUNNING."""
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test credit", actor=None, idempotency_key=str(uuid.uuid4())
    )
    image = Image.objects.create(
        key="cpu-idle",
        name="CPU JupyterLab",
        sizes=["1x", "8x"],
        reference="devcloud/cpu:test",
        needs_gpu=False,
    )

    def make(size="1x"):
        instance = Instance.objects.create(
            user=alice, size=size, image=image, driver="local", jupyter_token=secrets.token_hex(24)
        )
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
        return Instance.objects.select_related("user", "image", "host").get(pk=instance.pk)

    return make


@pytest.fixture
def cull(django_capture_on_commit_callbacks):
    """Run one culling round at `now`, with what it commits (emails, the teardown task) carried out."""

    def run(now):
        with django_capture_on_commit_callbacks(execute=True):
            return culling.cull_idle(now)

    return run


def lab(instance, method, path, **kwargs) -> httpx.Response:
    """A request to the instance's JupyterLab REST API with its token, as the browser's gateway sends it."""
    url = culling.lab_api_url(instance, instance.driver_state["endpoint"], path)
    headers = {"Authorization": f"token {instance.jupyter_token}"}
    return httpx.request(method, url, headers=headers, timeout=30, **kwargs)


def wait_for_kernel(instance, kernel_id, state, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab(instance, "GET", f"kernels/{kernel_id}").json()["execution_state"] == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"kernel {kernel_id} never became {state}")


def start_kernel(instance) -> str:
    """Start a kernel and run a first cell in it, as a notebook does; returns its id once it is idle."""
    created = lab(instance, "POST", "kernels", json={"name": "python3"})
    assert created.status_code == 201, created.text
    kernel_id = created.json()["id"]
    run_code(instance, kernel_id, "x = 1").close()
    wait_for_kernel(instance, kernel_id, "idle")
    return kernel_id


def run_code(instance, kernel_id, code) -> websocket.WebSocket:
    """Send `code` to the kernel over its websocket, as a notebook does; returns the open socket."""
    endpoint = instance.driver_state["endpoint"].replace("http://", "ws://")
    url = culling.lab_api_url(instance, endpoint, f"kernels/{kernel_id}/channels")
    ws = websocket.create_connection(
        url, header=[f"Authorization: token {instance.jupyter_token}"], timeout=30
    )
    session = uuid.uuid4().hex
    ws.send(
        json.dumps(
            {
                "header": {
                    "msg_id": uuid.uuid4().hex,
                    "username": "alice",
                    "session": session,
                    "msg_type": "execute_request",
                    "version": "5.3",
                    "date": datetime.now(UTC).isoformat(),
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False, "store_history": False, "allow_stdin": False},
                "channel": "shell",
            }
        )
    )
    return ws


def mails(mailoutbox, text):
    return [message for message in mailoutbox if text in message.subject]


def test_it_warns_an_idle_instance_once_then_stops_it_after_the_grace_keeping_the_workspace(
    launch, cull, mailoutbox
):
    instance = launch()
    start_kernel(instance)
    saved = lab(
        instance, "PUT", "contents/notes.txt", json={"type": "file", "format": "text", "content": "keep"}
    )
    assert saved.status_code in (200, 201), saved.text
    workspace = driver_for(instance.host, "local").workspace(instance.user_id)
    t0 = timezone.now()

    assert cull(t0 + 59 * MINUTE).warned == 0

    assert cull(t0 + 61 * MINUTE).warned == 1
    # Looking is not using: the culler's own requests leave the idle stretch (and its warning) unchanged.
    assert cull(t0 + 61 * MINUTE).warned == 0
    assert cull(t0 + 69 * MINUTE).stopped == 0
    assert len(mails(mailoutbox, IDLE_WARNING)) == 1
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING

    assert cull(t0 + 71 * MINUTE).stopped == 1

    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED
    assert instance.stop_reason == "idle"
    with pytest.raises(httpx.TransportError):
        lab(instance, "GET", "status")
    assert (workspace / "notes.txt").read_text() == "keep"
    assert cull(t0 + 90 * MINUTE).stopped == 0
    assert len(mails(mailoutbox, STOPPED_IDLE)) == 1
    assert len(mails(mailoutbox, IDLE_WARNING)) == 1
    assert instance.events.filter(message__startswith="Stopped after 71 minutes idle").exists()


def test_it_never_warns_nor_stops_while_a_kernel_is_busy(launch, cull, mailoutbox):
    instance = launch()
    kernel_id = start_kernel(instance)
    ws = run_code(instance, kernel_id, "import time; time.sleep(120)")
    try:
        wait_for_kernel(instance, kernel_id, "busy")
        t0 = timezone.now()

        for later in (61, 180, 600):
            report = cull(t0 + later * MINUTE)
            assert (report.busy, report.warned, report.stopped) == (1, 0, 0)
        assert not Notification.objects.filter(user=instance.user).exists()
        assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING

        # The same instance once the cell is interrupted: now it is idle, and warned.
        assert lab(instance, "POST", f"kernels/{kernel_id}/interrupt").status_code == 204
        wait_for_kernel(instance, kernel_id, "idle")
        assert cull(t0 + 600 * MINUTE).warned == 1
    finally:
        ws.close()


def test_a_busy_gpu_keeps_an_instance_whose_jupyterlab_is_idle(launch, cull, sysfs, mailoutbox):
    instance = launch("8x")
    start_kernel(instance)
    # A training job started from a shell: one of the eight GPUs is busy, JupyterLab sees nothing.
    set_gpu_busy(sysfs, 176, 87)
    t0 = timezone.now()

    for later in (31, 120, 600):
        report = cull(t0 + later * MINUTE)
        assert (report.busy, report.warned, report.stopped) == (1, 0, 0)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
    assert mailoutbox == []
    busy_events = instance.events.filter(message__startswith="GPUs busy")
    assert [event.message for event in busy_events] == [
        "GPUs busy (87%): idle culling counts this instance as in use."
    ]

    # The job ends: the idle clock starts again from the moment the GPUs were seen idle.
    set_gpu_busy(sysfs, 176, 1)
    assert cull(t0 + 600 * MINUTE).warned == 0
    assert instance.events.filter(message__startswith="GPUs idle again").count() == 1


def test_activity_after_the_warning_cancels_the_stop(launch, cull, mailoutbox):
    instance = launch()
    kernel_id = start_kernel(instance)
    t0 = timezone.now()
    assert cull(t0 + 61 * MINUTE).warned == 1

    # The owner reads the email, opens JupyterLab and runs a cell.
    ws = run_code(instance, kernel_id, "print(6 * 7)")
    ws.close()
    wait_for_kernel(instance, kernel_id, "idle")

    # Past the first warning's grace: not stopped, because that idle stretch ended. Seen from here the new
    # stretch is long past the idle time too, so it gets its own warning before any stop.
    report = cull(t0 + 72 * MINUTE)
    assert (report.stopped, report.warned) == (0, 1)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
    assert len(mails(mailoutbox, IDLE_WARNING)) == 2
    assert Notification.objects.filter(user=instance.user, kind=Kind.INSTANCE_IDLE_WARNING).count() == 2
    assert mails(mailoutbox, STOPPED_IDLE) == []


def test_without_gpu_readings_jupyterlab_alone_decides(launch, cull, sysfs, mailoutbox):
    shutil.rmtree(sysfs / "sys" / "class" / "drm")
    instance = launch()
    start_kernel(instance)
    t0 = timezone.now()

    assert cull(t0 + 59 * MINUTE).warned == 0
    assert cull(t0 + 61 * MINUTE).warned == 1
    assert cull(t0 + 71 * MINUTE).stopped == 1
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.STOPPED
    assert not instance.events.filter(message__startswith="GPUs").exists()
