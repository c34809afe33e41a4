"""Notifications on pages other apps own, without their views knowing about them:

{% load notification_tags %}
{% recent_notifications %}          the dashboard's "recent notifications" card
{% unread_notifications_count %}    a number for the nav link (empty when none)
"""

from django import template

from .. import selectors

register = template.Library()


# What the dashboard card shows; the nav link's count is read with these rows.
CARD_LIMIT = 5


def _read(request) -> tuple[list, int]:
    """The user's newest CARD_LIMIT notifications and their unread count, read once per request in one
    query: the nav link shows the count and the dashboard card both."""
    if not hasattr(request, "_notifications_read"):
        request._notifications_read = selectors.recent_and_unread(request.user, limit=CARD_LIMIT)
    return request._notifications_read


@register.inclusion_tag("notifications/_recent.html", takes_context=True)
def recent_notifications(context, limit: int = CARD_LIMIT):
    request = context["request"]
    if not request.user.is_authenticated:
        return {"notifications": [], "unread": 0, "request": request}
    if limit <= CARD_LIMIT:
        rows, unread = _read(request)
    else:
        rows, unread = selectors.recent_and_unread(request.user, limit=limit)
    return {
        "notifications": selectors.shown(rows[:limit]),
        "unread": unread,
        "request": request,
        "csrf_token": context.get("csrf_token"),
    }


@register.simple_tag(takes_context=True)
def unread_notifications_count(context) -> str:
    user = context["request"].user
    if not user.is_authenticated:
        return ""
    count = _read(context["request"])[1]
    return str(count) if count else ""
