"""Where the portal records what happened, for the health checks and /metrics.

Celery signals, connected once per process (ConsoleConfig.ready), see every task by its stable name, so
nothing here depends on how the tasks themselves are written:
- each run of a task in CELERY_BEAT_SCHEDULE updates its PeriodicTaskRun row and its duration histogram;
- a launch that ends ready records how long each phase took; one that fails records why;
- the reconciler's report adds to the repair counters;
- an email task that fails counts as a send failure (retried, or given up).
The gateway is wrapped at the ASGI level (InstrumentedGateway) for request latency and open websockets.
"""

import logging
import re
import threading
import time

from celery import signals
from django.db.models import Min
from django.utils import timezone

from . import metrics

logger = logging.getLogger(__name__)

PROVISION = "provisioning.provision_instance"
RECONCILE = "provisioning.reconcile"
EMAIL_TASKS = frozenset({"accounts.send_email", "notifications.send"})

# A failed launch's reason is a sentence for its owner; these phrases tell the kinds apart for counting.
FAILURE_KINDS = (
    ("ready_timeout", "did not answer within"),
    ("container_exited", "before JupyterLab answered"),
    ("host_unreachable", "host did not answer"),
    ("start_refused", "could not start"),
    ("stalled", "took longer than"),
)

_started: dict[str, float] = {}
_started_lock = threading.Lock()


def failure_kind(reason: str) -> str:
    """The label a failure reason is counted under ("other" when no phrase matches)."""
    for kind, phrase in FAILURE_KINDS:
        if phrase in reason:
            return kind
    return "other"


def _beat_tasks() -> dict:
    from . import health

    return health.beat_periods()


def _record_run(task_name: str, **fields) -> None:
    from .models import PeriodicTaskRun

    PeriodicTaskRun.objects.update_or_create(task_name=task_name, defaults=fields)


@signals.task_prerun.connect
def _on_prerun(sender=None, task_id=None, task=None, **kwargs):
    with _started_lock:
        _started[task_id] = time.monotonic()
    name = getattr(task, "name", "")
    if name in _beat_tasks():
        try:
            _record_run(name, last_started_at=timezone.now())
        except Exception:  # noqa: BLE001 - recording health must never break the task
            logger.warning("Could not record the start of %s", name, exc_info=True)


@signals.task_postrun.connect
def _on_postrun(sender=None, task_id=None, task=None, retval=None, state=None, kwargs=None, **extra):
    with _started_lock:
        started = _started.pop(task_id, None)
    duration = time.monotonic() - started if started is not None else None
    name = getattr(task, "name", "")
    try:
        if name in _beat_tasks():
            _after_beat_task(name, state, duration, retval)
        if name == RECONCILE and state == "SUCCESS":
            _count_repairs(retval)
        if name == PROVISION and state == "SUCCESS":
            _after_launch(retval, (kwargs or {}).get("instance_id"))
    except Exception:  # noqa: BLE001
        logger.warning("Could not record the outcome of %s", name, exc_info=True)


def _after_beat_task(name: str, state: str, duration: float | None, retval) -> None:
    now = timezone.now()
    fields = {"last_finished_at": now, "last_duration_seconds": duration}
    if state == "SUCCESS":
        fields.update(last_succeeded_at=now, last_error="")
    elif isinstance(retval, BaseException):
        # The class only: the message can carry hosts and addresses, and the console shows this.
        fields["last_error"] = type(retval).__name__
    if duration is not None:
        metrics.TASK_DURATION.labels(name).observe(duration)
    _record_run(name, **fields)


def _count_repairs(report) -> None:
    if not isinstance(report, dict):
        return
    for field in metrics.RECONCILER_REPAIR_FIELDS:
        count = report.get(field) or 0
        if count:
            metrics.RECONCILER_REPAIRS.labels(field).inc(count)
    if report.get("provisioning_failed"):
        metrics.LAUNCH_FAILURES.labels("stalled").inc(report["provisioning_failed"])


