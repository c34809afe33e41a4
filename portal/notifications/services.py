"""Telling users what happened: record a notification once per event, then email it through Celery.

Callers use notify() or, better, the notify_<event>() helpers below, which build the event key and the
context from the caller's objects so every caller names the same event the same way:

    notify_instance_stopped(instance=..., reason=StopReason.CREDITS_EXHAUSTED)
    notify_instance_idle_warning(instance=..., idle_since=..., idle_minutes=..., grace_minutes=...)
    notify_launch_failed(instance=...)
    notify_bonus_decided(application=...)
    notify_ci_grant_decided(application=..., user=...)
    notify_account_suspended(user=..., reason=..., suspended_at=...)
    credit_warnings_check(user=..., balance_gpu_seconds=..., burn_gpu_seconds_per_hour=...)

Each may run inside the caller's transaction: the row is written in a savepoint and the email is
published only when the transaction commits, so a rolled-back stop tells nobody. None of them raises
because email is down.

Delivery is at most once per notification (see models.Notification): the email task claims the row
before it sends, gives the claim back only when the mail server refused, and Celery retries that with
backoff. A worker that dies between claim and send loses the email, never doubles it; the dashboard
entry is the record the user can always find.

This module imports no other app's services: credits and provisioning call into it.
"""

import logging
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from portal.credits.models import GPU_SECONDS_PER_HOUR, BonusApplication, LedgerEntry, hours
from portal.instances.sizes import SIZES
from portal.lib.tasks import publish

from . import kinds
from .kinds import StopReason  # noqa: F401 -- re-exported for callers
from .models import OPTIONAL_KINDS, EmailOptOut, Kind, Notification

log = logging.getLogger(__name__)

# How much of the email error is kept on the row.
ERROR_MAX_CHARS = 1000


def notify(*, user, kind: str, event_key: str, context: dict) -> Notification | None:
    """Record that `event_key` happened to `user` and email them once the transaction commits.

    Returns the new Notification, or None when this user was already notified of this event (of this
    kind): nothing is recorded and nothing is sent then, even when two calls race. A kind the user
    turned off (OPTIONAL_KINDS) is still recorded, for the dashboard and so that turning email back on
    later does not send stale news, but not emailed. Raises ValueError for an unknown kind or a
    context the kind's templates cannot use.
    """
    kind = Kind(kind)
    kinds.check_context(kind, context)
    same_event = Notification.objects.filter(user_id=user.pk, kind=kind, event_key=event_key)
    # Cheap path for callers that ask every tick (the credit warnings): no failed INSERT each time.
    if same_event.exists():
        return None
    try:
        with transaction.atomic():
            notification = Notification.objects.create(
                user_id=user.pk,
                kind=kind,
                event_key=event_key,
                context=context,
                email_enabled=_email_wanted(user, kind),
            )
    except IntegrityError:
        # A concurrent call recorded it first: the unique constraint made us wait for it to commit.
        if same_event.exists():
            return None
        raise
    if notification.email_enabled:
        # robust: a failure to publish is logged, never raised into the caller's commit.
        transaction.on_commit(lambda: _publish(notification.pk), robust=True)
    return notification


def _email_wanted(user, kind: str) -> bool:
    if getattr(user, "deleted_at", None) is not None or getattr(user, "project_bot", False):
        return False  # nobody reads a deleted account's mail, or a project bot's (it has none)
    if kind in OPTIONAL_KINDS:
        return not EmailOptOut.objects.filter(user_id=user.pk, kind=kind).exists()
    return True


def _publish(notification_id: int) -> None:
    """Hand the email to a worker; when the broker is unreachable, send it from this process.

    An inline send that fails is recorded on the row by notification_email_send; nothing retries it.
    """
    from .tasks import send

    publish(send, args=[notification_id], inline=lambda: notification_email_send(notification_id=notification_id))


