"""Celery tasks for the instance lifecycle. Each one loads by id, calls portal/instances/lifecycle.py (or
the limits and the idle culler), and returns.

Names are stable and keep their "provisioning." prefix: queued messages and beat schedules outlive
deploys, and the names are what other code and CELERY_BEAT_SCHEDULE use. Arguments are ids as strings,
and every task is safe to run twice (acks_late: a message is acknowledged only after the task ran, and
redelivered if the worker died). Only transient driver errors (the host did not answer) are retried, with
exponential backoff whose longest wait stays far below the broker's visibility timeout, so no ETA
outlives it.

lifecycle.py enqueues some of these (a teardown, the queue after GPUs free up), so the two modules import
each other; both import the module, never a name from it, which Python resolves whichever loads first.
"""

import logging
from dataclasses import asdict

from celery import shared_task
from django.conf import settings

from portal.lib.tasks import MAX_RETRY_DELAY_SECONDS, redelivered, retry_delay  # noqa: F401 -- tests read them
from provisioning.drivers.base import DriverError

from . import culling, lifecycle, limits, logs, reservations

logger = logging.getLogger(__name__)

MAX_RETRIES = 5
# How often a launch a cluster keeps pending is asked about again (each ask waits up to
# provisioning.drivers.slurm.START_WAIT_SECONDS for the job to start, so this is only the gap between).
BACKEND_PENDING_POLL_SECONDS = 5


@shared_task(
    name="provisioning.provision_instance",
    bind=True,
    acks_late=True,
    max_retries=MAX_RETRIES,
    ignore_result=True,
    soft_time_limit=settings.READY_TIMEOUT_SECONDS + 240,
    time_limit=settings.READY_TIMEOUT_SECONDS + 300,
)
def provision_instance(self, instance_id: str, resume: bool = False) -> str:
    try:
        outcome = lifecycle.instance_provision(instance_id=instance_id, resume=resume or redelivered(self))
    except DriverError as error:
        if error.permanent:
            raise
        if self.request.retries >= self.max_retries:
            lifecycle.instance_fail(
                instance_id=instance_id,
                reason=f"The GPU host did not answer ({error.message}). Nothing was charged. "
                "Please launch again in a few minutes.",
            )
            return "failed"
        raise self.retry(
            exc=error,
            countdown=retry_delay(self.request.retries),
            kwargs={"instance_id": instance_id, "resume": True},
        )
    if outcome == "pending" and not self.app.conf.task_always_eager:
        # Still in the cluster's queue: ask again shortly. (Run inline, the caller asks again itself.)
        provision_instance.apply_async(
            kwargs={"instance_id": instance_id, "resume": True}, countdown=BACKEND_PENDING_POLL_SECONDS
        )
    return outcome


@shared_task(
    name="provisioning.teardown_instance",
    bind=True,
    acks_late=True,
    max_retries=MAX_RETRIES,
    ignore_result=True,
)
def teardown_instance(self, instance_id: str, force: bool = False) -> str:
    try:
        return lifecycle.instance_teardown(instance_id=instance_id, force=force)
    except DriverError as error:
        if error.permanent or self.request.retries >= self.max_retries:
            # Billing ended when the stop was asked for; the reconciler finishes the teardown (forced).
            logger.warning("Teardown of %s gave up for now: %s", instance_id, error.message)
            return "deferred"
        raise self.retry(exc=error, countdown=retry_delay(self.request.retries))


@shared_task(name="provisioning.meter_tick", acks_late=True, ignore_result=True)
def meter_tick() -> dict:
    result = lifecycle.meter_tick()
    return {
        "instances_charged": result.instances_charged,
        "gpu_seconds": result.gpu_seconds,
        "stopping": len(result.stopping_ids),
    }


@shared_task(name="provisioning.reconcile", acks_late=True, ignore_result=True)
def reconcile() -> dict:
    return asdict(lifecycle.reconcile())


@shared_task(
    name="provisioning.heartbeat",
    acks_late=True,
    ignore_result=True,
    # Pings are bounded by the heartbeat period (provisioning/health.py); settling a down host's
    # instances is a few short transactions each.
    soft_time_limit=max(settings.HOST_HEARTBEAT_SECONDS * 4, 60),
    time_limit=max(settings.HOST_HEARTBEAT_SECONDS * 4, 60) + 30,
)
def heartbeat() -> dict:
    report = lifecycle.hosts_heartbeat()
    return {
        **asdict(report.heartbeat),
        "stopped": [str(i) for i in report.stopped],
        "requeued": [str(i) for i in report.requeued],
    }


@shared_task(name="provisioning.start_queued", acks_late=True, ignore_result=True)
def start_queued() -> int:
    return lifecycle.start_queued()


@shared_task(name="provisioning.enforce_limits", acks_late=True, ignore_result=True)
def enforce_limits() -> int:
    limits.warn_sessions_ending()
    return len(limits.enforce_max_session_length()) + len(limits.enforce_deadlines())


@shared_task(
    name="provisioning.cull_idle", acks_late=True, ignore_result=True, soft_time_limit=240, time_limit=300
)
def cull_idle() -> dict:
    return asdict(culling.cull_idle())


@shared_task(name="instances.log_read", ignore_result=True, soft_time_limit=30, time_limit=40)
def instance_log_read(instance_id: str, lines: int, reply_to: str) -> dict:
    """Reads an instance's last log lines for a page or the API, which waits on `reply_to`
    (portal/instances/logs.py): the web process has no way to the engines' sockets."""
    return logs.log_reply(instance_id, lines, reply_to)


@shared_task(name="instances.reservations_tick", acks_late=True, ignore_result=True)
def reservations_tick() -> dict:
    return asdict(reservations.reservations_tick())