def launch_phases(instance_id) -> dict[str, float]:
    """Seconds a ready instance spent in each launch phase (queued, slot, start, ready, total); a phase
    whose moments were not recorded is left out. `slot` is the wait for a start slot on the engine
    (provisioning/start_slots.py), 0 for a launch that started at once; `start` begins when it ends."""
    from portal.instances.lifecycle import TURN_CAME
    from portal.instances.models import Instance, InstanceEvent
    from provisioning.models import GpuAllocation

    instance = Instance.objects.filter(id=instance_id).values("created_at", "ready_at").first()
    if instance is None or instance["ready_at"] is None:
        return {}
    allocated = GpuAllocation.objects.filter(instance_id=instance_id).aggregate(at=Min("allocated_at"))["at"]
    events = InstanceEvent.objects.filter(instance_id=instance_id)
    waiting = events.filter(step=Instance.Step.WAITING).aggregate(at=Min("created_at"))["at"]
    turn = events.filter(message=TURN_CAME).aggregate(at=Min("created_at"))["at"] or allocated
    moments = [
        ("queued", instance["created_at"], allocated),
        ("slot", allocated, turn),
        ("start", turn, waiting),
    ]
    moments += [
        ("ready", waiting, instance["ready_at"]),
        ("total", instance["created_at"], instance["ready_at"]),
    ]
    return {
        phase: max((end - start).total_seconds(), 0)
        for phase, start, end in moments
        if start is not None and end is not None
    }


def _after_launch(outcome, instance_id) -> None:
    if not instance_id:
        return
    if outcome == "running":
        for phase, seconds in launch_phases(instance_id).items():
            metrics.LAUNCH_DURATION.labels(phase).observe(seconds)
    elif outcome == "failed":
        from portal.instances.models import Instance

        reason = (
            Instance.objects.filter(id=instance_id).values_list("failure_reason", flat=True).first() or ""
        )
        metrics.LAUNCH_FAILURES.labels(failure_kind(reason)).inc()


@signals.task_failure.connect
def _on_failure(sender=None, **kwargs):
    name = getattr(sender, "name", "")
    if name in EMAIL_TASKS:
        metrics.EMAIL_FAILURES.labels(name, "gave_up").inc()
    elif name == PROVISION:
        metrics.LAUNCH_FAILURES.labels("error").inc()


@signals.task_retry.connect
def _on_retry(sender=None, **kwargs):
    name = getattr(sender, "name", "")
    if name in EMAIL_TASKS:
        metrics.EMAIL_FAILURES.labels(name, "retry").inc()


# --- Gateway ---------------------------------------------------------------------------------------------

GATEWAY_ROUTE = re.compile(r"^/instances/[^/]+/(lab|auth|open|redeem)(?:/|$)")


class InstrumentedGateway:
    """Wraps the gateway's ASGI app: times each HTTP request to its response headers, and counts the
    websockets it accepted while they are open. Everything else (handles, aclose) is the gateway's."""

    def __init__(self, gateway):
        self._gateway = gateway

    def __getattr__(self, name):
        return getattr(self._gateway, name)

    async def __call__(self, scope, receive, send):
        match = GATEWAY_ROUTE.match(scope.get("path", ""))
        route = match.group(1) if match else "other"
        if scope["type"] == "websocket":
            accepted = False

            async def counting_send(message):
                nonlocal accepted
                if message["type"] == "websocket.accept" and not accepted:
                    accepted = True
                    metrics.GATEWAY_WEBSOCKETS.inc()
                await send(message)

            try:
                await self._gateway(scope, receive, counting_send)
            finally:
                if accepted:
                    metrics.GATEWAY_WEBSOCKETS.dec()
            return

        started = time.perf_counter()
        observed = False

        async def timing_send(message):
            nonlocal observed
            if not observed and message["type"] == "http.response.start":
                observed = True
                metrics.GATEWAY_LATENCY.labels(route).observe(time.perf_counter() - started)
            await send(message)

        await self._gateway(scope, receive, timing_send)
