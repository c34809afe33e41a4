"""Provision, stop and reconcile on the real Docker engine with the CPU JupyterLab image: the lifecycle
against the real driver, readiness answered by a real JupyterLab, containers really removed."""

import threading
import time
import uuid
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from portal.credits import services as credits
from portal.credits.models import LedgerEntry
from portal.instances import lifecycle, services, tasks
from portal.instances.models import Instance
from provisioning import start_slots
from provisioning.drivers import driver_for
from provisioning.drivers.docker import container_name
from provisioning.models import GpuAllocation
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401  (registers the docker_portal fixture)
    make_host,
    make_image,
)
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def host(db, kfd_dev_root, settings, docker_portal):
    settings.DEVCLOUD_DRIVER = "docker"
    settings.READY_TIMEOUT_SECONDS = 90
    return make_host("gpu-sim-orch", kfd_dev_root.path, kfd_dev_root.render_minors)


@pytest.fixture
def launch(alice, host, cpu_image):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    image = make_image(cpu_image, key="cpu")

    def make():
        return services.instance_launch(user=alice, size="1x", image_key=image.key)

    return make


def containers_of(instance) -> list:
    name = container_name(instance.id)
    return [
        c
        for c in docker_client().containers.list(all=True, ignore_removed=True, filters={"name": name})
        if c.name == name
    ]


def test_it_launches_to_ready_and_stops_on_the_real_engine(launch):
    instance = launch()

    assert lifecycle.instance_provision(instance_id=instance.id) == "running"

    instance.refresh_from_db()
    assert instance.step == Instance.Step.READY and instance.metered_until == instance.ready_at
    assert instance.driver_state["endpoint"].startswith("http://127.0.0.1:")
    assert [c.status for c in containers_of(instance)] == ["running"]
    # Where the gateway reaches the instance's exposed ports: its address on its own network, which
    # this machine routes to (JupyterLab answers there on its own port too).
    address = instance.driver_state["address"]
    status = httpx.get(
        f"http://{address}:8888/instances/{instance.id}/lab/api/status",
        headers={"Authorization": f"token {instance.jupyter_token}"},
        timeout=10,
    )
    assert status.status_code == 200

    services.instance_stop(user=instance.user, instance_id=instance.id)
    assert lifecycle.instance_teardown(instance_id=instance.id) == "stopped"

    assert containers_of(instance) == []
    assert not GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).exists()
    assert LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).count() <= 1


def test_the_reconciler_removes_orphans_and_fails_vanished_instances(launch):
    orphaned, vanished = launch(), launch()
    for instance in (orphaned, vanished):
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    # A worker died after marking one failed; the other's container was removed behind our back.
    Instance.objects.filter(pk=orphaned.pk).update(state=Instance.State.FAILED, stopped_at=timezone.now())
    containers_of(vanished)[0].remove(force=True)

    report = lifecycle.reconcile(timezone.now() + timedelta(seconds=1))

    assert (report.orphans_removed, report.vanished_failed, report.allocations_freed) == (1, 1, 1)
    assert containers_of(orphaned) == []
    vanished.refresh_from_db()
    assert vanished.state == Instance.State.FAILED
    assert vanished.failure_reason.startswith("The container disappeared")
    assert not GpuAllocation.objects.filter(released_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_a_launch_stopped_while_it_waits_its_turn_leaves_nothing_running_on_the_engine(
    launch, host, settings, monkeypatch
):
    # The launch's task runs in the test's thread below, as a provisioning worker would, not eagerly.
    monkeypatch.setattr(tasks.provision_instance, "apply_async", lambda *args, **kwargs: None)
    # One start slot on this engine, held by an earlier launch.
    settings.LAUNCH_STARTS_PER_CPU = 0.01
    instance = launch()
    line = driver_for(host, "docker").start_line()
    assert line.limit == 1
    assert start_slots.take(line, "an-earlier-launch") == 0
    try:
        outcome = []
        worker = threading.Thread(
            target=lambda: outcome.append(lifecycle.instance_provision(instance_id=instance.id))
        )
        worker.start()
        # Its container is made before its turn comes, and not started.
        deadline = time.monotonic() + 60
        while not containers_of(instance) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [c.status for c in containers_of(instance)] == ["created"]

        services.instance_stop(user=instance.user, instance_id=instance.id)
        worker.join(60)

        assert outcome == ["skipped"]
        assert containers_of(instance) == []
        assert Instance.objects.get(pk=instance.pk).state == Instance.State.STOPPED
    finally:
        start_slots.give_back(line, "an-earlier-launch")
