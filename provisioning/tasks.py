"""Celery tasks for instances. Each one loads by id, calls provisioning.lifecycle, and returns.

Names are stable (queued messages outlive deploys), arguments are ids as strings, and every task is
safe to run twice (acks_late: a message is acknowledged only after the task ran, and redelivered if
the worker died). Only transient driver errors (the host did not answer) are retried, with exponential
backoff whose longest wait stays far below the broker's visibility timeout, so no ETA outlives it.
"""

import logging
import random
from dataclasses import asdict

from celery import shared_task
from django.conf import settings

from . import images, lifecycle, limits
from .drivers.base import DriverError

logger = logging.getLogger(__name__)

MAX_RETRIES = 5
# Waits between retries: 2, 4, 8, 16, 32 s plus jitter; never more than this.
MAX_RETRY_DELAY_SECONDS = 120


def retry_delay(retries: int) -> float:
    """Seconds to wait before retry number `retries + 1`: exponential, jittered, and capped well under the
    broker visibility timeout (a longer ETA would make Redis hand the message to a second worker)."""
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)
    cap = min(MAX_RETRY_DELAY_SECONDS, visibility // 4)
    return min(2 ** (retries + 1), cap) + random.uniform(0, 1)


def _redelivered(task) -> bool:
    # Redis marks a message it restores after a lost worker; the run it replaces may have got halfway.
    return bool((task.request.delivery_info or {}).get("redelivered"))


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
        return lifecycle.instance_provision(instance_id=instance_id, resume=resume or _redelivered(self))
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


@shared_task(name="provisioning.start_queued", acks_late=True, ignore_result=True)
def start_queued() -> int:
    return lifecycle.start_queued()


BY_NAME = {
    task.name: task for task in (provision_instance, teardown_instance, meter_tick, reconcile, start_queued)
}


_IMAGE_SOFT_LIMIT, _IMAGE_HARD_LIMIT = images.ensure_image_time_limits()


@shared_task(
    name="provisioning.ensure_image",
    bind=True,
    acks_late=True,
    ignore_result=True,
    # Builds and pulls take minutes, far beyond the default limits, but must end before the broker's
    # visibility timeout hands the message to a second worker.
    soft_time_limit=_IMAGE_SOFT_LIMIT,
    time_limit=_IMAGE_HARD_LIMIT,
)
def ensure_image(self, host_id: int, image_key: str, job_id: int) -> str:
    # Not retried: the operator watches the job, and its failure says what to do before starting it again.
    return images.image_job_run(job_id=job_id, host_id=host_id, image_key=image_key, resume=_redelivered(self))


BY_NAME[ensure_image.name] = ensure_image


@shared_task(name="provisioning.enforce_limits", acks_late=True, ignore_result=True)
def enforce_limits() -> int:
    return len(limits.enforce_max_session_length())


BY_NAME[enforce_limits.name] = enforce_limits


@shared_task(
    name="provisioning.cull_idle", acks_late=True, ignore_result=True, soft_time_limit=240, time_limit=300
)
def cull_idle() -> dict:
    from . import culling

    return asdict(culling.cull_idle())


BY_NAME[cull_idle.name] = cull_idle
