"""Reads of notifications. Every one is scoped to one user: nobody reads another user's notifications."""

from dataclasses import dataclass

from django.db.models import Count, Q, Window

from . import kinds
from .models import OPTIONAL_KINDS, EmailOptOut, Kind, Notification

# How many notifications the full list shows; older ones stay in the database for the operators.
LIST_LIMIT = 100


@dataclass(frozen=True)
class Shown:
    """A notification as a page shows it: the record plus its rendered text and link."""

    notification: Notification
    subject: str
    body: str
    action_url: str
    action_label: str

    @property
    def is_unread(self) -> bool:
        return self.notification.is_unread


def shown(notifications) -> list[Shown]:
    """Notifications as a page shows them."""
    shown = []
    for notification in notifications:
        rendered = kinds.render(notification)
        shown.append(
            Shown(notification, rendered.subject, rendered.body, rendered.action_url, rendered.action_label)
        )
    return shown


def recent_for(user, limit: int = 5) -> list[Shown]:
    """The user's newest `limit` notifications, newest first, rendered for the dashboard."""
    return shown(recent_and_unread(user, limit=limit)[0])


def recent_and_unread(user, limit: int = 5) -> tuple[list[Notification], int]:
    """The user's newest `limit` notifications and how many of all theirs are unread, in one query: the
    count is a window over every notification of the user, worked out before the limit applies."""
    rows = list(
        Notification.objects.filter(user_id=user.pk).annotate(
            unread_total=Window(Count("id", filter=Q(read_at__isnull=True)))
        )[:limit]
    )
    for notification in rows:
        notification.user = user
    return rows, (rows[0].unread_total if rows else 0)


def all_for(user, limit: int = LIST_LIMIT) -> list[Shown]:
    """The user's notifications for the full list, newest first, at most `limit`."""
    return recent_for(user, limit=limit)


def unread_count(user) -> int:
    return Notification.objects.filter(user_id=user.pk, read_at__isnull=True).count()


def emailed_kinds(user) -> set[str]:
    """The optional kinds the user gets by email (the mandatory ones always are)."""
    off = set(EmailOptOut.objects.filter(user_id=user.pk).values_list("kind", flat=True))
    return {kind.value for kind in OPTIONAL_KINDS} - off


def mandatory_kinds() -> list[Kind]:
    return [kind for kind in Kind if kind not in OPTIONAL_KINDS]