def notification_email_send(*, notification_id: int) -> bool:
    """Send the notification's email, at most once however often this runs.

    Returns True when this call sent it, False when there is nothing to send: already sent (or being
    sent) by another delivery, turned off, or the account was deleted. Raises what the mail backend
    raises (smtplib.SMTPException, OSError) after giving the claim back and recording the error, so
    the task can retry. (One way to get two emails remains: the server accepts the message and the
    connection drops before it says so. Not knowing, we retry, as any SMTP client would.)
    """
    notification = (
        Notification.objects.select_related("user")
        .filter(pk=notification_id, email_enabled=True, emailed_at__isnull=True)
        .first()
    )
    if notification is None:
        return False
    user = notification.user
    if user.deleted_at is not None or not user.email:
        Notification.objects.filter(pk=notification_id).update(
            email_enabled=False, email_error="Account deleted."
        )
        return False
    # Rendered before the claim: a template mistake must not leave the email claimed but unsent.
    rendered = kinds.render(notification)
    claimed_at = timezone.now()
    claimed = Notification.objects.filter(
        pk=notification_id, emailed_at__isnull=True, email_enabled=True
    ).update(emailed_at=claimed_at, email_attempts=F("email_attempts") + 1)
    if not claimed:
        return False  # a duplicate delivery of the task got there first
    try:
        send_mail(rendered.subject, rendered.body, None, [user.email])
    except Exception as error:
        # The mail server did not take it, so it was not sent: free the row for the retry.
        Notification.objects.filter(pk=notification_id, emailed_at=claimed_at).update(
            emailed_at=None, email_error=f"{type(error).__name__}: {error}"[:ERROR_MAX_CHARS]
        )
        raise
    return True


# --- Event helpers: one per thing that happens, so every caller names the event the same way ------------


def instance_label(instance) -> str:
    """How emails name an instance: its short id, size and image, e.g. "3f2a9c1e (1x MI300X, PyTorch)"."""
    size = SIZES[instance.size].name if instance.size in SIZES else instance.size
    return f"{instance.short_id} ({size}, {instance.image.name})"


def notify_instance_stopped(
    *, instance, reason: str, operator_reason: str = "", **details
) -> Notification | None:
    """Tell the owner that DevCloud stopped their instance. Call it once the stop is decided (the
    instance is STOPPING or STOPPED), from whichever code stopped it; a second call is a no-op.

    `reason` is a StopReason. An operator stop needs `operator_reason`, which the owner reads.
    `details` may add idle_minutes (IDLE) or max_hours (MAX_LENGTH) to the email. A stop the user asked
    for needs no email: do not call this for it. Returns the Notification or None (already told).
    """
    context = {
        "instance_id": str(instance.id),
        "instance_label": instance_label(instance),
        "reason": reason,
        "operator_reason": operator_reason.strip(),
        **details,
    }
    return notify(
        user=instance.user,
        kind=Kind.INSTANCE_STOPPED,
        event_key=f"instance:{instance.id}:stopped",
        context=context,
    )


def notify_instance_idle_warning(
    *, instance, idle_since: datetime, idle_minutes: int, grace_minutes: int
) -> Notification | None:
    """Warn the owner that an idle instance will be stopped after `grace_minutes` unless it is used.

    Once per idle stretch: `idle_since` (when activity last stopped, as stored) names the stretch, so an
    instance that is used again and then goes idle again is warned again. Returns the Notification or None.
    """
    context = {
        "instance_id": str(instance.id),
        "instance_label": instance_label(instance),
        "idle_minutes": idle_minutes,
        "grace_minutes": grace_minutes,
    }
    return notify(
        user=instance.user,
        kind=Kind.INSTANCE_IDLE_WARNING,
        event_key=f"instance:{instance.id}:idle:{idle_since.isoformat()}",
        context=context,
    )


def notify_session_ending(*, instance, ends_at: datetime, now: datetime) -> Notification | None:
    """Warn the owner that the session's longest length stops `instance` at `ends_at`, and how to extend it.

    Once per end: the hours already added (instance.extended_seconds) name the end, so an extension that
    moves it earns a warning of its own. Returns the Notification or None (already warned).
    """
    return notify(
        user=instance.user,
        kind=Kind.SESSION_ENDING,
        event_key=f"instance:{instance.id}:session_end:{instance.extended_seconds}",
        context={
            "instance_id": str(instance.id),
            "instance_label": instance_label(instance),
            "minutes_left": max(1, round((ends_at - now).total_seconds() / 60)),
            "ends_at": ends_at.strftime("%Y-%m-%d %H:%M UTC"),
        },
    )


def _window_text(reservation) -> str:
    return f"{reservation.starts_at:%Y-%m-%d %H:%M} to {reservation.ends_at:%Y-%m-%d %H:%M} UTC"


