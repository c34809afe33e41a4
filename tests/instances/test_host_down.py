"""A host whose engine stops answering: the heartbeat marks it down, its running instances are charged only
up to the last moment it answered and stopped as host_down (their owners told), its launches go back to
the queue for another host, and meter ticks never charge past its last heartbeat while it is in doubt."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.credits import metering
from portal.credits import services as credits
from portal.credits.models import LedgerEntry
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from portal.instances.stop_reasons import StopReason
from portal.notifications.models import Notification
from provisioning import scheduler
from provisioning.drivers import fake
from provisioning.models import GpuAllocation, GpuHost

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture(autouse=True)
def heartbeat_every_15s_down_after_3_missed(settings):
    settings.HOST_HEARTBEAT_SECONDS = 15
    settings.HOST_DOWN_AFTER_MISSED_BEATS = 3


@pytest.fixture
def hosts(db):
    fake.make_image("cpu")
    return fake.make_host("gpu-a"), fake.make_host("gpu-b")


def funded(user):
    credits.credits_adjust(
        user=user, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    return user


def launch_on(user, host, *, until_state="running"):
    """Launches for `user` with every other host drained, so it lands on `host`."""
    GpuHost.objects.exclude(pk=host.pk).update(state=GpuHost.State.DRAINING)
    instance = services.instance_launch(user=funded(user), size="1x", image_key="cpu")
    if until_state == "running":
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    else:
        transitions_claim_and_allocate(instance)
    GpuHost.objects.update(state=GpuHost.State.ACTIVE)
    instance.refresh_from_db()
    assert instance.host_id == host.pk
    return instance


def transitions_claim_and_allocate(instance):
    from portal.instances import transitions

    assert transitions.claim(instance.id, now=timezone.now())
    assert scheduler.allocate(instance_id=instance.id)


def ran_for(instance, *, ready_ago: timedelta, metered_ago: timedelta):
    now = timezone.now()
    Instance.objects.filter(pk=instance.pk).update(ready_at=now - ready_ago, metered_until=now - ready_ago)
    instance.refresh_from_db()
    # A tick charged it up to `metered_ago` ago, as beat would have.
    lifecycle.meter_tick(now - metered_ago)
    instance.refresh_from_db()
    return instance


def silent(host, *, unheard_for: timedelta, settings):
    """The host's engine stops answering; it last answered `unheard_for` ago."""
    settings.DEVCLOUD_DRIVER = "docker"
    GpuHost.objects.filter(pk=host.pk).update(
        docker_url=f"unix:///tmp/devcloud-no-engine-{uuid.uuid4().hex[:8]}.sock",
        last_seen_at=timezone.now() - unheard_for,
    )
    host.refresh_from_db()
    return host.last_seen_at


def charged(instance) -> int:
    """GPU-seconds the owner paid for the instance: its usage entries less what was given back."""
    entries = LedgerEntry.objects.filter(
        account__user=instance.user, kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REVERSAL]
    )
    return -sum(entries.values_list("gpu_seconds", flat=True))


def test_it_stops_a_down_hosts_running_instance_charged_up_to_its_last_heartbeat_and_tells_the_owner(
    alice, hosts, settings
):
    down, _ = hosts
    instance = ran_for(
        launch_on(alice, down), ready_ago=timedelta(minutes=10), metered_ago=timedelta(minutes=5)
    )
    last_seen = silent(down, unheard_for=timedelta(seconds=50), settings=settings)

    report = lifecycle.hosts_heartbeat()

    instance.refresh_from_db()
    down.refresh_from_db()
    assert report.heartbeat.went_down == [down.pk]
    assert report.stopped == [instance.id]
    assert down.state == GpuHost.State.DOWN
    assert (instance.state, instance.stop_reason) == (Instance.State.STOPPING, StopReason.HOST_DOWN)
    assert instance.metered_until <= last_seen < instance.metered_until + timedelta(seconds=1)
    assert charged(instance) == int((last_seen - instance.ready_at).total_seconds())
    notice = Notification.objects.get(user=alice, event_key=f"instance:{instance.id}:stopped")
    assert notice.context["reason"] == StopReason.HOST_DOWN


