"""Limits beat enforces on instances: the longest a session may run at its size (for a project's instance,
the project's own longest run, max_run_seconds, when that is shorter) plus the hours its owner added, with
a warning SESSION_END_WARNING_MINUTES before that end, and a run's own deadline.

Runs from the beat task provisioning.enforce_limits (portal/instances/tasks.py). It scans the database each time instead of
scheduling a stop per instance, so a missed tick is caught up by the next, and running it twice stops
and emails nothing twice (a stopped instance is no longer RUNNING, and the email is unique per event).
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.notifications.services import notify_instance_stopped, notify_session_ending

from . import services, sessions
from .models import Instance, LaunchPolicy
from .stop_reasons import StopReason

logger = logging.getLogger(__name__)


def enforce_max_session_length(now: datetime | None = None) -> list[str]:
    """Stop every running instance that has been ready for longer than its session may run (sessions.
    session_limit: the launch policy's max_session_hours for its size or, for a project's instance, the
    project's max_run_seconds when shorter) plus the hours its owner added, and email each owner once.
    Sizes whose limit is 0 run unbounded unless their project's limit applies.

    Returns the ids of the instances this call stopped. Billing ends at the stop (instance_request_stop
    charges up to now); the workspace is kept. Never raises for one instance that ended meanwhile.
    """
    now = now or timezone.now()
    policy = LaunchPolicy.current()
    stopped = []
    for instance in _running():
        limit = sessions.session_limit(instance, policy)
        end = sessions.session_end(instance, policy)
        if end is None or end > now:
            continue
        max_hours = limit.seconds // 3600 if limit.source == "size" else limit.hours_text
        if _stop_overdue(
            instance_id=instance.id,
            max_hours=max_hours,
            project=limit.source == "project",
            extended_seconds=instance.extended_seconds,
        ):
            stopped.append(str(instance.id))
    return stopped


def warn_sessions_ending(now: datetime | None = None) -> list[str]:
    """Warn the owner of each running instance whose session ends (sessions.session_end) within
    SESSION_END_WARNING_MINUTES, once per end: an extension moves the end, and the new end is warned of
    again. Returns the ids of the instances whose owners this call warned; nothing when the setting is 0.
    """
    minutes = settings.SESSION_END_WARNING_MINUTES
    if not minutes:
        return []
    now = now or timezone.now()
    policy = LaunchPolicy.current()
    warned = []
    for instance in _running():
        end = sessions.session_end(instance, policy)
        if end is None or not now < end <= now + timedelta(minutes=minutes):
            continue
        if notify_session_ending(instance=instance, ends_at=end, now=now) is not None:
            warned.append(str(instance.id))
    return warned


def _running():
    """Every running instance, with what sessions.session_end reads."""
    return Instance.objects.filter(state=Instance.State.RUNNING, ready_at__isnull=False).select_related(
        "project", "user", "image"
    )


def _stop_overdue(*, instance_id, max_hours, project: bool = False, extended_seconds: int = 0) -> bool:
    """Stop one instance for running too long and tell its owner. Returns whether this call stopped it."""
    added = f" and the {extended_seconds / 3600:g} hours added to it" if extended_seconds else ""
    with transaction.atomic():
        try:
            instance = services.instance_request_stop(
                instance_id=instance_id,
                reason=StopReason.MAX_LENGTH,
                message=f"Stopped: it reached the {max_hours}-hour limit for "
                + ("its project" if project else "its size")
                + f"{added}.",
            )
        except (Instance.DoesNotExist, ValidationError):
            return False  # it ended on its own since the scan
        # A user or an operator may have asked for the stop first; then it is theirs to explain.
        if instance.stop_reason != StopReason.MAX_LENGTH:
            return False
        notify_instance_stopped(instance=instance, reason=StopReason.MAX_LENGTH, max_hours=max_hours)
    logger.info(
        "Stopped %s after %s hours (its %s's limit).", instance_id, max_hours, "project" if project else "size"
    )
    return True


def enforce_deadlines(now: datetime | None = None) -> list[str]:
    """Stop every live instance whose launch set a deadline (Instance.deadline_at, from `devcloud run
    --timeout` or the API's stop_after_seconds) that has passed, queued and still-starting ones included.

    This is what stops a run whose client is gone (a CI job killed with SIGKILL, a runner that vanished).
    No email: the client that set the deadline reports it, and the instance's page and timeline say why.
    Returns the ids of the instances this call stopped.
    """
    now = now or timezone.now()
    overdue = Instance.objects.filter(
        deadline_at__lte=now,
        state__in=[Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING],
    ).values_list("id", flat=True)
    stopped = []
    for instance_id in overdue:
        with transaction.atomic():
            try:
                instance = services.instance_request_stop(
                    instance_id=instance_id,
                    reason=StopReason.DEADLINE,
                    message="Stopped: it reached the time limit its launch set.",
                )
            except (Instance.DoesNotExist, ValidationError):
                continue  # it ended on its own since the scan
        if instance.stop_reason == StopReason.DEADLINE:
            stopped.append(str(instance_id))
            logger.info("Stopped %s at the deadline its launch set.", instance_id)
    return stopped