def notify_reservation_ending(*, reservation, instances, now: datetime) -> Notification | None:
    """Warn the booker that `reservation`'s window ends soon and stops `instances` (running in it) then.
    Once per booking. Returns the Notification or None (already warned)."""
    return notify(
        user=reservation.user,
        kind=Kind.RESERVATION_ENDING,
        event_key=f"reservation:{reservation.id}:ending",
        context={
            "reservation_id": str(reservation.id),
            "window": _window_text(reservation),
            "minutes_left": max(1, round((reservation.ends_at - now).total_seconds() / 60)),
            "instances": ", ".join(instance_label(instance) for instance in instances),
        },
    )


def notify_reservation_cancelled(*, reservation, reason: str) -> Notification | None:
    """Tell the booker an operator cancelled `reservation`, and why. Once per booking."""
    return notify(
        user=reservation.user,
        kind=Kind.RESERVATION_CANCELLED,
        event_key=f"reservation:{reservation.id}:cancelled",
        context={
            "reservation_id": str(reservation.id),
            "window": _window_text(reservation),
            "gpus": reservation.gpus,
            "reason": reason,
        },
    )


def notify_gpu_unhealthy(*, instance, gpu: str, health_reason: str, drained_at: datetime) -> Notification | None:
    """Tell the owner that a GPU their instance holds was drained as unhealthy (`gpu` names it, e.g.
    "renderD136"). The instance keeps running. Once per drain of that GPU. Returns the Notification or
    None (already told)."""
    return notify(
        user=instance.user,
        kind=Kind.GPU_UNHEALTHY,
        event_key=f"instance:{instance.id}:gpu:{gpu}:{drained_at.isoformat()}",
        context={
            "instance_id": str(instance.id),
            "instance_label": instance_label(instance),
            "gpu": gpu,
            "health_reason": health_reason,
        },
    )


def notify_launch_failed(*, instance) -> Notification | None:
    """Tell the owner a launch failed, with instance.failure_reason (which says what to do). Call it after
    the instance moved to FAILED. Returns the Notification or None (already told)."""
    context = {
        "instance_id": str(instance.id),
        "instance_label": instance_label(instance),
        "failure_reason": instance.failure_reason or "The launch could not be completed.",
    }
    return notify(
        user=instance.user,
        kind=Kind.LAUNCH_FAILED,
        event_key=f"instance:{instance.id}:failed",
        context=context,
    )


def notify_bonus_decided(*, application) -> Notification | None:
    """Tell the applicant an operator approved (with the hours granted) or rejected (with the reason)
    their bonus application. Call it after the decision is saved. Returns the Notification or None."""
    approved = application.status == BonusApplication.Status.APPROVED
    context = {
        "program": application.program.name,
        "approved": approved,
        "reason": application.decision_reason,
        "granted_hours": hours(application.granted_gpu_seconds),
        "requested_hours": hours(application.requested_gpu_seconds or 0),
        "clamped": bool(application.clamped),
    }
    return notify(
        user=application.user,
        kind=Kind.BONUS_DECISION,
        event_key=f"bonus_application:{application.pk}:decided",
        context=context,
    )


def notify_ci_grant_decided(*, application, user) -> Notification | None:
    """Tell `user`, an owner of the project, that an operator admitted it to the open-source CI programme
    (with the monthly hours) or rejected the application (with the reason). Call it after the decision
    is saved. Returns the Notification or None."""
    return notify(
        user=user,
        kind=Kind.CI_GRANT_DECISION,
        event_key=f"ci_grant_application:{application.pk}:decided",
        context={
            "project": application.project.name,
            "project_slug": application.project.slug,
            "approved": application.status == "approved",
            "reason": application.decision_reason,
            "monthly_hours": hours(application.granted_gpu_seconds),
            "renewal_day": settings.CI_GRANT_RENEWAL_DAY,
        },
    )


def notify_account_suspended(*, user, reason: str, suspended_at: datetime) -> Notification | None:
    """Tell the user their account was suspended and why. `suspended_at` is the stored time of this
    suspension: a later suspension (after an unsuspend) is a new event. Returns the Notification or None."""
    return notify(
        user=user,
        kind=Kind.ACCOUNT_SUSPENDED,
        event_key=f"account:{user.pk}:suspended:{suspended_at.isoformat()}",
        context={"reason": reason.strip()},
    )


# --- Credit warnings ----------------------------------------------------------------------------------

# Tightest first: a user already below 10 minutes gets only that warning.
CREDIT_WARNINGS = ((Kind.CREDIT_LOW_10M, 10 * 60), (Kind.CREDIT_LOW_1H, 60 * 60))


