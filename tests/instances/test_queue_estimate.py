"""A queued launch's estimated start, held against what then happens: running instances stop at their
maximum length on a controlled clock, beat's start_queued hands out their GPUs, and each waiting launch
starts within one beat (METER_TICK_SECONDS, 60 s) of the estimate it was shown. That is the error the
docs allow in a scenario where nothing unforeseen happens (docs/architecture.md, "The queue")."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.credits import services as credits
from portal.instances import estimates, lifecycle, limits, selectors, services, transitions
from portal.instances.models import Instance, LaunchPolicy
from provisioning.drivers import fake
from provisioning.models import GpuAllocation
from tests.conftest import make_user

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600
BEAT = timedelta(seconds=60)


@pytest.fixture(autouse=True)
def ready_within_20_seconds(settings):
    settings.READY_TIMEOUT_SECONDS = 20


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu", sizes=["1x", "8x"])


@pytest.fixture
def dave(db):
    return make_user("dave@example.com", first_name="Dave")


@pytest.fixture
def policy(db):
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x", "8x"], max_session_hours={"1x": 4, "8x": 4})
    return LaunchPolicy.current()


def launch(user, size="1x"):
    credits.credits_adjust(
        user=user, gpu_seconds=500 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    return services.instance_launch(user=user, size=size, image_key="cpu")


def running(user, *, ready_hours_ago: float):
    """A running 1x of `user` that turned ready `ready_hours_ago` hours ago."""
    instance = launch(user)
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    ready_at = timezone.now() - timedelta(hours=ready_hours_ago)
    Instance.objects.filter(pk=instance.pk).update(ready_at=ready_at, metered_until=ready_at)
    return instance


def waiting(user):
    """A 1x launch of `user` that found no GPUs free and waits in the queue."""
    instance = launch(user)
    assert lifecycle.instance_provision(instance_id=instance.id) == "queued"
    instance.refresh_from_db()
    return instance


def test_each_launch_starts_within_a_beat_of_its_estimate(alice, bob, dave, cpu, policy, monkeypatch):
    fake.make_host("gpu-03", gpus=2)
    running(alice, ready_hours_ago=3)  # its 4-hour limit ends in 1 h
    running(bob, ready_hours_ago=2)  # ends in 2 h
    first, second = waiting(dave), waiting(dave)
    now = timezone.now()

    shown = {i.pk: estimates.estimate(i, now=now) for i in (first, second)}
    status = selectors.queue_status(second, now=now)

    assert shown[first.pk].starts_at == pytest.approx(now + timedelta(hours=1), abs=timedelta(seconds=1))
    assert shown[second.pk].starts_at == pytest.approx(now + timedelta(hours=2), abs=timedelta(seconds=1))
    ends = (now + timedelta(hours=2)).strftime("%H:%M")
    assert shown[second.pk].basis.startswith(
        f"about 2 h 00 min (by {ends} UTC): 1 launch is ahead of you; the 1x on gpu-03 ends by {ends} UTC "
        "at its maximum length."
    )
    assert status.position == 2 and status.estimate_basis == shown[second.pk].basis

    # The clock moves a beat at a time; beat stops what reached its length, then hands out GPUs.
    published = []
    monkeypatch.setattr(lifecycle, "enqueue", lambda task, **kwargs: published.append(kwargs) or True)
    started_at = {}
    beat = now
    while len(started_at) < 2 and beat < now + timedelta(hours=3):
        beat += BEAT
        for instance_id in limits.enforce_max_session_length(now=beat):
            lifecycle.instance_teardown(instance_id=instance_id)
        lifecycle.start_queued(now=beat)
        for instance in (first, second):
            held = GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).exists()
            if held and instance.pk not in started_at:
                started_at[instance.pk] = beat
                assert transitions.claim(instance.pk, now=beat)  # its provision task takes it from here

    for instance in (first, second):
        assert abs(started_at[instance.pk] - shown[instance.pk].starts_at) <= BEAT


def test_when_no_end_frees_a_host_it_fits_on_it_goes_by_recent_waits_or_says_so(alice, dave, cpu, policy):
    fake.make_host("gpu-03", gpus=7)  # a GPU is missing: no 8x fits there, whatever ends
    dave.extra_sizes = ["8x"]
    dave.save(update_fields=["extra_sizes"])
    queued = launch(dave, size="8x")
    assert lifecycle.instance_provision(instance_id=queued.id) == "queued"
    queued.refresh_from_db()

    shown = estimates.estimate(queued)

    assert shown.starts_at is None
    assert shown.basis == (
        "No estimate yet: no launch is ahead of you, the known ends of the instances running now do not free "
        "GPUs it fits on, and no recent 8x launch had to wait."
    )

    # An 8x launch earlier this week waited 30 min for its GPUs.
    earlier = Instance.objects.create(user=alice, size="8x", image=cpu, state=Instance.State.STOPPED)
    created = timezone.now() - timedelta(days=1)
    Instance.objects.filter(pk=earlier.pk).update(created_at=created)
    for gpu in fake.make_host("gpu-04", gpus=8, state="retired").gpus.all():
        GpuAllocation.objects.create(gpu=gpu, instance=earlier, released_at=timezone.now())
    GpuAllocation.objects.filter(instance=earlier).update(allocated_at=created + timedelta(minutes=30))

    shown = estimates.estimate(queued)

    assert shown.starts_at == pytest.approx(
        queued.created_at + timedelta(minutes=30), abs=timedelta(seconds=1)
    )
    assert "going by recent waits" in shown.basis
    assert "8x launches that had to wait started after a median of 30 min" in shown.basis


def test_an_end_by_credit_comes_before_the_maximum_length(alice, dave, cpu, policy):
    fake.make_host("gpu-03", gpus=1)
    holder = running(alice, ready_hours_ago=0)
    # Left with 30 GPU-minutes, alice's 1x runs out long before its 4 hours.
    account = alice.credit_account
    account.balance_gpu_seconds = 30 * 60
    account.save(update_fields=["balance_gpu_seconds"])
    Instance.objects.filter(pk=holder.pk).update(metered_until=timezone.now())
    now = timezone.now()

    shown = estimates.estimate(waiting(dave), now=now)

    assert shown.starts_at == pytest.approx(now + timedelta(minutes=30), abs=timedelta(seconds=2))
    assert "the 1x on gpu-03 ends by" in shown.basis and "when its owner's credit runs out" in shown.basis
