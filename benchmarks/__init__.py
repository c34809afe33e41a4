"""Benchmarks: `python -m benchmarks` runs every benchmarks/bench_*.py and prints its figures.

Each bench module has a `main()` that prints its own figures and returns them as a dict (name -> value)
for the runner's summary. Helpers here set up Django and give a bench its own scratch database.
"""

import os
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


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


def ensure_cpu_image() -> str:
    """The CPU image's reference, built first (scripts/build-images.sh cpu) when the engine lacks it."""
    from portal.instances.catalog import image_reference

    reference = image_reference("cpu")
    inspect = subprocess.run(["docker", "image", "inspect", reference], capture_output=True, check=False)
    if inspect.returncode != 0:
        print(f"building {reference} (scripts/build-images.sh cpu) ...", flush=True)
        subprocess.run(["bash", "scripts/build-images.sh", "cpu"], check=True, capture_output=True)
    return reference


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


def database_url(settings_dict) -> str:
    """A DATABASE_URL for the database Django is connected to (a bench's scratch database)."""
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"


def web_workers() -> int:
    """The kit's web unit runs two uvicorn worker processes per core (deploy/systemd/devcloud-web.service)."""
    return 2 * (os.cpu_count() or 1)


def start_kit_web(
    port: int,
    url: str,
    log: Path,
    *,
    app: str = "",
    http: str = "",
    env: dict | None = None,
    host: str = "127.0.0.1",
) -> subprocess.Popen:
    """The portal as the deploy kit's web unit runs it, on `port` against database `url`.

    The unit's exact command line (deploy/systemd/devcloud-web.service) with the settings production
    runs (portal.settings.deployed: production without its refusal, which plain HTTP on loopback trips);
    only the port differs, and the number of worker processes follows the unit's rule, two per core.
    `host` is the address it listens on, loopback as in the unit unless a bench's clients live elsewhere
    (the Slurm test cluster's nodes reach this machine at the cluster's controller address).
    `app` serves another ASGI application with that same command line (a baseline to compare with),
    `http` another uvicorn HTTP protocol, and `env` adds to its environment.
    Plain HTTP on loopback (SECURE_SSL_REDIRECT off): nginx terminates TLS in production. Sessions the
    bench makes in its own process are valid there (same SECRET_KEY).
    """
    from django.conf import settings

    from tests.deploy.kit import exec_start

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.deployed",
        "DATABASE_URL": url,
        "SECRET_KEY": settings.SECRET_KEY,
        "SECURE_SSL_REDIRECT": "false",
        "ALLOWED_HOSTS": "127.0.0.1",
        "STATIC_ROOT": str(log.parent / "static"),
        **(env or {}),
    }
    env.pop("DATABASE_CONN_MAX_AGE", None)
    command = exec_start("devcloud-web.service")
    command[command.index("--host") + 1] = host
    command[command.index("--port") + 1] = str(port)
    command[command.index("--workers") + 1] = str(web_workers())
    if app:
        command[command.index("portal.asgi:application")] = app
    if http:
        command[command.index("--http") + 1] = http
    with open(log, "wb") as log_file:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log_file)


def bench_people(count: int, *, hours: int = 100) -> list:
    """`count` people with verified addresses (bench0@example.com, ...), each granted `hours` GPU-hours."""
    import uuid

    from django.utils import timezone

    from portal.accounts.models import User
    from portal.credits import services as credits

    people = [
        User.objects.create_user(f"bench{n}@example.com", email_verified_at=timezone.now())
        for n in range(count)
    ]
    for person in people:
        credits.credits_adjust(
            user=person,
            gpu_seconds=hours * 3600,
            reason="Bench",
            actor=None,
            idempotency_key=str(uuid.uuid4()),
        )
    return people


# For units that launch on this machine's own Docker engine. It keeps its data on ext4, which cannot
# enforce disk limits; "enforce" would fail every launch here (tests/deploy/test_production_stack.py does
# the same).
LOCAL_ENGINE = {"DEVCLOUD_DRIVER": "docker", "DEVCLOUD_DISK_LIMITS": "warn"}


def kit_env(
    *, database_url: str, broker: str, default_queue: str, launch_queue: str, portal_id: str, **more
) -> dict:
    """What the deploy kit's environment file gives every unit (the production settings), pointed at this
    run's database, Redis, queues and portal id, with the settings in `more` added."""
    from django.conf import settings

    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.deployed",
        "SECRET_KEY": settings.SECRET_KEY,
        "DATABASE_URL": database_url,
        "REDIS_URL": broker,
        "CELERY_BROKER_URL": broker,
        "CELERY_QUEUE": default_queue,
        "CELERY_PROVISIONING_QUEUE": launch_queue,
        "DEVCLOUD_PORTAL_ID": portal_id,
        "PYTHONUNBUFFERED": "1",
        **more,
    }


@contextmanager
def layout_workers(env: dict, log_dir: Path):
    """The Celery workers of portal/workers.py (not beat: a bench drives time itself), each started with
    exactly portal.workers.command(name) and environment `env`, logging to <log_dir>/worker-<name>.log;
    yields their processes once both consume. Raises RuntimeError when one exits or is not ready in 60 s
    (its log's tail is printed)."""
    from portal import workers

    started = []
    try:
        for name in ("default", "provisioning"):
            log = log_dir / f"worker-{name}.log"
            with open(log, "wb") as log_file:
                process = subprocess.Popen(
                    workers.command(name, python=sys.executable, environ=env),
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append((name, process, log))
        for name, process, log in started:
            deadline = time.monotonic() + 60
            while " ready." not in log.read_text(errors="replace"):
                if process.poll() is not None:
                    raise RuntimeError(f"the {name} worker exited: {log.read_text(errors='replace')[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {name} worker was not ready within 60 s")
                time.sleep(0.01)
        yield [process for _, process, _ in started]
    except BaseException:
        for name, _, log in started:
            print(f"----- {name} worker log -----\n{log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        for _, process, _ in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process, _ in started:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