def _runway_text(seconds: int) -> str:
    minutes = seconds // 60
    if minutes >= 60:
        return "about 1 hour"
    if minutes < 1:
        return "less than a minute"
    return f"about {minutes} minute{'' if minutes == 1 else 's'}"


def credit_episode_start(*, user, threshold_gpu_seconds: int) -> int:
    """The id of the last credit (positive ledger entry) that left the balance above `threshold_gpu_seconds`,
    or 0 when there is none. A low-credit episode begins after it, so a top-up that lifts the balance
    above a warning's threshold starts a new episode, and a small one that does not, does not."""
    entry_id = (
        LedgerEntry.objects.filter(
            account__user_id=user.pk, gpu_seconds__gt=0, balance_after__gt=threshold_gpu_seconds
        )
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
        .first()
    )
    return entry_id or 0


def credit_warnings_check(
    *, user, balance_gpu_seconds: int, burn_gpu_seconds_per_hour: int
) -> Notification | None:
    """Warn the user when their running instances will use up the balance within about 1 hour, and again
    within about 10 minutes. Meant to be called by the meter tick for every user it charged, with the
    balance after the charge and the GPU-seconds per hour their running instances burn (GPUs × 3600).

    Each warning goes once per low-credit episode (see credit_episode_start): staying low sends nothing
    more, a top-up followed by a new fall sends it again. A user who falls straight below 10 minutes
    gets only the 10-minute warning, and no 1-hour warning later in that episode. Nothing is sent when
    nothing is burning or the balance is already gone (the instance_stopped email covers that).
    Returns the Notification sent, or None.
    """
    if burn_gpu_seconds_per_hour <= 0 or balance_gpu_seconds <= 0:
        return None
    runway_seconds = balance_gpu_seconds * 3600 // burn_gpu_seconds_per_hour
    due = [(kind, limit) for kind, limit in CREDIT_WARNINGS if runway_seconds <= limit]
    if not due:
        return None
    kind, limit_seconds = due[0]
    threshold = burn_gpu_seconds_per_hour * limit_seconds // 3600
    episode = credit_episode_start(user=user, threshold_gpu_seconds=threshold)
    if kind == Kind.CREDIT_LOW_1H and _warned_since(user=user, kind=Kind.CREDIT_LOW_10M, entry_id=episode):
        return None
    context = {
        "balance_hours": hours(balance_gpu_seconds),
        "runway": _runway_text(runway_seconds),
        "minutes_left": runway_seconds // 60,
        "burn_gpus": f"{burn_gpu_seconds_per_hour / GPU_SECONDS_PER_HOUR:g}",
        "episode_entry_id": episode,
    }
    return notify(
        user=user, kind=kind, event_key=f"credit_low:{user.pk}:after_entry:{episode}", context=context
    )


def _warned_since(*, user, kind: str, entry_id: int) -> bool:
    """Whether a `kind` warning was sent in an episode that began at ledger entry `entry_id` or later.

    Compares entry ids, not clocks: the ledger's ids grow in the order entries were posted per account.
    """
    return Notification.objects.filter(
        user_id=user.pk, kind=kind, context__episode_entry_id__gte=entry_id
    ).exists()


# --- The user's side ----------------------------------------------------------------------------------


def notifications_mark_all_read(*, user) -> int:
    """Mark every unread notification of `user` read. Returns how many changed."""
    return Notification.objects.filter(user_id=user.pk, read_at__isnull=True).update(read_at=timezone.now())


def email_preferences_set(*, user, emailed_kinds) -> set[str]:
    """Email the user about the optional kinds in `emailed_kinds` and not about the other optional kinds.

    Mandatory kinds are always emailed and cannot be listed here. Returns the optional kinds now turned
    off. Raises ValidationError naming a kind that is unknown or not optional.
    """
    wanted = set(emailed_kinds)
    refused = sorted(wanted - {kind.value for kind in OPTIONAL_KINDS})
    if refused:
        raise ValidationError(f"These emails cannot be chosen: {', '.join(refused)}.")
    off = {kind.value for kind in OPTIONAL_KINDS} - wanted
    with transaction.atomic():
        EmailOptOut.objects.filter(user_id=user.pk).exclude(kind__in=off).delete()
        for kind in off:
            EmailOptOut.objects.get_or_create(user_id=user.pk, kind=kind)
    return off
