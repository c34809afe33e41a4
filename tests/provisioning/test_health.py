"""Host health: the heartbeat goes through each host's real engine; a host that misses enough beats is
marked down (and audited), and one that answers again goes back to the state it had."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.audit.models import AuditEntry
from provisioning import health
from provisioning.models import GpuHost
from provisioning.scheduler import allocate
from tests.support.docker_instances import LOCAL_ENGINE

from .test_hosts import closed_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def docker_driver(settings):
    settings.DEVCLOUD_DRIVER = "docker"
    settings.HOST_HEARTBEAT_SECONDS = 15
    settings.HOST_DOWN_AFTER_MISSED_BEATS = 3


def host(name, *, docker_url=LOCAL_ENGINE, state=GpuHost.State.ACTIVE, unheard_for=timedelta(0)):
    made = GpuHost.objects.create(name=name, docker_url=docker_url, state=state)
    GpuHost.objects.filter(pk=made.pk).update(last_seen_at=timezone.now() - unheard_for)
    made.refresh_from_db()
    return made


def dead_engine() -> str:
    """An engine address on this machine where nothing answers."""
    return f"unix:///tmp/devcloud-no-engine-{closed_port()}.sock"


def test_a_host_whose_engine_answers_is_confirmed_alive_now():
    alive = host("gpu-alive", unheard_for=timedelta(minutes=5))

    report = health.hosts_heartbeat()

    alive.refresh_from_db()
    assert report.answering == [alive.pk]
    assert timezone.now() - alive.last_seen_at < timedelta(seconds=5)
    assert alive.state == GpuHost.State.ACTIVE


def test_a_host_unheard_for_the_allowed_missed_beats_is_marked_down_audited_and_gets_no_placements(
    alice, host_queued_instance
):
    dead = host("gpu-dead", docker_url=dead_engine(), unheard_for=timedelta(seconds=46))

    report = health.hosts_heartbeat()

    dead.refresh_from_db()
    assert report.went_down == [dead.pk]
    assert dead.state == GpuHost.State.DOWN
    assert "no-engine" in dead.last_error
    entry = AuditEntry.objects.get(action="host.down", target_id=str(dead.pk))
    assert entry.actor is None and entry.details["previous_state"] == "active"
    assert allocate(instance_id=host_queued_instance(alice).pk) is None


def test_a_host_that_missed_fewer_beats_stays_in_service():
    late = host("gpu-late", docker_url=dead_engine(), unheard_for=timedelta(seconds=30))

    report = health.hosts_heartbeat()

    late.refresh_from_db()
    assert report.went_down == [] and late.state == GpuHost.State.ACTIVE
    assert late.last_error  # the console shows that it did not answer


def test_a_down_host_that_answers_again_goes_back_to_draining_if_it_was_draining():
    drained = host(
        "gpu-drained", docker_url=dead_engine(), state=GpuHost.State.DRAINING, unheard_for=timedelta(minutes=2)
    )
    health.hosts_heartbeat()
    assert GpuHost.objects.get(pk=drained.pk).state == GpuHost.State.DOWN

    GpuHost.objects.filter(pk=drained.pk).update(docker_url=LOCAL_ENGINE)
    report = health.hosts_heartbeat()

    drained.refresh_from_db()
    assert report.came_back == [drained.pk]
    assert drained.state == GpuHost.State.DRAINING
    assert [entry.action for entry in health.health_history(drained)] == ["host.up", "host.down"]


def test_retired_hosts_are_not_pinged():
    retired = host("gpu-retired", docker_url=dead_engine(), state=GpuHost.State.RETIRED, unheard_for=timedelta(hours=1))

    report = health.hosts_heartbeat()

    assert retired.pk not in report.checked
    assert GpuHost.objects.get(pk=retired.pk).state == GpuHost.State.RETIRED


def test_with_a_driver_that_runs_no_engine_the_worker_machine_is_the_host_and_alive(settings):
    settings.DEVCLOUD_DRIVER = "local"
    local = host("simulated", docker_url=dead_engine(), unheard_for=timedelta(hours=1))

    report = health.hosts_heartbeat()

    assert report.answering == [local.pk]
    assert GpuHost.objects.get(pk=local.pk).state == GpuHost.State.ACTIVE


def test_the_hosts_console_page_shows_its_last_heartbeat_and_its_down_and_up_history(client, olivia):
    flaky = host("gpu-flaky", docker_url=dead_engine(), unheard_for=timedelta(minutes=2))
    health.hosts_heartbeat()
    GpuHost.objects.filter(pk=flaky.pk).update(docker_url=LOCAL_ENGINE)
    health.hosts_heartbeat()
    client.force_login(olivia)

    page = client.get(f"/admin/provisioning/gpuhost/{flaky.pk}/change/").content.decode()

    assert 'data-testid="host-health"' in page
    assert "Marked down" in page and "Back in service" in page
    assert "Missed heartbeats for" in page
