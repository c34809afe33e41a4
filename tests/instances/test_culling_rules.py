"""Idle culling rules that need JupyterLab's times under exact control: a stand-in JupyterLab (a small
http.server) answers the three API calls the culler makes with the last_activity a test sets, and checks
the token as JupyterLab does. The behaviours that matter most run against a real JupyterLab in
test_culling.py."""

import json
import secrets
import shutil
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from portal.instances import culling, tasks
from portal.instances.models import Instance, LaunchPolicy
from portal.notifications.models import Kind, Notification
from portal.notifications.services import notify_instance_idle_warning
from provisioning.drivers import fake
from provisioning.inventory import read_inventory
from provisioning.models import Gpu, GpuAllocation, GpuHost
from tests.conftest import KFD_FIXTURES

MINUTE = timedelta(minutes=1)


class StandInLab:
    """Answers /instances/<id>/lab/api/{status,kernels,terminals} for the instances a test registers."""

    def __init__(self):
        self.labs: dict[str, dict] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                parts = path.strip("/").split("/")  # instances, <id>, lab, api, <what>
                lab = stand_in.labs.get(parts[1]) if len(parts) == 5 else None
                if lab is None:
                    return self.answer(404, {"message": "Not Found"})
                if self.headers.get("Authorization") != f"token {lab['token']}":
                    return self.answer(403, {"message": "Forbidden"})
                body = lab.get(parts[4])
                return self.answer(404, {"message": "Not Found"}) if body is None else self.answer(200, body)

            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, instance, *, last_activity, kernels=(), terminals=(), token=None):
        """Answer for `instance` as a JupyterLab whose last activity was at `last_activity`."""
        self.labs[str(instance.id)] = {
            "token": token or instance.jupyter_token,
            "status": {
                "started": last_activity.isoformat(),
                "last_activity": last_activity.isoformat(),
                "kernels": len(kernels),
                "connections": 0,
            },
            "kernels": list(kernels),
            "terminals": list(terminals),
        }


@pytest.fixture
def stand_in():
    lab = StandInLab()
    yield lab
    lab.server.shutdown()
    lab.server.server_close()


@pytest.fixture(autouse=True)
def policy(db, settings):
    settings.DEVCLOUD_DRIVER = "fake"
    fake.install()
    policy = LaunchPolicy.current()
    policy.idle_minutes = {"1x": 60, "8x": 30}
    policy.idle_grace_minutes = 10
    policy.save()
    return policy


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "sysfs"
    shutil.copytree(KFD_FIXTURES / "mi300x-8gpu", root)
    return root


def set_gpu_busy(sysfs_root, minor, percent):
    path = sysfs_root / "sys" / "class" / "drm" / f"renderD{minor}" / "device" / "gpu_busy_percent"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{percent}\n")


@pytest.fixture
def host(db, sysfs):
    host = GpuHost.objects.create(name="gpu-idle-rules", sysfs_root=str(sysfs))
    for gpu in read_inventory(sysfs):
        Gpu.objects.create(
            host=host, node_id=gpu.node_id, gpu_id=gpu.gpu_id, render_minor=gpu.drm_render_minor
        )
    return host


@pytest.fixture
def running(alice, host, stand_in):
    """Factory: a RUNNING instance of alice's on `host`, holding its first free GPUs, served by the stand-in."""
    image = fake.make_image("cpu")

    def make(size="1x", *, endpoint=None, ready_ago=timedelta(hours=3)):
        ready_at = timezone.now() - ready_ago
        instance = Instance.objects.create(
            user=alice,
            size=size,
            image=image,
            host=host,
            driver="fake",
            state=Instance.State.RUNNING,
            step=Instance.Step.READY,
            ready_at=ready_at,
            metered_until=ready_at,
            jupyter_token=secrets.token_hex(24),
            driver_state={"endpoint": endpoint or stand_in.endpoint},
        )
        held = GpuAllocation.objects.filter(released_at__isnull=True).values("gpu_id")
        free = Gpu.objects.filter(host=host).exclude(id__in=held).order_by("render_minor")
        for gpu in free[: 8 if size == "8x" else 1]:
            GpuAllocation.objects.create(gpu=gpu, instance=instance)
        return instance

    return make


@pytest.fixture
def cull(django_capture_on_commit_callbacks):
    def run(now=None):
        with django_capture_on_commit_callbacks(execute=True):
            return culling.cull_idle(now)

    return run


def warnings_for(instance):
    return Notification.objects.filter(user=instance.user, kind=Kind.INSTANCE_IDLE_WARNING).filter(
        event_key__startswith=f"instance:{instance.id}:"
    )


