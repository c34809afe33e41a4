"""The reconciler: orphan containers removed, vanished instances failed with their GPUs freed, stuck
transitions repaired, and nothing touched on a host that does not answer."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.credits import services as credits
from portal.credits.models import CreditAccount, LedgerEntry
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning.drivers import fake
from provisioning.models import GpuAllocation

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


def live_minors(instance) -> list[int]:
    return sorted(
        GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).values_list(
            "gpu__render_minor", flat=True
        )
    )


@pytest.fixture(autouse=True)
def stuck_after_ten_minutes(settings):
    settings.STUCK_TRANSITION_SECONDS = 600


@pytest.fixture
def host(db):
    return fake.make_host("gpu-01", gpus=8)


@pytest.fixture
def running(alice, host, cloud):
    """Factory: a RUNNING instance of alice's, provisioned for real through the fake driver."""
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key="t-credit"
    )
    fake.make_image("cpu")

    def make():
        instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
        instance.refresh_from_db()
        return instance

    return make


def test_it_removes_containers_no_live_instance_owns(running, host, cloud):
    instance = running()
    stranger = cloud.add_container(host=host, instance_id=uuid.uuid4())
    ended = running()
    Instance.objects.filter(pk=ended.pk).update(state=Instance.State.STOPPED)

    report = lifecycle.reconcile()

    assert report.orphans_removed == 2
    assert set(cloud.containers) == {str(instance.id)}
    assert stranger.instance_id not in cloud.containers
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING


def test_it_fails_a_running_instance_whose_container_vanished_and_frees_its_gpus(running, cloud):
    instance = running()
    Instance.objects.filter(pk=instance.pk).update(metered_until=timezone.now() - timedelta(seconds=50))
    balance = CreditAccount.objects.get(user=instance.user).balance_gpu_seconds
    cloud.remove_container(instance.id)

    report = lifecycle.reconcile()

    assert report.vanished_failed == 1
    instance.refresh_from_db()
    assert instance.state == Instance.State.FAILED
    assert instance.failure_reason.startswith("The container disappeared")
    assert "launch a new instance" in instance.failure_reason
    assert instance.stopped_at is not None
    assert live_minors(instance) == []
    # Metering is closed: the lost time is not charged, now or by later ticks.
    assert CreditAccount.objects.get(user=instance.user).balance_gpu_seconds == balance
    lifecycle.meter_tick()
    assert not LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).exists()


def test_it_leaves_healthy_instances_alone(running, cloud):
    instance = running()
    report = lifecycle.reconcile()
    assert report == lifecycle.ReconcileReport(hosts_checked=1)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
    assert live_minors(instance) == [128]


def test_it_changes_nothing_on_a_host_that_does_not_answer(running, cloud):
    instance = running()
    cloud.behave(engine_down=True)

    report = lifecycle.reconcile()

    assert report.hosts_unreachable == 1 and report.vanished_failed == 0
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING


def test_it_frees_gpus_an_ended_instance_still_holds(running):
    instance = running()
    # A worker died between marking it failed and releasing its GPUs.
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.FAILED)

    assert lifecycle.reconcile().allocations_freed == 1
    assert live_minors(instance) == []


def test_it_resumes_a_stuck_provisioning_once_then_fails_it(alice, host, cloud, running):
    instance = running()
    long_ago = timezone.now() - timedelta(seconds=700)
    # A worker was killed while it waited for JupyterLab.
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.PROVISIONING,
        step=Instance.Step.WAITING,
        state_changed_at=long_ago,
        provisioning_at=long_ago,
    )

    report = lifecycle.reconcile()

    assert report.provisioning_resumed == 1
    # The resumed task ran inline: the same container and GPUs, now running.
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert len(cloud.containers) == 1 and live_minors(instance) == [128]

    much_longer_ago = timezone.now() - timedelta(seconds=1300)
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.PROVISIONING, state_changed_at=long_ago, provisioning_at=much_longer_ago
    )
    report = lifecycle.reconcile()

    assert report.provisioning_failed == 1
    instance.refresh_from_db()
    assert instance.state == Instance.State.FAILED
    assert instance.failure_reason.startswith("Starting took longer than 20 minutes")
    assert cloud.containers == {}
    assert live_minors(instance) == []


def test_it_does_not_touch_a_provisioning_that_is_not_stuck_yet(running):
    instance = running()
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.PROVISIONING)
    report = lifecycle.reconcile()
    assert report.provisioning_resumed == report.provisioning_failed == 0
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.PROVISIONING


def test_it_finishes_a_stuck_teardown_even_when_the_host_is_gone(running, cloud):
    instance = running()
    services.instance_stop(user=instance.user, instance_id=instance.id)
    Instance.objects.filter(pk=instance.pk).update(state_changed_at=timezone.now() - timedelta(seconds=700))
    cloud.behave(engine_down=True)

    report = lifecycle.reconcile()

    assert report.teardowns_enqueued == 1
    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED
    assert live_minors(instance) == []

    # When the host answers again, its leftover container is an orphan and goes.
    cloud.behave(engine_down=False)
    assert lifecycle.reconcile().orphans_removed == 1
    assert cloud.containers == {}


def test_reconcile_twice_changes_nothing_more(running, host, cloud):
    running()
    cloud.add_container(host=host, instance_id=uuid.uuid4())
    lifecycle.reconcile()
    assert lifecycle.reconcile() == lifecycle.ReconcileReport(hosts_checked=1)
