"""The meter tick's duration with 5,000 running instances, in a scratch PostgreSQL database.

2,500 owners run two instances each (one in ten is an 8x), every owner with ample credit, all committed
before the clock starts. Each tick is what beat runs every METER_TICK_SECONDS
(provisioning.lifecycle.meter_tick): it charges every running instance for the minute since the last
tick, writing one ledger entry per instance, and finds nobody out of credit. The ticks are a minute
apart in metering time (passed as `now`), so every tick has a full minute to charge.

The baseline, on the same fleet in the same run: the same ticks charged by the Python path
(portal.credits.metering._charge_in_python, which SQLite uses), which computes each instance's charge
with period_charge() and writes the rows with bulk_create and bulk_update. Target: under 0.5 s.
"""

import time
import uuid
from datetime import timedelta

from benchmarks import scratch_database, summarize_ms

DATABASE = "devcloud_bench_metering"
INSTANCES = 5000
INSTANCES_PER_OWNER = 2
EIGHT_X_EVERY = 10
TICKS = 6
# The baseline is about ten times slower; three of its ticks give a steady median.
BASELINE_TICKS = 3
TICK_SECONDS = 60
TARGET_S = 0.5


def _build_fleet(started_at):
    from django.contrib.auth.hashers import make_password
    from django.db import connection

    from portal.accounts.models import User
    from portal.credits.models import CreditAccount
    from portal.instances.models import Image, Instance

    owners = INSTANCES // INSTANCES_PER_OWNER
    unusable = make_password(None)
    users = User.objects.bulk_create(
        [User(email=f"meter{n}@example.com", password=unusable) for n in range(owners)], batch_size=1000
    )
    CreditAccount.objects.bulk_create(
        [CreditAccount(user=user, balance_gpu_seconds=10_000 * 3600) for user in users], batch_size=1000
    )
    image = Image.objects.create(
        key="bench", name="Bench", sizes=["1x", "8x"], reference="devcloud/cpu:bench"
    )
    Instance.objects.bulk_create(
        [
            Instance(
                id=uuid.uuid4(),
                user=users[number // INSTANCES_PER_OWNER],
                size="8x" if number % EIGHT_X_EVERY == 0 else "1x",
                image=image,
                state=Instance.State.RUNNING,
                step=Instance.Step.READY,
                ready_at=started_at,
                metered_until=started_at,
            )
            for number in range(INSTANCES)
        ],
        batch_size=1000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _meter_tick():
    """What beat's provisioning.meter_tick task runs: charging, then the teardowns of owners who ran out."""
    from portal.instances import lifecycle

    return lifecycle.meter_tick


def _ticks(meter_tick, first_at, label: str, ticks: int = TICKS) -> list[float]:
    """Runs `ticks` ticks a minute apart from `first_at`; returns their durations."""
    samples = []
    for tick in range(ticks):
        began = time.perf_counter()
        result = meter_tick(first_at + timedelta(seconds=tick * TICK_SECONDS))
        samples.append(time.perf_counter() - began)
        if result.instances_charged != INSTANCES or result.stopping_ids:
            raise AssertionError(
                f"{label} tick {tick} charged {result.instances_charged}, stopped {result.stopping_ids}"
            )
    return samples


def main() -> dict:
    from django.utils import timezone

    from portal.credits import metering
    from portal.credits.models import LedgerEntry

    meter_tick = _meter_tick()
    with scratch_database(DATABASE):
        started_at = timezone.now() - timedelta(hours=1)
        built = time.perf_counter()
        _build_fleet(started_at)
        print(
            f"fleet: {INSTANCES} running instances of {INSTANCES // INSTANCES_PER_OWNER} owners, "
            f"built in {time.perf_counter() - built:.1f} s"
        )
        samples = _ticks(meter_tick, started_at + timedelta(seconds=TICK_SECONDS), "bulk")
        in_database = metering._charge_in_database
        metering._charge_in_database = metering._charge_in_python
        try:
            baseline = _ticks(
                meter_tick,
                started_at + timedelta(seconds=(TICKS + 1) * TICK_SECONDS),
                "python",
                BASELINE_TICKS,
            )
        finally:
            metering._charge_in_database = in_database
        entries = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).count()
        expected = INSTANCES * (TICKS + BASELINE_TICKS)
        if entries != expected:
            raise AssertionError(f"expected {expected} usage entries, found {entries}")

    figures, base = summarize_ms(samples), summarize_ms(baseline)
    median_s, base_s = figures["median_ms"] / 1000, base["median_ms"] / 1000
    print(
        f"meter tick, {INSTANCES} running instances, {TICKS} ticks (baseline {BASELINE_TICKS}); medians; "
        f"target under {TARGET_S} s"
    )
    print(
        f"  bulk SQL (PostgreSQL)        median {median_s:.3f} s  max {figures['max_ms'] / 1000:.3f} s"
        f"  ({figures['median_ms'] * 1000 / INSTANCES:.0f} µs per instance)  "
        f"{'meets' if median_s < TARGET_S else 'MISSES'} the target"
    )
    print(
        f"  baseline: Python path        median {base_s:.3f} s  max {base['max_ms'] / 1000:.3f} s"
        f"  ({base['median_ms'] * 1000 / INSTANCES:.0f} µs per instance)"
    )
    print(f"  bulk / baseline: {median_s / base_s:.2f}x; {entries} ledger entries written")
    return {
        "tick_median_s": round(median_s, 3),
        "tick_max_s": round(figures["max_ms"] / 1000, 3),
        "baseline_python_median_s": round(base_s, 3),
        "per_instance_us": round(figures["median_ms"] * 1000 / INSTANCES),
        "target_s": TARGET_S,
    }


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
