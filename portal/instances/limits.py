"""Limits beat enforces on running instances: the longest a session may run at its size.

Runs from the beat task provisioning.enforce_limits (portal/instances/tasks.py). It scans the database each time instead of
scheduling a stop per instance, so a missed tick is caught up by the next, and running it twice stops
and emails nothing twice (a stopped instance is no longer RUNNING, and the email is unique per event).
"""

import logging
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.notifications.services import notify_instance_stopped

from . import services
from .models import Instance, LaunchPolicy
from .sizes import SIZES
from .stop_reasons import StopReason

logger = logging.getLogger(__name__)


def enforce_max_session_length(now: datetime | None = None) -> list[str]:
    """Stop every running instance that has been ready for longer than the launch policy's
    max_session_hours for its size, and email each owner once. Sizes whose limit is 0 run unbounded.

    Returns the ids of the instances this call stopped. Billing ends at the stop (instance_request_stop
    charges up to now); the workspace is kept. Never raises for one instance that ended meanwhile.
    """
    now = now or timezone.now()
    policy = LaunchPolicy.current()
    stopped = []
    for size_key in SIZES:
        max_hours = policy.max_session_hours_for(size_key)
        if not max_hours:
            continue
        overdue = Instance.objects.filter(
            state=Instance.State.RUNNING, size=size_key, ready_at__lte=now - timedelta(hours=max_hours)
        ).values_list("id", flat=True)
        for instance_id in overdue:
            if _stop_overdue(instance_id=instance_id, max_hours=max_hours):
                stopped.append(str(instance_id))
    return stopped


def _stop_overdue(*, instance_id, max_hours: int) -> bool:
    """Stop one instance for running too long and tell its owner. Returns whether this call stopped it."""
    with transaction.atomic():
        try:
            instance = services.instance_request_stop(
                instance_id=instance_id,
                reason=StopReason.MAX_LENGTH,
                message=f"Stopped: it reached the {max_hours}-hour limit for its size.",
            )
        except (Instance.DoesNotExist, ValidationError):
            return False  # it ended on its own since the scan
        # A user or an operator may have asked for the stop first; then it is theirs to explain.
        if instance.stop_reason != StopReason.MAX_LENGTH:
            return False
        notify_instance_stopped(instance=instance, reason=StopReason.MAX_LENGTH, max_hours=max_hours)
    logger.info("Stopped %s after %s hours (its size's limit).", instance_id, max_hours)
    return True