def test_it_gives_back_what_a_tick_charged_after_the_hosts_last_heartbeat(alice, hosts, settings):
    down, _ = hosts
    instance = ran_for(launch_on(alice, down), ready_ago=timedelta(minutes=10), metered_ago=timedelta(0))
    # The tick above ran after the host's last answer, before any beat noticed.
    last_seen = silent(down, unheard_for=timedelta(seconds=50), settings=settings)
    assert charged(instance) >= 599

    lifecycle.hosts_heartbeat()
    lifecycle.hosts_heartbeat()

    instance.refresh_from_db()
    assert charged(instance) == int((last_seen - instance.ready_at).total_seconds())
    assert instance.charged_gpu_seconds == charged(instance)
    assert LedgerEntry.objects.filter(kind=LedgerEntry.Kind.REVERSAL, account__user=alice).count() == 1


def test_the_stopped_instances_teardown_frees_its_gpus_without_the_host_and_charges_nothing_more(
    alice, hosts, settings
):
    down, _ = hosts
    instance = ran_for(
        launch_on(alice, down), ready_ago=timedelta(minutes=10), metered_ago=timedelta(minutes=5)
    )
    silent(down, unheard_for=timedelta(seconds=50), settings=settings)
    lifecycle.hosts_heartbeat()
    before = charged(instance)

    assert lifecycle.instance_teardown(instance_id=instance.id, force=True) == "stopped"
    lifecycle.meter_tick(timezone.now() + timedelta(minutes=5))

    assert charged(instance) == before
    assert not GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).exists()


@pytest.mark.parametrize("path", ["postgresql", "python"])
def test_a_tick_charges_no_further_than_the_last_heartbeat_of_a_host_that_stopped_answering(
    alice, hosts, settings, monkeypatch, path
):
    if path == "python":
        monkeypatch.setattr(metering, "_charge_in_database", metering._charge_in_python)
    quiet, _ = hosts
    instance = ran_for(
        launch_on(alice, quiet), ready_ago=timedelta(minutes=10), metered_ago=timedelta(minutes=5)
    )
    last_seen = silent(quiet, unheard_for=timedelta(seconds=20), settings=settings)
    # One missed beat: in doubt, not yet down.
    lifecycle.hosts_heartbeat()
    quiet.refresh_from_db()
    assert quiet.state == GpuHost.State.ACTIVE and quiet.last_error

    lifecycle.meter_tick()
    lifecycle.meter_tick(timezone.now() + timedelta(minutes=1))

    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert charged(instance) == int((last_seen - instance.ready_at).total_seconds())


def test_a_tick_charges_the_time_in_doubt_once_the_host_answers_again(alice, hosts, settings):
    quiet, _ = hosts
    instance = ran_for(
        launch_on(alice, quiet), ready_ago=timedelta(minutes=10), metered_ago=timedelta(minutes=5)
    )
    silent(quiet, unheard_for=timedelta(seconds=20), settings=settings)
    lifecycle.hosts_heartbeat()
    settings.DEVCLOUD_DRIVER = "fake"  # the engine answers again

    lifecycle.hosts_heartbeat()
    now = timezone.now()
    lifecycle.meter_tick(now)

    instance.refresh_from_db()
    assert charged(instance) == int((now - instance.ready_at).total_seconds())


@pytest.mark.parametrize("state", ["queued", "provisioning"])
def test_a_launch_holding_gpus_on_a_down_host_goes_back_to_the_queue_and_lands_on_the_other_host(
    alice, hosts, settings, state
):
    down, other = hosts
    instance = launch_on(alice, down, until_state="provisioning")
    if state == "queued":
        from portal.instances import transitions

        assert transitions.requeue(instance)
        assert scheduler.allocate(instance_id=instance.id)
    silent(down, unheard_for=timedelta(seconds=50), settings=settings)

    report = lifecycle.hosts_heartbeat()

    instance.refresh_from_db()
    assert report.requeued == [instance.id]
    assert (instance.state, instance.host_id) == (Instance.State.QUEUED, None)
    assert not GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).exists()
    assert charged(instance) == 0
    settings.DEVCLOUD_DRIVER = "fake"
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    instance.refresh_from_db()
    assert instance.host_id == other.pk


def test_the_heartbeat_runs_on_beat_on_the_default_queue(settings):
    from portal.workers import route_task

    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "provisioning.heartbeat")

    assert entry["schedule"] == float(settings.HOST_HEARTBEAT_SECONDS)
    assert route_task("provisioning.heartbeat", (), {}, {}) is None
