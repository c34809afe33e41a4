"""Health checks: is this web process ready to serve, do the Celery workers answer, does beat run.

Each check answers a short, fixed sentence and never an exception's text: connection errors name
hosts, users and sometimes passwords, and /readyz is public.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

logger = logging.getLogger(__name__)

# How long a health check may wait for PostgreSQL, Redis or a worker's answer.
CHECK_TIMEOUT_SECONDS = 1.0
# Beat tasks whose lateness means launches, billing or the fleet are no longer looked after.
METER_TICK = "provisioning.meter_tick"
RECONCILE = "provisioning.reconcile"
# The worker answers are cached this long, so a dashboard reload does not wait on a broadcast each time.
WORKER_ANSWER_CACHE_SECONDS = 15


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def database_check() -> Check:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as error:  # noqa: BLE001 - any failure means "not ready"; the log has the details
        logger.warning("readiness: the database did not answer: %r", error)
        return Check("database", False, "PostgreSQL did not answer")
    return Check("database", True, "PostgreSQL answers")


def redis_check() -> Check:
    client = redis.Redis.from_url(
        settings.CELERY_BROKER_URL,
        socket_connect_timeout=CHECK_TIMEOUT_SECONDS,
        socket_timeout=CHECK_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    except (redis.RedisError, OSError, ValueError) as error:
        logger.warning("readiness: Redis did not answer: %r", error)
        return Check("redis", False, "Redis (the task broker) did not answer")
    finally:
        client.close()
    return Check("redis", True, "Redis answers")


_migrations_applied = False


def migrations_check() -> Check:
    """Whether every migration this code has is applied. Once true it stays true for the process: new
    migrations arrive only with new code, which means a restart."""
    global _migrations_applied
    if not _migrations_applied:
        try:
            executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
            pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except Exception as error:  # noqa: BLE001
            logger.warning("readiness: could not read the migration state: %r", error)
            return Check("migrations", False, "the migration state could not be read")
        if pending:
            return Check(
                "migrations", False, f"{len(pending)} migrations are not applied (run manage.py migrate)"
            )
        _migrations_applied = True
    return Check("migrations", True, "all migrations are applied")


def readiness() -> list[Check]:
    """The web process's readiness: PostgreSQL and Redis answer, and the migrations are applied."""
    database = database_check()
    checks = [database, redis_check()]
    if database.ok:
        checks.append(migrations_check())
    else:
        checks.append(Check("migrations", False, "not checked: the database did not answer"))
    return checks


# --- Workers ---------------------------------------------------------------------------------------------


def expected_queues() -> dict[str, str]:
    """Queue name -> what it carries, for every queue a worker must consume (portal/workers.py)."""
    queues = {settings.CELERY_TASK_DEFAULT_QUEUE: "metering, stops, emails"}
    if settings.CELERY_PROVISIONING_QUEUE:
        queues[settings.CELERY_PROVISIONING_QUEUE] = "launches"
    else:
        queues[settings.CELERY_TASK_DEFAULT_QUEUE] = "launches, metering, stops, emails"
    return queues


def _consumers_by_queue(timeout: float) -> dict[str, list[str]]:
    """Queue name -> names of the workers that answered a broadcast and consume it."""
    from portal.celery import app

    answers = app.control.inspect(timeout=timeout).active_queues() or {}
    consumers: dict[str, list[str]] = {}
    for worker, queues in answers.items():
        for queue in queues or []:
            consumers.setdefault(queue.get("name", ""), []).append(worker)
    return consumers


def worker_consumers(*, use_cache: bool = True) -> dict[str, list[str]] | None:
    """Queue name -> the workers consuming it that answered a ping within CHECK_TIMEOUT_SECONDS, or None
    when the broker could not be reached. Cached for WORKER_ANSWER_CACHE_SECONDS."""
    cache_key = "console:health:workers"
    consumers = cache.get(cache_key) if use_cache else None
    if consumers is None:
        try:
            consumers = _consumers_by_queue(CHECK_TIMEOUT_SECONDS)
        except Exception as error:  # noqa: BLE001 - the broker being down is itself the answer
            logger.warning("health: could not ping the workers: %r", error)
            return None
        cache.set(cache_key, consumers, WORKER_ANSWER_CACHE_SECONDS)
    return consumers


