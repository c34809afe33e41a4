"""The meter tick charges in bulk exactly what charging each instance on its own charges, once per period."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from portal.accounts.models import User
from portal.credits import metering
from portal.credits import services as credits
from portal.credits.models import CreditAccount, LedgerEntry
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.support.race import at_once

pytestmark = pytest.mark.usefixtures("cloud", "meter_ticks_every_minute")

T0 = timezone.make_aware(timezone.datetime(2026, 3, 1, 12, 0, 0))
NOW = T0 + timedelta(minutes=3)
HOUR = 3600


class _Undo(Exception):
    pass


def owner(name: str, gpu_seconds: int) -> User:
    user = User.objects.create(email=f"{name}@example.com", email_verified_at=timezone.now())
    if gpu_seconds:
        credits.credits_adjust(
            user=user, gpu_seconds=gpu_seconds, reason="Test credit", actor=None, idempotency_key=f"give:{name}"
        )
    else:
        CreditAccount.objects.get_or_create(user=user)
    return user


def run(user, image, size="1x", metered_until=T0) -> Instance:
    return Instance.objects.create(
        user=user,
        size=size,
        image=image,
        driver="fake",
        state=Instance.State.RUNNING,
        step=Instance.Step.READY,
        ready_at=T0,
        metered_until=metered_until,
    )


def mixed_fleet() -> None:
    """Owners with plenty, owners who run out part-way through their instances, one already in debt, and
    periods that start on a fraction of a second, in the future, or less than a second ago."""
    image = fake.make_image("cpu")
    rich = owner("rich", 100 * HOUR)
    run(rich, image, "1x"), run(rich, image, "8x"), run(rich, image, "1x", T0 + timedelta(seconds=0.25))
    # 3 minutes of 1 + 8 + 1 GPUs is 1800 GPU-seconds; 700 runs out inside the 8x.
    short = owner("short", 700)
    run(short, image, "1x"), run(short, image, "8x"), run(short, image, "1x")
    # Enough for part of one instance: the floor (10 GPUs x 60 s) lets it go to -600.
    scraping = owner("scraping", 50)
    for size in ("8x", "1x", "1x"):
        run(scraping, image, size, T0 + timedelta(seconds=1.5))
    in_debt = owner("indebt", 0)
    credits.credits_adjust(user=in_debt, gpu_seconds=-30, reason="Debt", actor=None, idempotency_key="debt")
    run(in_debt, image, "1x")
    late = owner("late", 10 * HOUR)
    # Beat was an hour late for this one: the floor waives most of it for a small balance, none here.
    run(late, image, "8x", NOW - timedelta(hours=1, microseconds=123456))
    run(late, image, "1x", NOW + timedelta(seconds=5))
    run(late, image, "1x", NOW - timedelta(milliseconds=400))


def charges_and_balances() -> tuple[list, dict, dict]:
    """The usage ledger rows (everything but id and created_at), balances, and where metering got to."""
    entries = sorted(
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).values_list(
            "account__user__email", "kind", "gpu_seconds", "balance_after", "idempotency_key", "reason",
            "actor_id", "actor_name",
        )
    )
    balances = dict(CreditAccount.objects.values_list("user__email", "balance_gpu_seconds"))
    metered = {
        instance_id: (until, charged)
        for instance_id, until, charged in Instance.objects.values_list(
            "id", "metered_until", "charged_gpu_seconds"
        )
    }
    return entries, balances, metered


def charge_one_by_one(now) -> None:
    """What the per-instance code charges: charge_until for each running instance, one transaction each,
    owner's account then the instance locked, in the order the tick goes through them."""
    running = Instance.objects.filter(state=Instance.State.RUNNING).order_by("user_id", "id")
    for instance_id in running.values_list("id", flat=True):
        with transaction.atomic():
            instance = Instance.objects.get(pk=instance_id)
            metering.account_locked(instance.user_id)
            instance = Instance.objects.select_for_update().get(pk=instance_id)
            metering.charge_until(instance=instance, until=now)


def test_it_charges_in_bulk_exactly_what_charging_each_instance_charges(db):
    mixed_fleet()
    try:
        with transaction.atomic():
            result = metering.meter_tick(NOW)
            bulk = charges_and_balances()
            raise _Undo
    except _Undo:
        pass

    charge_one_by_one(NOW)
    one_by_one = charges_and_balances()

    assert bulk == one_by_one
    entries, balances, _ = bulk
    assert result.instances_charged == len(entries) > 0
    assert result.gpu_seconds == -sum(entry[2] for entry in entries)
    assert balances["short@example.com"] == -10 * 60
    assert balances["scraping@example.com"] == -10 * 60
    # Already at -30 with one GPU running: only 30 more, down to the floor of one tick.
    assert balances["indebt@example.com"] == -60
    assert any("waived at the debt floor" in entry[5] for entry in entries)


def test_a_second_tick_for_the_same_moment_charges_nothing_more(db):
    mixed_fleet()
    metering.meter_tick(NOW)
    first = charges_and_balances()

    again = metering.meter_tick(NOW)

    assert again.gpu_seconds == again.instances_charged == 0
    assert charges_and_balances()[:2] == first[:2]


@pytest.mark.django_db(transaction=True)
def test_two_ticks_at_once_charge_each_period_once():
    image = fake.make_image("cpu")
    users = [owner(f"owner{n}", 10 * HOUR) for n in range(20)]
    instances = [run(user, image, size) for user in users for size in ("1x", "8x")]
    _, errors = at_once(lambda: metering.meter_tick(T0 + timedelta(seconds=60), batch_size=8))

    assert errors == []
    assert LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).count() == len(instances)
    for user in users:
        assert CreditAccount.objects.get(user=user).balance_gpu_seconds == 10 * HOUR - 60 - 480
    assert sorted(Instance.objects.values_list("charged_gpu_seconds", flat=True)) == [60] * 20 + [480] * 20
