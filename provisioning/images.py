"""Images on GPU hosts: which catalogue images a host has, and jobs that pre-pull or build one there.

A launch should never wait on a multi-gigabyte download or a build, so operators put images onto hosts
ahead of time. The operator's action creates an ImageJob per host (image_jobs_request) and enqueues the
Celery task provisioning.ensure_image, which runs image_job_run: DockerEngine.ensure_image with a
progress callback that keeps the last lines of build or pull output on the job row, where the console
polls them (image_job_status).

Images are a Docker engine's business, so this module always talks to the host through its engine's
housekeeping (provisioning/drivers/docker_engine.py), whatever driver runs the host's instances.
"""

import re
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.audit.services import audit_record
from portal.instances.models import Image
from portal.lib.tasks import publish

from . import services
from .console_calls import host_image_tags
from .drivers.base import DriverError
from .drivers.docker_engine import DockerEngine
from .models import GpuHost, HostImage, ImageJob

# Lines of build or pull output kept on a job, and the longest line kept.
PROGRESS_LINES = 20
PROGRESS_LINE_CHARS = 300
# Seconds between progress writes: a build prints thousands of lines, the page polls about once a second.
PROGRESS_WRITE_SECONDS = 0.5
# A running job whose progress has not moved for this long has lost its worker (killed, or the message
# was lost); a new request for the same host and image replaces it instead of waiting on it forever.
# Generous, because a build step (a large pip install, a layer download) can be silent for minutes.
STALE_AFTER = timedelta(minutes=15)

BUILD_STEP = re.compile(r"^Step (?P<step>\d+)/(?P<steps>\d+)\b")
# The docker driver's summary of a pull (PullProgress): "Pull 42% of <reference>".
PULL_PERCENT = re.compile(r"^Pull (?P<percent>\d+)% of ")


# --- What a host has ------------------------------------------------------------------------------------


@dataclass
class HostImageRow:
    """One enabled catalogue image and whether the host has it."""

    image: Image
    present: bool


@dataclass
class HostImages:
    """The catalogue against a host's engine. `error` is set (and rows empty) when the engine did not answer."""

    rows: list[HostImageRow] = field(default_factory=list)
    # Other tags of the catalogue's repositories on the host: earlier builds, which take disk space.
    unlisted: list[str] = field(default_factory=list)
    error: str = ""


def host_images(host: GpuHost) -> HostImages:
    """Which enabled catalogue images the host has ("present") and which it lacks ("missing"), as the
    provisioning worker reads them from the host's engine (console_calls.host_image_tags).

    Never raises for an engine or a worker that does not answer: the result's `error` says why instead,
    so the host's page still renders.
    """
    try:
        tags = set(host_image_tags(host))
    except services.HostError as error:
        return HostImages(error=error.message)
    catalogue = list(Image.objects.filter(is_enabled=True))
    host_images_record(host=host, references=[image.reference for image in catalogue], present=tags)
    rows = [HostImageRow(image=image, present=image.reference in tags) for image in catalogue]
    named = {image.reference for image in catalogue}
    repositories = {_repository(reference) for reference in named}
    unlisted = sorted(tag for tag in tags if _repository(tag) in repositories and tag not in named)
    return HostImages(rows=rows, unlisted=unlisted)


def host_images_record(*, host: GpuHost, references, present) -> None:
    """Remember which of `references` the host's engine has (those also in `present`), as of now.

    Placement and the launch page read these rows instead of asking every engine on every page.
    """
    now = timezone.now()
    for reference in references:
        HostImage.objects.update_or_create(
            host=host, reference=reference, defaults={"present": reference in present, "checked_at": now}
        )


def _repository(reference: str) -> str:
    # "registry:5000/devcloud/cpu:abc" -> "registry:5000/devcloud/cpu": the tag follows the last path part's colon.
    path, _, last = reference.rpartition("/")
    name = last.split(":", 1)[0]
    return f"{path}/{name}" if path else name


# --- Requesting jobs -------------------------------------------------------------------------------------


def image_jobs_request(*, hosts, image: Image, actor, reason: str = "") -> list[ImageJob]:
    """Ask for `image` to be made present on each of `hosts`. Returns one job per host, in the hosts' order.

    A host that already has a queued or running job for the image gets that job back (no second build
    next to the first); one whose running job went quiet for STALE_AFTER has it marked failed and gets a
    new one. Retired hosts are skipped. Each new job is audited as "host.image" on its host and
    enqueued once the transaction commits; when the task queue cannot be reached the job is marked
    failed at once, saying so.

    Raises ValueError for an image that is switched off (it is not in the catalogue hosts should carry).
    """
    if not image.is_enabled:
        raise ValueError(f"{image.name} is switched off in the catalogue; enable it first.")
    now = timezone.now()
    jobs = []
    with transaction.atomic():
        for host in hosts:
            if host.state == GpuHost.State.RETIRED:
                continue
            # The host's row lock serialises two operators asking for the same image at once.
            GpuHost.objects.select_for_update().get(pk=host.pk)
            active = ImageJob.objects.filter(host=host, image=image, state__in=ImageJob.ACTIVE_STATES).first()
            if active is not None and active.updated_at >= now - STALE_AFTER:
                jobs.append(active)
                continue
            if active is not None:
                _finish(
                    active.pk,
                    state=ImageJob.State.FAILED,
                    from_states=ImageJob.ACTIVE_STATES,
                    error="This job stopped reporting progress (its worker was probably restarted); "
                    "a new job replaced it.",
                )
            job = ImageJob.objects.create(
                host=host, image=image, reference=image.reference, requested_by=actor
            )
            audit_record(
                actor=actor,
                action="host.image",
                target=host,
                reason=reason,
                details={"image": image.key, "reference": image.reference, "job_id": job.pk},
            )
            transaction.on_commit(lambda job=job: _enqueue(job))
            jobs.append(job)
    return jobs


def host_images_prefetch(*, host: GpuHost, actor) -> list[ImageJob]:
    """Put every enabled catalogue image the host lacks onto it: one job per image (pulled from its
    registry, or built there when it has a build context and no registry serves it). Returns the jobs;
    none when the engine did not answer (the host's page says why). Used when a host is added, so its
    first launches do not wait on a download."""
    found = host_images(host)
    if found.error:
        return []
    jobs = []
    for row in found.rows:
        if not row.present:
            jobs += image_jobs_request(
                hosts=[host], image=row.image, actor=actor, reason="A new host gets the catalogue's images."
            )
    return jobs


def _enqueue(job: ImageJob) -> None:
    from .tasks import ensure_image

    # No inline fallback: a build takes minutes and must not run inside the operator's web request.
    if not publish(
        ensure_image, kwargs={"host_id": job.host_id, "image_key": job.image.key, "job_id": job.pk}
    ):
        _finish(
            job.pk,
            state=ImageJob.State.FAILED,
            from_states=[ImageJob.State.QUEUED],
            error="The task queue (Redis) did not answer, so this job never started. Start it again once "
            "the queue is back.",
        )


# --- Running a job (the Celery task) ---------------------------------------------------------------------


