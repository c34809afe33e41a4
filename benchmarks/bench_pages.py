"""The pages people use most, under load: the dashboard, the instance list and the status JSON that launch
pages poll, served by a real server process to 50 concurrent users (locust), from a database seeded
with 10,000 developers and 1,000,000 ledger entries.

- Seeded in a scratch PostgreSQL database: 10,000 users, each with a credit account, 100 ledger
  entries spread over the last 70 days and 3 stopped instances; the 50 users locust plays also have one
  running instance, whose status JSON they poll.
- The portal runs as the deploy kit's web unit runs it (its exact uvicorn command line, two worker
  processes per core) with the production settings (portal.settings.deployed, production without its refusal of loopback HTTP: its database connection
  pool, DEBUG off), over plain HTTP on loopback (SECURE_SSL_REDIRECT off; nginx terminates TLS in
  production).
- locust (benchmarks/locust_pages.py) plays 50 users for LOAD_SECONDS after they have all started:
  each opens the dashboard and the instance list now and then and polls its status JSON, 0.5-1.5 s
  apart, as a person with the launch page open does.

Printed: each page's median and p95 under load next to the target (p95 under 50 ms), and the baseline
from the same run: the same page fetched one request at a time with no other load. Also the SQL queries
each page runs, which is what grows with the data.
"""

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx

from benchmarks import database_url, scratch_database, start_kit_web, summarize_ms, web_workers

DATABASE = "devcloud_bench_pages"
USERS = int(os.environ.get("BENCH_PAGES_USERS_SEEDED", "10000"))
LEDGER_PER_USER = 100
INSTANCES_PER_USER = 3
CONCURRENT = int(os.environ.get("BENCH_PAGES_CONCURRENT", "50"))
LOAD_SECONDS = int(os.environ.get("BENCH_PAGES_SECONDS", "40"))
TARGET_P95_MS = 50
BASELINE_REQUESTS = 50
PAGES = {"dashboard": "/", "instance list": "/instances/", "status JSON": "/instances/{instance}/status.json"}


