"""Benchmarks: `python -m benchmarks` runs every benchmarks/bench_*.py and prints its figures.

Each bench module has a `main()` that prints its own figures and returns them as a dict (name -> value)
for the runner's summary. Helpers here set up Django and give a bench its own scratch database.
"""

import os
import statistics
from contextlib import contextmanager


def setup_django():
    """Configure Django once; the test settings by default (PostgreSQL from DATABASE_URL)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.test")
    import django

    django.setup()


@contextmanager
def scratch_database(name: str):
    """Create a fresh, migrated database called `name` for the block, and drop it afterwards.

    Uses Django's test-database machinery, so the real database named in DATABASE_URL is never touched.
    A database of that name left over from an interrupted run is dropped first.
    """
    setup_django()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    connection.settings_dict.setdefault("TEST", {})["NAME"] = name
    old_config = setup_databases(verbosity=0, interactive=False, keepdb=False)
    try:
        yield
    finally:
        teardown_databases(old_config, verbosity=0)


def summarize_ms(samples_seconds: list[float]) -> dict:
    """median, p95 and max of durations given in seconds, in milliseconds."""
    ordered = sorted(samples_seconds)
    p95 = ordered[min(len(ordered) - 1, max(0, int(round(0.95 * len(ordered))) - 1))]
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(p95 * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }
