"""Metering: GPUs × ready seconds, once per period, stopping at zero without going below minus one tick."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.accounts.models import User
from portal.credits import metering
from portal.credits import services as credits
from portal.credits.models import CreditAccount, LedgerEntry
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.conftest import balance

pytestmark = pytest.mark.usefixtures("cloud", "meter_ticks_every_minute")

HOUR = 3600
T0 = timezone.make_aware(timezone.datetime(2026, 3, 1, 12, 0, 0))


def give_gpu_seconds(user, gpu_seconds):
    credits.credits_adjust(
        user=user,
        gpu_seconds=gpu_seconds,
        reason="Test credit",
        actor=None,
        idempotency_key=str(uuid.uuid4()),
    )


def usage(user):
    return LedgerEntry.objects.filter(account__user=user, kind=LedgerEntry.Kind.USAGE).order_by("id")


@pytest.fixture
def image(db):
    return fake.make_image("cpu")


@pytest.fixture
def running(image):
    """Factory: an instance of `user` that turned ready at `ready_at` (T0 by default)."""

    def make(user, size="1x", ready_at=T0):
        return Instance.objects.create(
            user=user,
            size=size,
            image=image,
            driver="fake",
            state=Instance.State.RUNNING,
            step=Instance.Step.READY,
            ready_at=ready_at,
            metered_until=ready_at,
        )

    return make


def test_it_charges_gpus_times_ready_seconds(alice, running):
    give_gpu_seconds(alice, 25 * HOUR)
    one, eight = running(alice, "1x"), running(alice, "8x")

    result = metering.meter_tick(T0 + timedelta(seconds=60))

    assert result.instances_charged == 2 and result.gpu_seconds == 60 + 480
    assert balance(alice) == 25 * HOUR - 540
    assert sorted(usage(alice).values_list("gpu_seconds", flat=True)) == [-480, -60]
    entry = usage(alice).get(gpu_seconds=-60)
    assert entry.idempotency_key == f"usage:{one.id}:{T0.isoformat()}"
    assert entry.reason == f"1x MI300X instance {one.short_id}: 60 s"
    assert entry.balance_after in (25 * HOUR - 60, 25 * HOUR - 540)
    one.refresh_from_db(), eight.refresh_from_db()
    assert one.metered_until == eight.metered_until == T0 + timedelta(seconds=60)
    assert (one.charged_gpu_seconds, eight.charged_gpu_seconds) == (60, 480)


def test_it_charges_each_period_once(alice, running):
    give_gpu_seconds(alice, 25 * HOUR)
    instance = running(alice)

    metering.meter_tick(T0 + timedelta(seconds=60))
    again = metering.meter_tick(T0 + timedelta(seconds=60))
    earlier = metering.meter_tick(T0 + timedelta(seconds=30))

    assert again.gpu_seconds == earlier.gpu_seconds == 0
    assert usage(alice).count() == 1
    assert Instance.objects.get(pk=instance.pk).charged_gpu_seconds == 60


def test_it_carries_part_seconds_to_the_next_tick_so_the_total_is_exact(alice, running):
    give_gpu_seconds(alice, 25 * HOUR)
    instance = running(alice)

    for seconds in (59.7, 120.2, 181.9, 3600.5):
        metering.meter_tick(T0 + timedelta(seconds=seconds))

    instance.refresh_from_db()
    assert instance.charged_gpu_seconds == 3600
    assert instance.metered_until == T0 + timedelta(seconds=3600)
    assert balance(alice) == 24 * HOUR


def test_it_charges_nothing_before_ready_nor_for_instances_that_are_not_running(alice, image):
    give_gpu_seconds(alice, 25 * HOUR)
    for state in (
        Instance.State.QUEUED,
        Instance.State.PROVISIONING,
        Instance.State.FAILED,
        Instance.State.STOPPED,
    ):
        Instance.objects.create(user=alice, size="8x", image=image, state=state)

    assert metering.meter_tick(T0 + timedelta(hours=1)).gpu_seconds == 0
    assert balance(alice) == 25 * HOUR


def test_it_stops_an_instance_when_the_balance_reaches_zero(alice, running, cloud):
    give_gpu_seconds(alice, 30)
    instance = running(alice)

    result = lifecycle.meter_tick(T0 + timedelta(seconds=60))

    assert result.stopping_ids == [instance.id]
    instance.refresh_from_db()
    assert instance.stop_reason == "credits_exhausted"
    # The teardown the tick enqueued ran inline (tests run tasks eagerly).
    assert instance.state == Instance.State.STOPPED
    assert balance(alice) == -30
    assert instance.events.filter(message__startswith="Your credits ran out").exists()


def test_the_balance_never_goes_below_minus_one_tick_even_when_beat_was_late(alice, running):
    give_gpu_seconds(alice, 30)
    instance = running(alice, "8x")

    result = metering.meter_tick(T0 + timedelta(minutes=10))

    # 10 minutes of 8 GPUs is 4800 GPU-seconds; the floor is minus one tick of 8 GPUs.
    assert balance(alice) == -8 * 60
    assert result.gpu_seconds == 30 + 480
    assert result.gpu_seconds_waived == 4800 - 510
    assert "waived at the debt floor" in usage(alice).get().reason
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.STOPPING


def test_the_floor_counts_all_the_owners_running_gpus(alice, running):
    give_gpu_seconds(alice, 100)
    running(alice, "1x"), running(alice, "1x")

    metering.meter_tick(T0 + timedelta(minutes=30))

    assert balance(alice) == -2 * 60


def test_it_stops_every_live_instance_of_an_owner_who_ran_out(alice, bob, running, image):
    give_gpu_seconds(alice, 30)
    give_gpu_seconds(bob, 25 * HOUR)
    alices = running(alice)
    queued = Instance.objects.create(user=alice, size="1x", image=image)
    provisioning = Instance.objects.create(
        user=alice, size="1x", image=image, state=Instance.State.PROVISIONING
    )
    bobs = running(bob)

    result = metering.meter_tick(T0 + timedelta(seconds=60))

    assert sorted(result.stopping_ids) == sorted([alices.id, provisioning.id])
    assert result.stopped_queued_ids == [queued.id]
    assert Instance.objects.get(pk=queued.pk).state == Instance.State.STOPPED
    assert Instance.objects.get(pk=bobs.pk).state == Instance.State.RUNNING


def test_stopping_charges_the_rest_up_to_the_stop(alice, running):
    give_gpu_seconds(alice, 25 * HOUR)
    ready_at = timezone.now() - timedelta(seconds=90)
    instance = running(alice, "8x", ready_at=ready_at)
    metering.meter_tick(ready_at + timedelta(seconds=60))

    services.instance_stop(user=alice, instance_id=instance.id)

    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPING
    assert instance.charged_gpu_seconds in (8 * 90, 8 * 91)
    assert balance(alice) == 25 * HOUR - instance.charged_gpu_seconds
    # Nothing more is charged afterwards: billing ended with the stop.
    assert metering.meter_tick(timezone.now() + timedelta(hours=1)).gpu_seconds == 0
    lifecycle.instance_teardown(instance_id=instance.id)
    assert Instance.objects.get(pk=instance.pk).charged_gpu_seconds == instance.charged_gpu_seconds


def test_teardown_charges_a_stop_that_bypassed_the_stop_service(alice, running):
    give_gpu_seconds(alice, 25 * HOUR)
    instance = running(alice)
    # e.g. an operator's raw update: billing must still end exactly when stopping began.
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.STOPPING, state_changed_at=T0 + timedelta(seconds=300)
    )

    lifecycle.instance_teardown(instance_id=instance.id)

    assert Instance.objects.get(pk=instance.pk).charged_gpu_seconds == 300
    assert balance(alice) == 25 * HOUR - 300


def test_a_failed_instance_costs_nothing(alice, image):
    give_gpu_seconds(alice, 25 * HOUR)
    Instance.objects.create(
        user=alice, size="8x", image=image, state=Instance.State.FAILED, provisioning_at=T0
    )
    metering.meter_tick(T0 + timedelta(hours=2))
    assert not usage(alice).exists()


def owner(email):
    # No password: hashing one per owner would dominate these tests' run time.
    return User.objects.create(email=email, email_verified_at=timezone.now())


def test_it_charges_many_owners_in_batches_without_splitting_an_owner(db, image, running):
    users = [owner(f"user{n}@example.com") for n in range(7)]
    for user in users:
        give_gpu_seconds(user, 25 * HOUR)
        for _ in range(3):
            running(user)

    result = metering.meter_tick(T0 + timedelta(seconds=60), batch_size=4)

    assert result.instances_charged == 21
    for user in users:
        assert balance(user) == 25 * HOUR - 180
        assert sorted(usage(user).values_list("balance_after", flat=True)) == [
            25 * HOUR - 180,
            25 * HOUR - 120,
            25 * HOUR - 60,
        ]


def test_a_tick_runs_a_fixed_number_of_queries_however_many_instances_run(db, image, running):
    def tick_queries(owners, at):
        for n in range(owners):
            user = owner(f"owner{at.second}-{n}@example.com")
            give_gpu_seconds(user, 25 * HOUR)
            running(user, ready_at=at)
        with CaptureQueriesContext(connection) as captured:
            metering.meter_tick(at + timedelta(seconds=60))
        Instance.objects.filter(state=Instance.State.RUNNING).update(state=Instance.State.STOPPED)
        return len(captured)

    few = tick_queries(3, T0)
    many = tick_queries(60, T0 + timedelta(seconds=1))
    assert many == few


def test_an_owner_without_a_credit_account_is_charged_into_a_new_one_and_stopped(db, image, running):
    # Such an owner could not have launched through the portal; the instance must not run free.
    paying, stray = owner("paying@example.com"), owner("stray@example.com")
    give_gpu_seconds(paying, 25 * HOUR)
    running(paying)
    stray_instance = running(stray)
    CreditAccount.objects.filter(user=stray).delete()

    result = metering.meter_tick(T0 + timedelta(seconds=60))

    assert result.instances_charged == 2
    assert balance(paying) == 25 * HOUR - 60
    # A fresh account holds nothing: the minute goes down to the debt floor and the owner is stopped.
    assert balance(stray) == -60
    assert stray_instance.id in result.stopping_ids
