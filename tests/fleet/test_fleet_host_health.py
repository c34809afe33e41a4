"""A fleet host's dockerd is killed while an instance runs there (real engines over mutual TLS): the
heartbeat marks it down within HOST_HEARTBEAT_SECONDS x HOST_DOWN_AFTER_MISSED_BEATS, meter ticks charge
nothing after its last heartbeat, its owner is told, the launch that was starting there lands on the other
host; restarted, the host comes back up, the reconciler removes the container left on it, and nothing is
charged twice."""

import time
import uuid

import pytest
from django.utils import timezone

from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.credits.models import LedgerEntry
from portal.instances import lifecycle, services, transitions
from portal.instances.models import Instance
from portal.instances.stop_reasons import StopReason
from portal.notifications.models import Notification
from provisioning import scheduler
from provisioning import services as hosts_services
from provisioning.drivers.docker import container_name
from provisioning.models import GpuAllocation, GpuHost
from tests.support.docker_instances import make_image

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]

# The test's own small period: a host is down after 2 s without an answer.
BEAT_SECONDS = 1
MISSED_BEATS = 2


@pytest.fixture
def portal(fleet, settings):
    """A portal id of this test's own; what it left on the fleet's engines is removed afterwards."""
    portal_id = f"test-hh-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    settings.DEVCLOUD_DRIVER = "docker"
    settings.READY_TIMEOUT_SECONDS = 120
    settings.HOST_HEARTBEAT_SECONDS = BEAT_SECONDS
    settings.HOST_DOWN_AFTER_MISSED_BEATS = MISSED_BEATS
    yield portal_id
    for host in fleet.hosts:
        host.restart()
        client = host.client()
        label = {"label": f"devcloud.portal={portal_id}"}
        for container in client.containers.list(all=True, ignore_removed=True, filters=label):
            container.remove(force=True)
        for network in client.networks.list(filters=label):
            network.remove()
        for volume in client.volumes.list(filters=label):
            volume.remove(force=True)
        client.close()


@pytest.fixture
def registered(db, fleet, portal, image):
    """The fleet's first two hosts, registered as an operator does (engine checked over TLS, GPUs and
    device gids discovered through the engine)."""
    made = []
    for fleet_host in fleet.hosts[:2]:
        host = hosts_services.host_register(
            name=fleet_host.name,
            docker_url=fleet_host.docker_url,
            private_address=fleet_host.private_address,
            tls_ca_cert=fleet_host.tls_ca_cert,
            tls_client_cert=fleet_host.tls_client_cert,
            tls_client_key=fleet_host.tls_client_key,
            sysfs_root=fleet_host.sysfs_root,
            dev_root=fleet_host.dev_root,
        )
        GpuHost.objects.filter(pk=host.pk).update(cpus_per_gpu=0.25, memory_mb_per_gpu=512)
        made.append(host)
    return made


def funded(user):
    credits.credits_adjust(
        user=user, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    return user


def only_active(host):
    GpuHost.objects.exclude(pk=host.pk).update(state=GpuHost.State.DRAINING)
    GpuHost.objects.filter(pk=host.pk).update(state=GpuHost.State.ACTIVE)


def paid(user) -> int:
    """GPU-seconds the user paid for usage, after anything given back."""
    entries = LedgerEntry.objects.filter(
        account__user=user, kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REVERSAL]
    )
    return -sum(entries.values_list("gpu_seconds", flat=True))


def fleet_host(fleet, host):
    return next(h for h in fleet.hosts if h.name == host.name)


def test_a_killed_hosts_instance_is_charged_up_to_its_last_heartbeat_and_its_launch_lands_on_the_other_host(
    fleet, registered, image, alice, bob, django_capture_on_commit_callbacks
):
    doomed, other = registered
    catalogue_image = make_image(image, key="cpu-hh")
    # alice's instance runs on the doomed host; bob's launch has its GPUs there and is about to start.
    only_active(doomed)
    running = services.instance_launch(user=funded(alice), size="1x", image_key=catalogue_image.key)
    assert lifecycle.instance_provision(instance_id=running.id) == "running"
    starting = services.instance_launch(user=funded(bob), size="1x", image_key=catalogue_image.key)
    assert transitions.claim(starting.id, now=timezone.now())
    assert scheduler.allocate(instance_id=starting.id)
    GpuHost.objects.update(state=GpuHost.State.ACTIVE)
    lifecycle.hosts_heartbeat()
    lifecycle.meter_tick()

    fleet_host(fleet, doomed).kill()
    killed_at = timezone.now()
    try:
        with django_capture_on_commit_callbacks(execute=True):
            # Beat as configured: a heartbeat every BEAT_SECONDS, with meter ticks in between.
            deadline = time.monotonic() + 30
            while GpuHost.objects.get(pk=doomed.pk).state != GpuHost.State.DOWN:
                assert time.monotonic() < deadline, "the killed host was never marked down"
                lifecycle.meter_tick()
                time.sleep(BEAT_SECONDS)
                lifecycle.hosts_heartbeat()
        for _ in range(3):
            lifecycle.meter_tick()
            time.sleep(0.5)

        doomed.refresh_from_db()
        went_down = AuditEntry.objects.get(action="host.down", target_id=str(doomed.pk))
        running.refresh_from_db()
        starting.refresh_from_db()
        # Down within the configured bound (plus the beat that notices it and that beat's ping).
        assert (went_down.created_at - killed_at).total_seconds() <= BEAT_SECONDS * (MISSED_BEATS + 2)
        # Charged up to the last heartbeat, not a second more, and stopped as host_down.
        assert (running.state, running.stop_reason) == (Instance.State.STOPPED, StopReason.HOST_DOWN)
        assert doomed.last_seen_at <= killed_at
        assert paid(alice) == int((doomed.last_seen_at - running.ready_at).total_seconds())
        assert not GpuAllocation.objects.filter(instance=running, released_at__isnull=True).exists()
        assert Notification.objects.filter(user=alice, event_key=f"instance:{running.id}:stopped").exists()
        # The launch that was starting on the doomed host went back to the queue and runs on the other.
        assert (starting.state, starting.host_id) == (Instance.State.RUNNING, other.pk)
        charged_before_restart = paid(alice)
    finally:
        fleet_host(fleet, doomed).restart()

    with django_capture_on_commit_callbacks(execute=True):
        report = lifecycle.hosts_heartbeat()
    lifecycle.meter_tick()

    doomed.refresh_from_db()
    assert report.heartbeat.came_back == [doomed.pk]
    assert doomed.state == GpuHost.State.ACTIVE
    # The reconcile that came with it removed the container the stopped instance left there.
    client = fleet_host(fleet, doomed).client()
    assert (
        client.containers.list(all=True, ignore_removed=True, filters={"name": container_name(running.id)})
        == []
    )
    assert paid(alice) == charged_before_restart
    running.refresh_from_db()
    assert running.state == Instance.State.STOPPED
