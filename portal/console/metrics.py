"""Prometheus metrics (prometheus_client), served at /metrics by portal.console.probes.

Two kinds, because the portal is several processes (uvicorn workers, two Celery workers, beat):

- Events (launch durations and failures, beat task durations, reconciler repairs, gateway latency and
  open websockets, email send failures) are counters, histograms and a live-summed gauge recorded where
  they happen. With PROMETHEUS_MULTIPROC_DIR set (deploy/devcloud.env does), prometheus_client's
  multiprocess mode keeps each process's values in a file there and /metrics adds them up, so any web
  process answers for all of them, Celery workers included.
- State (GPUs, instances, the launch and broker queues, credits, host heartbeats, when beat tasks last
  ran) is read from PostgreSQL and Redis at scrape time. The database is the truth and the same for
  every process; a gauge kept in process memory would be stale or differ per process.
"""

import glob
import logging
import os
import time

from django.conf import settings
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY

logger = logging.getLogger(__name__)


def _multiprocess_directory_ready() -> bool:
    """Make PROMETHEUS_MULTIPROC_DIR if it is set but missing (deploy/tmpfiles.d makes it at boot; a
    manage.py command run before that must not crash on import). Returns False when it is set and cannot
    be used: this process then counts in memory only, and says so."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return True
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK):
            raise PermissionError(f"{directory} is not writable by this user")
    except OSError as error:
        # E.g. a manage.py command run as another user than the services.
        logger.warning(
            "metrics: cannot use PROMETHEUS_MULTIPROC_DIR (%s); counting in this process only", error
        )
        values.ValueClass = values.MutexValue
        return False
    return True


# True when PROMETHEUS_MULTIPROC_DIR is set but unusable: /metrics then shows this process's events only.
_in_process_only = not _multiprocess_directory_ready()

LAUNCH_BUCKETS = (0.5, 1, 2, 3, 5, 8, 13, 20, 30, 45, 60, 90, 120, 180, 300, 600)
TASK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
GATEWAY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

LAUNCH_DURATION = Histogram(
    "devcloud_launch_duration_seconds",
    "Seconds a launch that became ready spent in each phase: queued (request to GPUs), slot (waiting for a "
    "start slot on the engine; 0 when there was one free), start (to container started), ready (container "
    "started to JupyterLab answering) and total.",
    ["phase"],
    buckets=LAUNCH_BUCKETS,
)
LAUNCH_FAILURES = Counter("devcloud_launch_failures_total", "Launches that failed, by reason.", ["reason"])
TASK_DURATION = Histogram(
    "devcloud_periodic_task_duration_seconds",
    "Seconds each run of a beat task took (the meter tick is task=provisioning.meter_tick).",
    ["task"],
    buckets=TASK_BUCKETS,
)
RECONCILER_REPAIRS = Counter(
    "devcloud_reconciler_repairs_total", "What the reconciler repaired, by kind of repair.", ["repair"]
)
GATEWAY_LATENCY = Histogram(
    "devcloud_gateway_request_duration_seconds",
    "Seconds from a gateway request's arrival to its response headers, by route.",
    ["route"],
    buckets=GATEWAY_BUCKETS,
)
GATEWAY_WEBSOCKETS = Gauge(
    "devcloud_gateway_open_websockets",
    "JupyterLab websockets open through the gateway.",
    multiprocess_mode="livesum",
)
EMAIL_FAILURES = Counter(
    "devcloud_email_send_failures_total",
    "Email sends that failed: outcome=retry (tried again later) or gave_up.",
    ["task", "outcome"],
)

# The reconciler reports what it checked as well as what it repaired; these are repairs.
RECONCILER_REPAIR_FIELDS = (
    "orphans_removed",
    "vanished_failed",
    "allocations_freed",
    "provisioning_resumed",
    "provisioning_failed",
    "teardowns_enqueued",
)


class StateCollector:
    """Reads the fleet, queues, credits and beat state at scrape time (see the module docstring)."""

    def collect(self):
        from portal.credits.models import GPU_SECONDS_PER_HOUR, LedgerEntry
        from portal.instances.models import Instance
        from provisioning.models import GpuHost

        from . import health
        from .models import PeriodicTaskRun

        now = timezone.now()

        gpus = GaugeMetricFamily(
            "devcloud_gpus", "Present GPUs, by host and host state.", labels=["host", "host_state"]
        )
        allocated = GaugeMetricFamily(
            "devcloud_gpus_allocated",
            "GPUs held by a live instance, by host and host state.",
            labels=["host", "host_state"],
        )
        hosts = GpuHost.objects.annotate(
            present=Count("gpus", filter=Q(gpus__is_present=True), distinct=True),
            held=Count(
                "gpus__allocations",
                filter=Q(gpus__allocations__released_at__isnull=True, gpus__is_present=True),
                distinct=True,
            ),
        ).values_list("name", "state", "present", "held", "last_seen_at")
        heartbeat = GaugeMetricFamily(
            "devcloud_host_heartbeat_age_seconds",
            "Seconds since each host last answered (GpuHost.last_seen_at); absent for a host never seen.",
            labels=["host", "host_state"],
        )
        hosts_by_state = {state: 0 for state in GpuHost.State.values}
        for name, state, present, held, last_seen_at in hosts:
            gpus.add_metric([name, state], present)
            allocated.add_metric([name, state], held)
            hosts_by_state[state] = hosts_by_state.get(state, 0) + 1
            if last_seen_at is not None:
                heartbeat.add_metric([name, state], max((now - last_seen_at).total_seconds(), 0))
        yield gpus
        yield allocated
        yield heartbeat
        host_states = GaugeMetricFamily("devcloud_hosts", "GPU hosts, by state.", labels=["state"])
        for state, count in hosts_by_state.items():
            host_states.add_metric([state], count)
        yield host_states

        instances = GaugeMetricFamily("devcloud_instances", "Instances, by state.", labels=["state"])
        counts = dict(Instance.objects.order_by().values_list("state").annotate(n=Count("id")))
        for state in Instance.State.values:
            instances.add_metric([state], counts.get(state, 0))
        yield instances

        queue = Instance.objects.filter(state=Instance.State.QUEUED).aggregate(oldest=Min("created_at"))
        yield GaugeMetricFamily(
            "devcloud_launch_queue_length",
            "Launches waiting for GPUs.",
            value=counts.get(Instance.State.QUEUED, 0),
        )
        oldest = (now - queue["oldest"]).total_seconds() if queue["oldest"] else 0
        yield GaugeMetricFamily(
            "devcloud_launch_queue_oldest_wait_seconds",
            "How long the oldest queued launch has waited.",
            value=max(oldest, 0),
        )

        running = Instance.objects.filter(
            state=Instance.State.RUNNING, metered_until__isnull=False
        ).aggregate(oldest=Min("metered_until"))
        lag = (now - running["oldest"]).total_seconds() if running["oldest"] else 0
        yield GaugeMetricFamily(
            "devcloud_meter_lag_seconds",
            "How far behind billing is: seconds since the least recently charged running instance was charged.",
            value=max(lag, 0),
        )

        totals = LedgerEntry.objects.aggregate(
            granted=Sum("gpu_seconds", filter=Q(kind__in=[LedgerEntry.Kind.GRANT, LedgerEntry.Kind.BONUS])),
            burned=Sum("gpu_seconds", filter=Q(kind=LedgerEntry.Kind.USAGE)),
        )
        yield CounterMetricFamily(
            "devcloud_credits_granted_gpu_hours",
            "GPU-hours granted (sign-up grants, operator grants, bonuses), from the ledger.",
            value=(totals["granted"] or 0) / GPU_SECONDS_PER_HOUR,
        )
        yield CounterMetricFamily(
            "devcloud_credits_burned_gpu_hours",
            "GPU-hours burned by running instances, from the ledger.",
            value=-(totals["burned"] or 0) / GPU_SECONDS_PER_HOUR,
        )

        periods = health.beat_periods()
        runs = {run.task_name: run for run in PeriodicTaskRun.objects.all()}
        last = GaugeMetricFamily(
            "devcloud_periodic_task_last_success_timestamp_seconds",
            "Unix time a beat task last finished without error (0: never).",
            labels=["task"],
        )
        period = GaugeMetricFamily(
            "devcloud_periodic_task_period_seconds", "Seconds between runs of a beat task.", labels=["task"]
        )
        for task_name, seconds in periods.items():
            run = runs.get(task_name)
            succeeded = run.last_succeeded_at if run else None
            last.add_metric([task_name], succeeded.timestamp() if succeeded else 0)
            if seconds:
                period.add_metric([task_name], seconds)
        yield last
        yield period

        yield from self._broker()
        yield from self._gpu_health()

    def _gpu_health(self):
        """Drained GPUs per host and each GPU's RAS error counts at its last reading (provisioning/gpu_health.py)."""
        from provisioning.models import Gpu

        drained = GaugeMetricFamily(
            "devcloud_gpus_drained",
            "GPUs drained by their health check (no new placements until an operator returns them), by host.",
            labels=["host"],
        )
        errors = GaugeMetricFamily(
            "devcloud_gpu_ras_errors",
            "RAS error counts of each GPU at its last health reading (sums of amdgpu's ras/*_err_count), by "
            "host, GPU and kind (uncorrectable, correctable).",
            labels=["host", "gpu", "kind"],
        )
        per_host = {}
        rows = Gpu.objects.filter(is_present=True).values_list(
            "host__name", "render_minor", "is_drained", "ras_uncorrectable", "ras_correctable"
        )
        for host, minor, is_drained, uncorrectable, correctable in rows:
            per_host[host] = per_host.get(host, 0) + int(is_drained)
            if uncorrectable is not None:
                errors.add_metric([host, f"renderD{minor}", "uncorrectable"], uncorrectable)
                errors.add_metric([host, f"renderD{minor}", "correctable"], correctable or 0)
        for host, count in sorted(per_host.items()):
            drained.add_metric([host], count)
        yield drained
        yield errors

    def _broker(self):
        import redis

        from . import health

        length = GaugeMetricFamily(
            "devcloud_celery_queue_length", "Tasks waiting in each Celery queue (Redis).", labels=["queue"]
        )
        up = GaugeMetricFamily(
            "devcloud_celery_workers",
            "Celery workers that answered a ping, by the queue they consume.",
            labels=["queue"],
        )
        client = redis.Redis.from_url(
            settings.CELERY_BROKER_URL,
            socket_connect_timeout=health.CHECK_TIMEOUT_SECONDS,
            socket_timeout=health.CHECK_TIMEOUT_SECONDS,
        )
        try:
            for queue in health.expected_queues():
                length.add_metric([queue], client.llen(queue))
        except (redis.RedisError, OSError) as error:
            logger.warning("metrics: Redis did not answer: %r", error)
        finally:
            client.close()
        yield length
        consumers = health.worker_consumers() or {}
        for queue in health.expected_queues():
            up.add_metric([queue], len(consumers.get(queue, [])))
        yield up


def forget_dead_processes(directory: str) -> None:
    """Drop the live-summed gauges (open websockets) of processes that are gone, e.g. a uvicorn worker
    that crashed with sockets open; counters and histograms of dead processes stay, as they should."""
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        try:
            pid = int(os.path.basename(path).rsplit("_", 1)[1].removesuffix(".db"))
            os.kill(pid, 0)
        except ProcessLookupError:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, directory)
        except (ValueError, PermissionError):
            continue


def exposition() -> bytes:
    """The text exposition of every metric: events from every process (multiprocess mode) or from this
    one, then the state read now."""
    started = time.monotonic()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and not _in_process_only:
        from prometheus_client import multiprocess

        forget_dead_processes(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        events = CollectorRegistry()
        multiprocess.MultiProcessCollector(events)
    else:
        events = REGISTRY
    state = CollectorRegistry()
    state.register(StateCollector())
    body = generate_latest(events) + generate_latest(state)
    took = time.monotonic() - started
    return (
        body
        + (
            "# HELP devcloud_scrape_duration_seconds Seconds this scrape took to build.\n"
            "# TYPE devcloud_scrape_duration_seconds gauge\n"
            f"devcloud_scrape_duration_seconds {took:.6f}\n"
        ).encode()
    )
