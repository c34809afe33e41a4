"""When a running instance's session ends: the longest it may run from ready (the launch policy's
max_session_hours for its size or, for a project's instance, the project's max_run_seconds when that is
shorter) plus the hours its owner added (Instance.extended_seconds).

The limits beat stops at this end (limits.enforce_max_session_length) and warns before it; the API, the
instance page and `devcloud ls` show it. Reads only; nothing here writes.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from .models import Instance, LaunchPolicy


@dataclass(frozen=True)
class SessionLimit:
    seconds: int
    # "size" or "project": whose limit it is, for the owner's message.
    source: str

    @property
    def hours_text(self) -> str:
        """The limit in hours for people: '12', '1.5'."""
        return f"{self.seconds / 3600:g}"


def session_limit(instance: Instance, policy: LaunchPolicy) -> SessionLimit | None:
    """The shorter of the size's and the project's longest session for `instance` (the size's on a tie),
    extensions not included; None when neither applies. Reads instance.project for a project instance."""
    limits = []
    size_hours = policy.max_session_hours_for(instance.size)
    if size_hours:
        limits.append(SessionLimit(size_hours * 3600, "size"))
    if instance.project_id is not None:
        limits.append(SessionLimit(instance.project.max_run_seconds, "project"))
    return min(limits, key=lambda limit: limit.seconds) if limits else None


def session_end(instance: Instance, policy: LaunchPolicy) -> datetime | None:
    """When the limits beat stops `instance` for the length of its session, extensions included: None
    when it is not running (nor ready) or no limit applies. Not the launch's own deadline_at."""
    if instance.state != Instance.State.RUNNING or instance.ready_at is None:
        return None
    limit = session_limit(instance, policy)
    if limit is None:
        return None
    return instance.ready_at + timedelta(seconds=limit.seconds + instance.extended_seconds)


def stops_at(instance: Instance, policy: LaunchPolicy) -> datetime | None:
    """When the limits beat will stop `instance`: the earlier of its session's end and the deadline its
    launch set (deadline_at), or None when neither will."""
    ends = [end for end in (session_end(instance, policy), instance.deadline_at) if end is not None]
    if instance.state not in Instance.LIVE_STATES or instance.state == Instance.State.STOPPING:
        return None
    return min(ends) if ends else None


def runs_until(
    instance: Instance, policy: LaunchPolicy, now: datetime, *, ready_within: int = 0
) -> datetime | None:
    """The latest `instance` may still be running, for placing it clear of booked windows: the earlier of
    its launch's deadline and its session's end with the hours already added (for one not yet ready,
    counted from `ready_within` seconds after `now`, the longest a start may take). None: nothing stops
    it. Extensions past this are refused where they would reach a booked window (reservations.py)."""
    ends = [instance.deadline_at] if instance.deadline_at is not None else []
    limit = session_limit(instance, policy)
    if limit is not None:
        ready_at = instance.ready_at or now + timedelta(seconds=ready_within)
        ends.append(ready_at + timedelta(seconds=limit.seconds + instance.extended_seconds))
    return min(ends) if ends else None
