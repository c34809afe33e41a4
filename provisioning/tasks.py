"""Celery tasks of the fleet: work on GPU hosts that no instance owns (images on hosts, deleted accounts'
workspaces).

The instance lifecycle's tasks (provision, teardown, meter tick, reconcile, start queued, limits, idle
culling) live in portal/instances/tasks.py under their "provisioning." names. Names here are stable too,
arguments are ids, and each task is safe to run twice (acks_late).
"""

from celery import shared_task

from portal.lib.tasks import redelivered

from . import images, workspaces

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
