"""Notifications on pages other apps own, without their views knowing about them:

{% load notification_tags %}
{% recent_notifications %}          the dashboard's "recent notifications" card
{% unread_notifications_count %}    a number for the nav link (empty when none)
"""

from django import template

from .. import selectors

register = template.Library()


def _unread(request) -> int:
    """The user's unread count, read once per request: the nav link and the dashboard card both show it."""
    if not hasattr(request, "_unread_notifications"):
        request._unread_notifications = selectors.unread_count(request.user)
    return request._unread_notifications


@register.inclusion_tag("notifications/_recent.html", takes_context=True)
def recent_notifications(context, limit: int = 5):
    request = context["request"]
    if not request.user.is_authenticated:
        return {"notifications": [], "unread": 0, "request": request}
    return {
        "notifications": selectors.recent_for(request.user, limit=limit),
        "unread": _unread(request),
        "request": request,
        "csrf_token": context.get("csrf_token"),
    }


@register.simple_tag(takes_context=True)
def unread_notifications_count(context) -> str:
    user = context["request"].user
    if not user.is_authenticated:
        return ""
    count = _unread(context["request"])
    return str(count) if count else ""