def worker_checks(*, use_cache: bool = True) -> list[Check]:
    """One check per expected queue: does a worker consuming it answer a ping?"""
    consumers = worker_consumers(use_cache=use_cache)
    checks = []
    for queue, what in expected_queues().items():
        names = (consumers or {}).get(queue, [])
        if consumers is None:
            checks.append(Check(f"worker:{queue}", False, f"no answer: the broker is unreachable ({what})"))
        elif names:
            checks.append(Check(f"worker:{queue}", True, f"{', '.join(sorted(names))} answered ({what})"))
        else:
            checks.append(Check(f"worker:{queue}", False, f"no worker on queue {queue} answered ({what})"))
    return checks


# --- Beat ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicStatus:
    task_name: str
    period_seconds: float | None
    last_succeeded_at: datetime | None
    last_error: str
    # Whether its lateness should page someone: the meter tick, the reconciler, the host heartbeat.
    required: bool
    ok: bool

    @property
    def check(self) -> Check:
        if self.last_succeeded_at is None:
            detail = "has not run yet"
        else:
            detail = f"last ran {timesince_short(timezone.now() - self.last_succeeded_at)} ago"
        if self.period_seconds:
            detail += f" (every {int(self.period_seconds)} s)"
        if self.last_error:
            detail += f"; its last run failed with {self.last_error}"
        return Check(f"beat:{self.task_name}", self.ok, detail)


def timesince_short(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def beat_periods() -> dict[str, float | None]:
    """Task name -> seconds between runs, for every task in CELERY_BEAT_SCHEDULE (None: not a fixed interval)."""
    periods: dict[str, float | None] = {}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        schedule = entry.get("schedule")
        if isinstance(schedule, (int, float)):
            seconds = float(schedule)
        elif isinstance(schedule, timedelta):
            seconds = schedule.total_seconds()
        else:
            seconds = getattr(getattr(schedule, "run_every", None), "total_seconds", lambda: None)()
        periods[entry["task"]] = seconds
    return periods


def is_required(task_name: str) -> bool:
    return task_name in (METER_TICK, RECONCILE) or "heartbeat" in task_name


def periodic_statuses(*, now: datetime | None = None) -> list[PeriodicStatus]:
    """Every beat task with when it last ran well; ok when that was within two of its periods.

    The meter tick, the reconciler and any host heartbeat task come first, marked required.
    """
    from .models import PeriodicTaskRun

    now = now or timezone.now()
    runs = {run.task_name: run for run in PeriodicTaskRun.objects.all()}
    statuses = []
    for task_name, period in beat_periods().items():
        run = runs.get(task_name)
        succeeded = run.last_succeeded_at if run else None
        ok = succeeded is not None and (period is None or (now - succeeded).total_seconds() <= 2 * period)
        statuses.append(
            PeriodicStatus(
                task_name=task_name,
                period_seconds=period,
                last_succeeded_at=succeeded,
                last_error=run.last_error if run else "",
                required=is_required(task_name),
                ok=ok,
            )
        )
    statuses.sort(key=lambda status: (not status.required, status.task_name))
    return statuses


@dataclass(frozen=True)
class Background:
    workers: list[Check]
    beat: list[PeriodicStatus]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.workers) and all(s.ok for s in self.beat if s.required)

    @property
    def heartbeat_scheduled(self) -> bool:
        return any("heartbeat" in status.task_name for status in self.beat)


def background() -> Background:
    """The workers' and beat's state, for the console."""
    return Background(workers=worker_checks(), beat=periodic_statuses())
