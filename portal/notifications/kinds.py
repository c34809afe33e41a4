"""What each kind of notification says: the context it needs, its email, and its link on the dashboard.

Emails are plain-text templates, templates/notifications/email/<kind>_subject.txt and <kind>.txt. They
get the notification's context plus absolute links built from settings.SITE_URL. The dashboard shows
the same subject and body, so a notification reads the same wherever the user meets it.
"""

from dataclasses import dataclass

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from portal.instances.stop_reasons import NEEDS_NOTE, StopReason

from .models import OPTIONAL_KINDS, Kind


# Why DevCloud (not the owner) stopped an instance: the `reason` of an instance_stopped notification. The
# same words as Instance.stop_reason; the owner is emailed for these, never for their own stop, a suspension
# (account_suspended tells them) or a deleted account (nobody is left to tell).
NOTIFIED_STOP_REASONS = (
    StopReason.CREDITS_EXHAUSTED,
    StopReason.IDLE,
    StopReason.MAX_LENGTH,
    StopReason.OPERATOR,
    StopReason.HOST_EVICTED,
    StopReason.HOST_DOWN,
)


# Context keys each kind cannot do without; notify() refuses a call that misses one.
REQUIRED_CONTEXT = {
    Kind.CREDIT_LOW_1H: ("balance_hours", "runway", "burn_gpus"),
    Kind.CREDIT_LOW_10M: ("balance_hours", "runway", "burn_gpus"),
    Kind.INSTANCE_STOPPED: ("instance_id", "instance_label", "reason"),
    Kind.INSTANCE_IDLE_WARNING: ("instance_id", "instance_label", "idle_minutes", "grace_minutes"),
    Kind.SESSION_ENDING: ("instance_id", "instance_label", "minutes_left", "ends_at"),
    Kind.LAUNCH_FAILED: ("instance_id", "instance_label", "failure_reason"),
    Kind.BONUS_DECISION: ("program", "approved"),
    Kind.ACCOUNT_SUSPENDED: ("reason",),
    Kind.GPU_UNHEALTHY: ("instance_id", "instance_label", "gpu", "health_reason"),
    Kind.CI_GRANT_DECISION: ("project", "project_slug", "approved"),
    Kind.RESERVATION_ENDING: ("reservation_id", "window", "minutes_left", "instances"),
    Kind.RESERVATION_CANCELLED: ("reservation_id", "window", "reason"),
}


def check_context(kind: str, context: dict) -> None:
    """Raises ValueError when `context` lacks what the templates of `kind` need (a caller's bug)."""
    missing = [key for key in REQUIRED_CONTEXT[kind] if context.get(key) in (None, "")]
    if missing:
        raise ValueError(f"A {kind} notification needs {', '.join(missing)} in its context.")
    if kind == Kind.INSTANCE_STOPPED:
        if context["reason"] not in NOTIFIED_STOP_REASONS:
            raise ValueError(
                f"Unknown stop reason {context['reason']!r}; use one of {', '.join(NOTIFIED_STOP_REASONS)}."
            )
        if context["reason"] in NEEDS_NOTE and not context.get("operator_reason"):
            raise ValueError(
                "An operator stop needs the operator's reason (operator_reason): the owner reads it."
            )
    if kind == Kind.BONUS_DECISION and not context["approved"] and not context.get("reason"):
        raise ValueError("A rejected bonus application needs the reason (reason): the applicant reads it.")
    if kind == Kind.CI_GRANT_DECISION and not context["approved"] and not context.get("reason"):
        raise ValueError("A rejected CI programme application needs the reason (reason): the owners read it.")


def _absolute(path: str) -> str:
    return settings.SITE_URL + path


def links(notification) -> dict[str, str]:
    """Absolute URLs the templates may use; instance_url only for notifications about an instance."""
    found = {
        "dashboard_url": _absolute(reverse("credits:dashboard")),
        "instances_url": _absolute(reverse("instances:list")),
        "bonus_url": _absolute(reverse("credits:bonus")),
        "notifications_url": _absolute(reverse("notifications:list")),
        "preferences_url": _absolute(reverse("notifications:preferences")),
    }
    project_slug = notification.context.get("project_slug")
    if project_slug:
        found["project_url"] = _absolute(reverse("projects:detail", args=[project_slug]))
    if notification.context.get("reservation_id"):
        found["reservations_url"] = _absolute(reverse("instances:reservations"))
    instance_id = notification.context.get("instance_id")
    if instance_id:
        found["instance_url"] = _absolute(reverse("instances:detail", args=[instance_id]))
    return found


@dataclass(frozen=True)
class Rendered:
    subject: str
    body: str
    # Where the dashboard entry links to, site-relative, with the link's text.
    action_url: str
    action_label: str


def _action(notification) -> tuple[str, str]:
    kind, context = notification.kind, notification.context
    if kind in (
        Kind.INSTANCE_STOPPED, Kind.INSTANCE_IDLE_WARNING, Kind.SESSION_ENDING, Kind.LAUNCH_FAILED,
        Kind.GPU_UNHEALTHY,
    ):
        return reverse("instances:detail", args=[context["instance_id"]]), "See the instance"
    if kind in OPTIONAL_KINDS:
        return reverse("instances:list"), "See your instances"
    if kind == Kind.BONUS_DECISION:
        return reverse("credits:bonus"), "See your applications"
    if kind == Kind.CI_GRANT_DECISION:
        return reverse("projects:detail", args=[context["project_slug"]]), "See the project"
    if kind in (Kind.RESERVATION_ENDING, Kind.RESERVATION_CANCELLED):
        return reverse("instances:reservations"), "See your bookings"
    return reverse("credits:dashboard"), "See your balance"


def render(notification) -> Rendered:
    """The notification's email subject and body and its dashboard link. Raises TemplateDoesNotExist or
    NoReverseMatch only through a deployment mistake (a missing template, URLs not wired)."""
    context = {
        **notification.context,
        **links(notification),
        "user": notification.user,
        "site_name": settings.SITE_NAME,
        "site_url": settings.SITE_URL,
        "optional": notification.kind in OPTIONAL_KINDS,
    }
    subject = render_to_string(f"notifications/email/{notification.kind}_subject.txt", context)
    body = render_to_string(f"notifications/email/{notification.kind}.txt", context)
    action_url, action_label = _action(notification)
    # A subject is one line: template line breaks and indentation would break the header.
    return Rendered(" ".join(subject.split()), body.strip() + "\n", action_url, action_label)