class _ProgressWriter:
    """The progress callback: keeps the last PROGRESS_LINES lines and the build step (or a pull's
    percent), written at most every PROGRESS_WRITE_SECONDS (and at every new build step) onto the
    running job."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.lines = deque(maxlen=PROGRESS_LINES)
        self.percent = None
        self.written_at = 0.0

    def __call__(self, text: str) -> None:
        pulled = PULL_PERCENT.match(str(text).strip())
        if pulled:
            # A pull's running total: shown as the job's percent, not as one more line of output.
            self.percent = min(99, int(pulled["percent"]))
        else:
            for line in str(text).splitlines():
                if line.strip():
                    self.lines.append(line[:PROGRESS_LINE_CHARS])
        step = BUILD_STEP.match(str(text).strip())
        if step:
            # Step n of m has just begun: n - 1 are done.
            self.percent = min(99, (int(step["step"]) - 1) * 100 // max(int(step["steps"]), 1))
        if step or time.monotonic() - self.written_at >= PROGRESS_WRITE_SECONDS:
            self.flush()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def flush(self) -> None:
        self.written_at = time.monotonic()
        ImageJob.objects.filter(pk=self.job_id, state=ImageJob.State.RUNNING).update(
            progress_text=self.text, percent=self.percent, updated_at=timezone.now()
        )


def image_job_run(*, job_id: int, host_id: int, image_key: str, resume: bool = False) -> str:
    """Run a queued job: make its image present on its host. Returns the job's final state ("done",
    "failed") or "skipped" when another run has it or it already finished.

    Claims the job with a conditional update queued -> running; with `resume` (a redelivered message:
    the worker that had it died) a running job is taken up again, which is safe because ensure_image
    finds what an earlier run already made. A driver failure fails the job with what happened and what
    the operator can do; nothing is retried, since the operator is watching and one click starts it
    again. Raises nothing for driver failures.
    """
    now = timezone.now()
    claimed = ImageJob.objects.filter(pk=job_id, state=ImageJob.State.QUEUED).update(
        state=ImageJob.State.RUNNING, started_at=now, updated_at=now
    )
    job = ImageJob.objects.select_related("host", "image").filter(pk=job_id).first()
    if job is None:
        return "skipped"
    if not claimed and not (resume and job.state == ImageJob.State.RUNNING):
        return "skipped"
    if job.host_id != host_id or job.image.key != image_key:
        # The arguments name the job's host and image; a mismatch is a bug in whoever enqueued it.
        return _finish(
            job_id,
            state=ImageJob.State.FAILED,
            error=f"This job is for {job.image.key} on host {job.host_id}, but was started for "
            f"{image_key} on host {host_id}. Start it again from the host's page.",
        )
    progress = _ProgressWriter(job_id)
    engine = DockerEngine(job.host)
    try:
        outcome = engine.ensure_image(job.reference, job.image.build_context, progress=progress)
    except DriverError as error:
        return _finish(
            job_id, state=ImageJob.State.FAILED, error=failure_advice(error, job), progress_text=progress.text
        )
    except SoftTimeLimitExceeded:
        minutes = ensure_image_time_limits()[0] // 60
        return _finish(
            job_id,
            state=ImageJob.State.FAILED,
            error=f"Stopped after {minutes} minutes, the longest a job may run (under the task queue's "
            f"visibility timeout). Build it on host {job.host.name} with `bash scripts/build-images.sh "
            f"{job.image.key}`, or raise the visibility timeout.",
            progress_text=progress.text,
        )
    progress(f"{job.reference}: {outcome}")
    host_images_record(host=job.host, references=[job.reference], present={job.reference})
    return _finish(
        job_id, state=ImageJob.State.DONE, outcome=outcome, percent=100, progress_text=progress.text
    )


def _finish(job_id: int, *, state: str, from_states=(ImageJob.State.RUNNING,), **changes) -> str:
    now = timezone.now()
    ImageJob.objects.filter(pk=job_id, state__in=list(from_states)).update(
        state=state, finished_at=now, updated_at=now, **changes
    )
    return state


def failure_advice(error: DriverError, job: ImageJob) -> str:
    """The driver's message, plus what the operator can do about it where the message does not say."""
    message = error.message
    host = job.host.name
    if "cannot be reached" in message:
        return f"{message} Start the job again once {host}'s engine answers."
    if "build-images.sh" in message or "sync_images" in message:
        return message  # the driver already says what to do
    if not error.permanent:
        # The engine answered but could not finish: most often the image's registry is out of its reach.
        return (
            f"{message} Check that the reference in containers/catalog.toml names an image its registry "
            f"serves and that {host} can reach that registry, or load the image onto {host} by hand "
            "(`docker load` there); then start the job again."
        )
    if job.image.build_context:
        return (
            f"{message} Build it on that host with `bash scripts/build-images.sh {job.image.key}` (as root), "
            "then check the host's page again."
        )
    return (
        f"{message} Check the image's reference in containers/catalog.toml (then run `manage.py sync_images`), "
        f"or load the image onto {host} by hand (`docker load` there)."
    )


def ensure_image_time_limits() -> tuple[int, int]:
    """(soft, hard) time limits in seconds of the ensure_image task: within the broker's visibility
    timeout, after which Redis would hand the still-running task to a second worker."""
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)
    return max(visibility - 600, 60), max(visibility - 300, 120)


# --- What the console polls ------------------------------------------------------------------------------


def image_job_status(job: ImageJob, *, now=None) -> dict:
    """A job as the console's progress poll sees it (JSON-serialisable)."""
    now = now or timezone.now()
    stale = job.state == ImageJob.State.RUNNING and job.updated_at < now - STALE_AFTER
    return {
        "id": job.pk,
        "host": job.host.name,
        "host_id": job.host_id,
        "image": job.image.key,
        "image_name": job.image.name,
        "reference": job.reference,
        "state": job.state,
        "state_label": job.get_state_display(),
        "active": job.state in ImageJob.ACTIVE_STATES,
        "outcome": job.outcome,
        "percent": job.percent,
        "progress_text": job.progress_text,
        "error": job.error,
        "stale": stale,
        "note": (
            f"No progress for over {int(STALE_AFTER.total_seconds() // 60)} minutes: its worker may have "
            "stopped. Start the job again to replace it."
            if stale
            else ""
        ),
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
