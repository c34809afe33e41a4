"""Celery tasks of the fleet: work on GPU hosts that no instance owns (images on hosts, deleted accounts'
workspaces), and the console's engine calls, which a page waits for (console_calls.py).

The instance lifecycle's tasks (provision, teardown, meter tick, reconcile, start queued, limits, idle
culling) live in portal/instances/tasks.py under their "provisioning." names. Names here are stable too,
arguments are ids, and each task is safe to run twice (acks_late).
"""

from celery import shared_task

from portal.lib.tasks import redelivered
from portal.lib.worker_calls import reply

from . import console_calls, images, workspaces

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
    return images.image_job_run(job_id=job_id, host_id=host_id, image_key=image_key, resume=redelivered(self))


@shared_task(name="provisioning.remove_workspaces", acks_late=True, ignore_result=True)
def remove_workspaces(user_id: int | None = None) -> dict:
    # Deleted accounts' workspace volumes (one account when asked by the deletion, every pending one on
    # beat); hosts that do not answer keep their WorkspaceRemoval rows for the next run.
    return workspaces.workspace_removals_run(user_id=user_id)


# The console's engine calls: the last argument names the Redis list the waiting page reads (reply_to).
# Not retried and not acks_late: the page waits seconds, and an operator asks again.


@shared_task(name="provisioning.console_engine_ping", ignore_result=True)
def console_engine_ping(engine: dict, reply_to: str) -> dict:
    return reply(reply_to, console_calls.engine_ping_answer(engine))


@shared_task(name="provisioning.console_host_check", ignore_result=True)
def console_host_check(host_id: int, reply_to: str) -> dict:
    return reply(reply_to, console_calls.host_check_answer(host_id))


@shared_task(name="provisioning.console_host_discover", ignore_result=True)
def console_host_discover(host_id: int, reply_to: str) -> dict:
    return reply(reply_to, console_calls.host_discover_answer(host_id))


@shared_task(name="provisioning.console_host_images", ignore_result=True)
def console_host_images(host_id: int, reply_to: str) -> dict:
    return reply(reply_to, console_calls.host_image_tags_answer(host_id))
