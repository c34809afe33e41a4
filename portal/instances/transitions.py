"""Every change of Instance.state, in one place.

The state machine (docs/architecture.md, "The instance state machine"):

    queued -> provisioning -> running -> stopping -> stopped
      |  ^          |            |
      |  +----------+ (requeue)  +--> failed (the container vanished)
      +--> stopped (stopped before it started)
      +-----------------+--> failed (never got ready)

Each function here is a conditional UPDATE: it moves the row only if it is still in a state the move
starts from, and returns whether it moved. A duplicate or late caller (a redelivered task, the reconciler,
a second worker) finds the row already moved on and gets False, so no move happens twice and none goes
backwards. Every move sets state_changed_at (the reconciler's clock for stuck transitions) and adds a line
to the instance's timeline, in one transaction with the move: whoever reads the new state (the instance
page, the API) also reads the line that says why. Inside a caller's transaction they join it (no
savepoint).

Nothing here charges credit, talks to a driver or enqueues a task: the callers do (portal.instances.services
for the web side, portal.instances.lifecycle for the worker side, portal.credits.metering for credits
running out). Stops that end billing charge first, under the owner's CreditAccount lock, then call
stop() or bulk_stop() in the same transaction.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from .models import Instance, InstanceEvent
from .stop_reasons import STOP_NOTE_MAX, StopReason

State = Instance.State
Step = Instance.Step

# States a stop applies to: the rest have ended already, or are ending (stopping).
STOPPABLE_STATES = (State.QUEUED, State.PROVISIONING, State.RUNNING)
# What a launch that never got ready can fail from; a running instance fails only when its container vanishes.
LAUNCH_STATES = (State.QUEUED, State.PROVISIONING)


def event_record(*, instance: Instance, message: str, state: str | None = None, step: str | None = None):
    """Add a line to the instance's timeline. Returns the InstanceEvent."""
    return InstanceEvent.objects.create(
        instance_id=instance.pk, state=state or instance.state, step=step or instance.step, message=message
    )


def _move(instance_id, *, from_states, **changes) -> bool:
    if "state" in changes:
        changes.setdefault("state_changed_at", timezone.now())
    return bool(Instance.objects.filter(id=instance_id, state__in=list(from_states)).update(**changes))


# --- launch ----------------------------------------------------------------------------------------------


@transaction.atomic(savepoint=False)
def queue(*, message: str, **fields) -> Instance:
    """A new instance, born queued. Returns it. The caller (services.instance_launch) has checked the
    launch and holds the owner's CreditAccount lock."""
    instance = Instance.objects.create(state=State.QUEUED, step=Step.QUEUED, **fields)
    event_record(instance=instance, message=message)
    return instance



def claim(instance_id, *, now: datetime) -> bool:
    """queued -> provisioning: one worker takes the launch. Returns whether this call claimed it."""
    return _move(
        instance_id,
        from_states=[State.QUEUED],
        state=State.PROVISIONING,
        step=Step.ALLOCATING,
        provisioning_at=now,
    )


@transaction.atomic(savepoint=False)
def step(instance: Instance, step: str, message: str) -> bool:
    """Record progress within provisioning (no state change). Returns False when the instance is no longer
    provisioning (stopped or failed meanwhile)."""
    if not Instance.objects.filter(id=instance.id, state=State.PROVISIONING).update(step=step):
        return False
    instance.step = step
    event_record(instance=instance, message=message, state=State.PROVISIONING, step=step)
    return True


def keep_driver_state(instance_id, driver_state: dict) -> bool:
    """Store what the driver returned from start, while the instance is still provisioning. Returns False
    when it was stopped meanwhile (the caller removes the container)."""
    return bool(
        Instance.objects.filter(id=instance_id, state=State.PROVISIONING).update(driver_state=driver_state)
    )


def requeue(instance: Instance) -> bool:
    """provisioning -> queued: no GPUs for it yet. provisioning_at stays set, which marks it as waiting
    for GPUs (scheduler.next_queued serves those first). Returns whether it moved; the caller records
    the timeline line, which names the queue position only known after the move."""
    if not _move(instance.id, from_states=[State.PROVISIONING], state=State.QUEUED, step=Step.QUEUED):
        return False
    instance.refresh_from_db()
    return True


@transaction.atomic(savepoint=False)
def backend_pending(instance: Instance, *, reason: str) -> bool:
    """provisioning -> provisioning: the backend holds the launch in its own queue (a pending Slurm job).
    Restarts the stuck-transition clock, and puts `reason` on the timeline when it differs from the last
    line there. Returns whether it was still provisioning."""
    if not _move(instance.id, from_states=[State.PROVISIONING], state=State.PROVISIONING):
        return False
    event_record_once(instance=instance, message=reason)
    return True


def event_record_once(*, instance: Instance, message: str):
    """event_record unless the instance's latest timeline line already says `message`. Returns the new
    InstanceEvent, or None."""
    latest = InstanceEvent.objects.filter(instance_id=instance.pk).order_by("-created_at", "-pk").first()
    if latest is not None and latest.message == message:
        return None
    return event_record(instance=instance, message=message)


@transaction.atomic(savepoint=False)
def touch_stuck(instance: Instance, message: str) -> bool:
    """provisioning -> provisioning: restart the stuck-transition clock before a resume, so the next
    reconcile does not resume it again at once. Returns whether it was still provisioning."""
    if not _move(instance.id, from_states=[State.PROVISIONING], state=State.PROVISIONING):
        return False
    event_record(instance=instance, message=message)
    return True