def _seed() -> list:
    """Seeds the database; returns the users locust plays, each with their running instance."""
    from django.contrib.auth.hashers import make_password
    from django.db import connection
    from django.utils import timezone

    from portal.accounts.models import User
    from portal.credits.models import CreditAccount, LedgerEntry
    from portal.instances.models import Image, Instance

    now = timezone.now()
    unusable = make_password(None)
    users = User.objects.bulk_create(
        [
            User(email=f"dev{n}@example.com", password=unusable, email_verified_at=now)
            for n in range(USERS)
        ],
        batch_size=2000,
    )
    CreditAccount.objects.bulk_create(
        [CreditAccount(user=user, balance_gpu_seconds=50 * 3600) for user in users], batch_size=2000
    )
    with connection.cursor() as cursor:
        # One statement: the ORM would build a million model objects.
        cursor.execute(
            f"""
            INSERT INTO {LedgerEntry._meta.db_table}
                (account_id, kind, gpu_seconds, balance_after, idempotency_key, reason, actor_name,
                 created_at)
            SELECT account.id, CASE WHEN n = 1 THEN 'grant' ELSE 'usage' END,
                CASE WHEN n = 1 THEN 50 * 3600 + 99 * 60 ELSE -60 END,
                50 * 3600 + (n - 1) * 60, 'seed:' || account.id || ':' || n,
                CASE WHEN n = 1 THEN 'Early registrant grant' ELSE '1x MI300X instance seed: 60 s' END,
                'system', %s - (%s - n) * interval '1 minute' * 1000
            FROM {CreditAccount._meta.db_table} account CROSS JOIN generate_series(1, %s) AS n
            """,
            [now, LEDGER_PER_USER, LEDGER_PER_USER],
        )
    image = Image.objects.create(key="cpu", name="CPU", sizes=["1x", "8x"], reference="devcloud/cpu:bench")
    stopped = [
        Instance(
            user=user,
            size="1x",
            image=image,
            state=Instance.State.STOPPED,
            step=Instance.Step.READY,
            ready_at=now - timedelta(days=number + 1),
            stopped_at=now - timedelta(days=number + 1) + timedelta(hours=1),
            metered_until=now - timedelta(days=number + 1) + timedelta(hours=1),
            charged_gpu_seconds=3600,
        )
        for user in users
        for number in range(INSTANCES_PER_USER)
    ]
    Instance.objects.bulk_create(stopped, batch_size=2000)
    players = users[:: max(1, USERS // CONCURRENT)][:CONCURRENT]
    running = Instance.objects.bulk_create(
        [
            Instance(
                user=user,
                size="1x",
                image=image,
                state=Instance.State.RUNNING,
                step=Instance.Step.READY,
                ready_at=now,
                metered_until=now,
                driver_state={"endpoint": "http://127.0.0.1:9"},
            )
            for user in players
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return list(zip(players, running))


def _sessions(players) -> list[dict]:
    from django.conf import settings
    from django.test import Client

    people = []
    for user, instance in players:
        browser = Client()
        browser.force_login(user)
        people.append(
            {
                "cookie_name": PRODUCTION_SESSION_COOKIE,
                "test_cookie_name": settings.SESSION_COOKIE_NAME,
                "session": browser.cookies[settings.SESSION_COOKIE_NAME].value,
                "instance": str(instance.id),
            }
        )
    return people


def _queries_per_page(people) -> dict:
    """SQL queries each page runs for one of the players (Django's test client, in this process)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, override_settings

    from portal.settings import base as production_settings

    # The host the server is reached at (the test client's "testserver" is not an allowed host).
    browser = Client(HTTP_HOST="127.0.0.1")
    browser.cookies[people[0]["test_cookie_name"]] = people[0]["session"]
    counts = {}
    # As the server runs it (the base settings' cache); the test settings read the catalogue afresh.
    served = override_settings(LAUNCH_CATALOGUE_CACHE_SECONDS=production_settings.LAUNCH_CATALOGUE_CACHE_SECONDS)
    for name, path in PAGES.items():
        with served:
            browser.get(path.format(instance=people[0]["instance"]))
            with CaptureQueriesContext(connection) as captured:
                response = browser.get(path.format(instance=people[0]["instance"]))
        if response.status_code != 200:
            raise RuntimeError(f"{name} answered {response.status_code}")
        counts[name] = len(captured)
    return counts


# Production names the session cookie __Host-sessionid; the sessions themselves are rows in the database
# the bench made them in, signed with the SECRET_KEY the server is given.
PRODUCTION_SESSION_COOKIE = "__Host-sessionid"


def _baseline(url: str, people) -> dict:
    """Each page fetched one request at a time, nothing else running: what the load adds to."""
    samples = {name: [] for name in PAGES}
    with httpx.Client(cookies={people[0]["cookie_name"]: people[0]["session"]}) as client:
        for number in range(BASELINE_REQUESTS + 5):
            for name, path in PAGES.items():
                person = people[number % len(people)]
                client.cookies.set(person["cookie_name"], person["session"])
                started = time.perf_counter()
                response = client.get(url + path.format(instance=person["instance"]))
                elapsed = time.perf_counter() - started
                if response.status_code != 200:
                    raise RuntimeError(f"{name} answered {response.status_code}: {response.text[:200]}")
                if number >= 5:
                    samples[name].append(elapsed)
    return {name: summarize_ms(values) for name, values in samples.items()}


def _locust(url: str, people_file: Path, csv_prefix: Path) -> dict:
    """Runs locust headless; returns {page: {"median_ms", "p95_ms", "requests", "failures", "rps"}}."""
    ramp = CONCURRENT // 2 or 1
    command = [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(Path(__file__).with_name("locust_pages.py")),
        "--headless",
        "--only-summary",
        "--users",
        str(CONCURRENT),
        "--spawn-rate",
        str(ramp),
        # Everybody has started after ~2 s; the statistics then start over, so the figures are of the
        # steady load only.
        "--reset-stats",
        "--run-time",
        f"{LOAD_SECONDS + 3}s",
        "--host",
        url,
        "--csv",
        str(csv_prefix),
        "--loglevel",
        "WARNING",
    ]
    env = {**os.environ, "BENCH_PAGES_USERS": str(people_file)}
    subprocess.run(command, env=env, check=False, capture_output=True, text=True, timeout=LOAD_SECONDS + 120)
    figures = {}
    with open(f"{csv_prefix}_stats.csv") as handle:
        for row in csv.DictReader(handle):
            if row["Name"] in PAGES:
                figures[row["Name"]] = {
                    "median_ms": float(row["50%"]),
                    "p95_ms": float(row["95%"]),
                    "requests": int(row["Request Count"]),
                    "failures": int(row["Failure Count"]),
                    "rps": float(row["Requests/s"]),
                }
    return figures


def main() -> dict:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.db import connection

    from tests.gateway.helpers import free_port, wait_until

    with scratch_database(DATABASE), tempfile.TemporaryDirectory(prefix="bench-pages-") as scratch:
        scratch = Path(scratch)
        began = time.perf_counter()
        players = _seed()
        seeded = time.perf_counter() - began
        print(
            f"seeded {USERS} users, {USERS * LEDGER_PER_USER} ledger entries, "
            f"{USERS * INSTANCES_PER_USER + len(players)} instances in {seeded:.1f} s"
        )
        people = _sessions(players)
        people_file = scratch / "people.json"
        people_file.write_text(json.dumps(people))
        queries = _queries_per_page(people)
        port = free_port()
        portal = start_kit_web(port, database_url(connection.settings_dict), scratch / "portal.log")
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: httpx.get(f"{url}/accounts/login/").status_code == 200,
                timeout=60,
                what="the portal to answer",
            )
            baseline = _baseline(url, people)
            loaded = _locust(url, people_file, scratch / "locust")
        except Exception:
            print((scratch / "portal.log").read_text(errors="replace")[-3000:])
            raise
        finally:
            portal.terminate()
            portal.wait(timeout=15)

    print(
        f"{CONCURRENT} concurrent users for {LOAD_SECONDS} s (locust), {web_workers()} uvicorn workers; "
        f"target: p95 under {TARGET_P95_MS} ms per page"
    )
    results = {}
    for name in PAGES:
        load, base = loaded.get(name), baseline[name]
        if load is None:
            raise RuntimeError(f"locust reported nothing for {name}")
        verdict = "meets" if load["p95_ms"] < TARGET_P95_MS else "MISSES"
        print(
            f"  {name:<14} under load: median {load['median_ms']:5.0f} ms  p95 {load['p95_ms']:5.0f} ms "
            f"({load['requests']} requests, {load['rps']:.1f}/s, {load['failures']} failed)  "
            f"{verdict} the target | "
            f"baseline, one at a time: median {base['median_ms']:6.2f} ms  p95 {base['p95_ms']:6.2f} ms | "
            f"{queries[name]} SQL queries"
        )
        if load["failures"]:
            raise RuntimeError(f"{load['failures']} requests for {name} failed under load")
        key = name.replace(" ", "_").lower()
        results.update(
            {
                f"{key}_p95_ms": load["p95_ms"],
                f"{key}_median_ms": load["median_ms"],
                f"{key}_baseline_median_ms": base["median_ms"],
                f"{key}_queries": queries[name],
            }
        )
    results["target_p95_ms"] = TARGET_P95_MS
    return results


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
