"""Run a real Celery worker against real Redis for tests marked `slow`, and point this process at it.

    with celery_worker(queues=[queue], broker_url=url, extra_env={...}) as worker:
        with celery_publishing_to(broker_url=url, queue=queue):
            ...  # tasks queued here run in `worker`

The worker uses the test database (pass `database_url=current_database_url()`, the default), so tests
that use it need `@pytest.mark.django_db(transaction=True)`: the worker only sees committed rows.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import kombu.pools
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")
REDIS_HOST = os.environ.get("TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("TEST_REDIS_PORT", "6379"))


def redis_url(db: int) -> str:
    """A Redis URL on the local test server; each test area uses its own db index."""
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}"


def unique_queue(prefix: str) -> str:
    """A queue name no other test run shares, so stale messages never reach this run's worker."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def current_database_url() -> str:
    """postgres:// URL of the database this test session uses (pytest-django renamed it to the test one)."""
    db = settings.DATABASES["default"]
    auth = db.get("USER") or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{auth}{'@' if auth else ''}{host}:{port}/{db['NAME']}"


class Worker:
    def __init__(self, process: subprocess.Popen, log_path: Path, hostname: str, queues: list[str]):
        self.process = process
        self.log_path = log_path
        self.hostname = hostname
        self.queues = queues

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Return once the worker logs that it consumes. Raises RuntimeError if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return
            if not self.alive:
                raise RuntimeError(f"Celery worker exited with {self.process.returncode} before it was ready")
            time.sleep(0.1)
        raise RuntimeError(f"Celery worker not ready within {timeout:.0f}s")

    def stop(self, timeout: float = 15) -> None:
        """Warm shutdown (SIGTERM: the running task finishes), then SIGKILL the group if it hangs."""
        if not self.alive:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def kill(self) -> None:
        """SIGKILL now, as a crash would (for tests of acks_late and reconciliation)."""
        if self.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


@contextmanager
def celery_worker(
    *,
    queues: list[str],
    broker_url: str,
    database_url: str | None = None,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    ready_timeout: float = 60,
    settings_module: str = "portal.settings.test",
):
    """Start `celery -A portal worker -P solo` consuming `queues` and yield a Worker once it is ready.

    The worker runs with eager mode off, against `broker_url` and the test database. Its log is
    printed when the block raises (test failures included), and the worker is always stopped.
    """
    log_file = tempfile.NamedTemporaryFile(prefix="celery-worker-", suffix=".log", delete=False)
    log_path = Path(log_file.name)
    hostname = f"{queues[0]}@%h"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": database_url or current_database_url(),
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "CELERY_BROKER_URL": broker_url,
        "REDIS_URL": broker_url,
        "CELERY_QUEUE": queues[0],
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    command = [
        str(CELERY),
        "-A",
        "portal",
        "worker",
        "-P",
        "solo",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
        "-Q",
        ",".join(queues),
        "-n",
        hostname,
        "--loglevel",
        "INFO",
        *(extra_args or []),
    ]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
    )
    log_file.close()
    worker = Worker(process, log_path, hostname, queues)
    try:
        worker.wait_ready(ready_timeout)
        yield worker
    except BaseException:
        print(f"----- celery worker log ({log_path}) -----\n{worker.log()}\n----- end of worker log -----")
        raise
    finally:
        worker.stop()
        log_path.unlink(missing_ok=True)
        _forget_queues(broker_url, queues)


def _forget_queues(broker_url: str, queues: list[str]) -> None:
    """Remove what kombu left in Redis for these (single-use) queues, so runs do not pile up keys."""
    if not broker_url.startswith("redis://"):
        return
    import redis

    client = redis.Redis.from_url(broker_url, socket_connect_timeout=2)
    try:
        for queue in queues:
            client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    except redis.RedisError:
        pass
    finally:
        client.close()


def _reset_publisher(app) -> None:
    # Celery caches the connection pool and the queue/routing tables built from the configuration;
    # drop them so the next publish reads the configuration again.
    if app._pool is not None:
        app._pool.force_close_all()
    app._pool = None
    app.__dict__.pop("amqp", None)
    # kombu caches pools by URL even once closed; a later publish to the same URL would get
    # "Acquire on closed pool".
    kombu.pools.reset()


@contextmanager
def celery_publishing_to(*, broker_url: str, queue: str, app=None):
    """Make this process publish tasks to `broker_url`/`queue` instead of running them eagerly.

    Restores the previous configuration afterwards. Pair with Django's
    override_settings(CELERY_TASK_ALWAYS_EAGER=False) where code reads the setting directly.
    """
    if app is None:
        from portal.celery import app
    names = ("broker_url", "task_default_queue", "task_always_eager")
    saved = {name: app.conf[name] for name in names}
    app.conf.update(broker_url=broker_url, task_default_queue=queue, task_always_eager=False)
    _reset_publisher(app)
    try:
        yield app
    finally:
        app.conf.update(saved)
        _reset_publisher(app)