@transaction.atomic(savepoint=False)
def mark_running(instance: Instance, *, ready_at: datetime) -> bool:
    """provisioning -> running: JupyterLab answered. Metering starts at ready_at and only then. Returns
    whether it moved (False: it was stopped or failed while it got ready)."""
    if not _move(
        instance.id,
        from_states=[State.PROVISIONING],
        state=State.RUNNING,
        step=Step.READY,
        ready_at=ready_at,
        metered_until=ready_at,
    ):
        return False
    instance.state, instance.step = State.RUNNING, Step.READY
    event_record(instance=instance, message="Ready: JupyterLab is answering.")
    return True


@transaction.atomic(savepoint=False)
def fail(
    instance: Instance, *, reason: str, from_states=LAUNCH_STATES, now: datetime | None = None
) -> bool:
    """-> failed, with the reason the owner reads (what went wrong and what to do). Returns whether it moved."""
    if not _move(
        instance.id,
        from_states=from_states,
        state=State.FAILED,
        failure_reason=reason,
        stopped_at=now or timezone.now(),
    ):
        return False
    instance.state, instance.failure_reason = State.FAILED, reason
    event_record(instance=instance, message=reason)
    return True


# --- stop ------------------------------------------------------------------------------------------------


def _stop_fields(reason: str, note: str) -> dict:
    if reason not in StopReason.values:
        raise ValueError(f"Unknown stop reason {reason!r}; use one of {', '.join(StopReason.values)}.")
    return {"stop_reason": reason, "stop_note": (note or "").strip()[:STOP_NOTE_MAX]}


@transaction.atomic(savepoint=False)
def stop(instance: Instance, *, reason: str, note: str = "", message: str = "", now: datetime) -> str:
    """Stop one instance: queued -> stopped (it never started), provisioning or running -> stopping (its
    teardown finishes it). Returns the state it moved to, or "" when it moved nowhere (already stopping or
    ended). The caller holds the row lock, has charged a running instance up to `now`, and enqueues the
    teardown (or gives back a queued instance's GPUs) once this commits.
    """
    fields = _stop_fields(reason, note)
    if _move(
        instance.id, from_states=[State.QUEUED], state=State.STOPPED, stopped_at=now, state_changed_at=now, **fields
    ):
        instance.refresh_from_db()
        event_record(instance=instance, message=message or "Stopped before it started.")
        return State.STOPPED
    moving = [State.PROVISIONING, State.RUNNING]
    if _move(instance.id, from_states=moving, state=State.STOPPING, state_changed_at=now, **fields):
        instance.refresh_from_db()
        event_record(instance=instance, message=message or "Stopping.")
        return State.STOPPING
    return ""


@dataclass
class BulkStop:
    """What bulk_stop moved: the caller enqueues a teardown for each of `stopping_ids` and gives back the
    GPUs of `stopped_queued_ids`."""

    stopping_ids: list = field(default_factory=list)
    stopped_queued_ids: list = field(default_factory=list)

    @property
    def ids(self) -> list:
        return self.stopping_ids + self.stopped_queued_ids


def bulk_stop(instances, *, reason: str, note: str = "", message: str, now: datetime) -> BulkStop:
    """Stop every stoppable instance in the queryset `instances` with a few queries, whatever their number:
    running and provisioning ones -> stopping, queued ones -> stopped. Returns a BulkStop.

    For stops of many instances at once: credits running out (metering), a suspension, an account
    deletion. The caller runs inside transaction.atomic() holding the owners' CreditAccount locks, and has
    charged running instances up to `now` (metering's batch has; services.instances_stop_all does).
    """
    fields = _stop_fields(reason, note)
    stopping = list(
        instances.filter(state__in=[State.RUNNING, State.PROVISIONING]).values_list("id", flat=True)
    )
    queued = list(instances.filter(state=State.QUEUED).values_list("id", flat=True))
    result = BulkStop()
    if stopping:
        # Read back what moved: a worker may have moved one on between the read and the update.
        result.stopping_ids = list(
            Instance.objects.filter(id__in=stopping, state__in=[State.RUNNING, State.PROVISIONING])
            .select_for_update()
            .values_list("id", flat=True)
        )
        Instance.objects.filter(id__in=result.stopping_ids).update(
            state=State.STOPPING, state_changed_at=now, **fields
        )
    if queued:
        result.stopped_queued_ids = list(
            Instance.objects.filter(id__in=queued, state=State.QUEUED)
            .select_for_update()
            .values_list("id", flat=True)
        )
        Instance.objects.filter(id__in=result.stopped_queued_ids).update(
            state=State.STOPPED, stopped_at=now, state_changed_at=now, **fields
        )
    InstanceEvent.objects.bulk_create(
        [InstanceEvent(instance_id=i, state=State.STOPPING, message=message) for i in result.stopping_ids]
        + [
            InstanceEvent(instance_id=i, state=State.STOPPED, message=message)
            for i in result.stopped_queued_ids
        ]
    )
    return result


@transaction.atomic(savepoint=False)
def finish_stop(instance: Instance, *, message: str) -> bool:
    """stopping -> stopped: the teardown is done. Returns whether it moved."""
    if not _move(instance.id, from_states=[State.STOPPING], state=State.STOPPED, stopped_at=timezone.now()):
        return False
    instance.state = State.STOPPED
    event_record(instance=instance, message=message)
    return True
