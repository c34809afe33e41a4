"""The meter tick's duration with 5,000 running instances, in a scratch PostgreSQL database.

2,500 owners run two instances each (one in ten is an 8x), every owner with ample credit, all committed
before the clock starts. Each tick is what beat runs every METER_TICK_SECONDS
(provisioning.lifecycle.meter_tick): it charges every running instance for the minute since the last
tick, writing one ledger entry per instance, and finds nobody out of credit. The ticks are a minute
apart in metering time (passed as `now`), so every tick has a full minute to charge.
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
TICK_SECONDS = 60


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


def main() -> dict:
    from django.utils import timezone

    from portal.credits.models import LedgerEntry
    from provisioning import lifecycle

    with scratch_database(DATABASE):
        started_at = timezone.now() - timedelta(hours=1)
        built = time.perf_counter()
        _build_fleet(started_at)
        print(
            f"fleet: {INSTANCES} running instances of {INSTANCES // INSTANCES_PER_OWNER} owners, "
            f"built in {time.perf_counter() - built:.1f} s"
        )

        samples = []
        for tick in range(1, TICKS + 1):
            began = time.perf_counter()
            result = lifecycle.meter_tick(started_at + timedelta(seconds=tick * TICK_SECONDS))
            samples.append(time.perf_counter() - began)
            if result.instances_charged != INSTANCES or result.stopping_ids:
                raise AssertionError(
                    f"tick {tick} charged {result.instances_charged}, stopped {result.stopping_ids}"
                )
        entries = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).count()
        if entries != INSTANCES * TICKS:
            raise AssertionError(f"expected {INSTANCES * TICKS} usage entries, found {entries}")

    figures = summarize_ms(samples)
    print(
        f"meter tick, {INSTANCES} running instances: median {figures['median_ms'] / 1000:.3f} s, "
        f"max {figures['max_ms'] / 1000:.3f} s over {TICKS} ticks "
        f"(first {samples[0]:.3f} s; {figures['median_ms'] * 1000 / INSTANCES:.0f} µs per instance); "
        f"{entries} ledger entries written"
    )
    return {
        "tick_median_s": round(figures["median_ms"] / 1000, 3),
        "tick_max_s": round(figures["max_ms"] / 1000, 3),
        "tick_first_s": round(samples[0], 3),
        "per_instance_us": round(figures["median_ms"] * 1000 / INSTANCES),
    }


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