def test_a_gpu_going_idle_restarts_the_idle_clock(running, stand_in, sysfs, cull):
    instance = running()
    now = timezone.now()
    # JupyterLab has been quiet for two hours; a job started from a shell keeps the GPU busy.
    stand_in.serve(instance, last_activity=now - 120 * MINUTE)
    set_gpu_busy(sysfs, 128, 87)
    assert cull(now).busy == 1

    set_gpu_busy(sysfs, 128, 0)
    assert cull(now).warned == 0
    assert cull(now + 59 * MINUTE).warned == 0
    assert cull(now + 61 * MINUTE).warned == 1
    assert [e.message.split(":")[0] for e in instance.events.filter(message__startswith="GPUs")] == [
        "GPUs busy (87%)",
        "GPUs idle again",
    ]


def test_gpu_use_at_or_below_the_threshold_is_not_activity(running, stand_in, sysfs, cull, settings):
    settings.IDLE_GPU_BUSY_PERCENT = 5
    instance = running()
    stand_in.serve(instance, last_activity=timezone.now() - 61 * MINUTE)
    set_gpu_busy(sysfs, 128, 5)

    report = cull()

    assert (report.busy, report.warned) == (0, 1)
    assert not instance.events.filter(message__startswith="GPUs").exists()


def test_an_8x_instance_is_warned_after_its_own_shorter_idle_time(running, stand_in, cull):
    one, eight = running("1x"), running("8x")
    quiet_since = timezone.now() - 31 * MINUTE
    stand_in.serve(one, last_activity=quiet_since)
    stand_in.serve(eight, last_activity=quiet_since)

    assert cull().warned == 1
    assert not warnings_for(one).exists()
    assert warnings_for(eight).get().context["idle_minutes"] == 31


def test_a_size_with_no_idle_time_is_never_culled(running, stand_in, cull, policy):
    policy.idle_minutes = {"8x": 30}
    policy.save()
    instance = running("1x")
    stand_in.serve(instance, last_activity=timezone.now() - 600 * MINUTE)

    report = cull(timezone.now() + 600 * MINUTE)

    assert (report.checked, report.warned, report.stopped) == (0, 0, 0)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING


def test_a_terminal_in_use_is_activity(running, stand_in, cull):
    instance = running()
    now = timezone.now()
    stand_in.serve(
        instance,
        last_activity=now - 120 * MINUTE,
        terminals=[{"name": "1", "last_activity": (now - 5 * MINUTE).isoformat()}],
    )

    assert cull(now).warned == 0
    assert cull(now + 56 * MINUTE).warned == 1


def test_traffic_to_an_exposed_port_is_activity(running, stand_in, cull):
    from portal.ports.models import ExposedPort

    instance = running()
    now = timezone.now()
    # Nobody touched JupyterLab for two hours, but people used the app on port 8000 five minutes ago.
    stand_in.serve(instance, last_activity=now - 120 * MINUTE)
    ExposedPort.objects.create(
        instance=instance, port=8000, host_label=f"{instance.short_id}-8000", last_traffic_at=now - 5 * MINUTE
    )

    assert cull(now).warned == 0
    assert cull(now + 56 * MINUTE).warned == 1


def test_it_skips_an_instance_whose_jupyterlab_does_not_answer_even_after_a_warning(
    running, stand_in, cull, mailoutbox
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    gone = running(endpoint=closed)
    refused = running()
    stand_in.serve(refused, last_activity=timezone.now() - 600 * MINUTE, token="another-token")
    for instance in (gone, refused):
        # Warned in an earlier round, long enough ago for the grace to have run out.
        notify_instance_idle_warning(
            instance=instance, idle_since=instance.ready_at, idle_minutes=60, grace_minutes=10
        )

    report = cull(timezone.now() + 600 * MINUTE)

    assert (report.checked, report.unreachable, report.stopped) == (2, 2, 0)
    assert set(Instance.objects.values_list("state", flat=True)) == {Instance.State.RUNNING}


def test_the_beat_task_runs_a_round_and_stops_what_is_due(
    running, stand_in, django_capture_on_commit_callbacks
):
    instance = running()
    idle_since = timezone.now() - 100 * MINUTE
    stand_in.serve(instance, last_activity=idle_since)
    warning = notify_instance_idle_warning(
        instance=instance, idle_since=idle_since, idle_minutes=89, grace_minutes=10
    )
    Notification.objects.filter(pk=warning.pk).update(created_at=timezone.now() - 11 * MINUTE)

    with django_capture_on_commit_callbacks(execute=True):
        report = tasks.cull_idle.apply().get()

    assert report["stopped"] == 1
    instance.refresh_from_db()
    assert (instance.state, instance.stop_reason) == (Instance.State.STOPPED, "idle")
