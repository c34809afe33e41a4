"""Writing the audit log."""

import json
import re

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from .models import AuditEntry

# Known action codes and how the audit page names them. Other codes are accepted too (the page shows
# the code itself), so an app can record a new kind of action without touching this module first.
AUDIT_ACTIONS = {
    "credits.adjust": "Credits granted or corrected",
    "bonus.approve": "Bonus application approved",
    "bonus.reject": "Bonus application rejected",
    "bonus.import": "Certificate IDs imported",
    "program.change": "Grant or bonus program created or changed",
    "ci_grant.approve": "Project admitted to the open-source CI programme",
    "ci_grant.reject": "CI programme application rejected",
    "ci_grant.end": "Project's CI programme grant ended",
    "user.suspend": "User suspended",
    "user.unsuspend": "User unsuspended",
    "account.delete": "Account deleted by its owner (its instances stopped)",
    "host.add": "Host added",
    "host.drain": "Host drained",
    "host.evict": "Host cordoned and evicted (its instances stopped)",
    "host.retire": "Host retired",
    "host.activate": "Host put back into service",
    "host.discover": "GPUs discovered on a host",
    "gpu.drain": "GPU drained by its health check",
    "gpu.return": "GPU returned to service",
    "host.check": "Host's Docker engine checked",
    "host.image": "Image pulled or built on a host",
    "host.down": "Host marked down (missed heartbeats)",
    "host.up": "Host answers again after being down",
    "instance.force_stop": "Instance force-stopped",
    "reservation.book": "GPUs booked for a window",
    "reservation.cancel": "Booking cancelled by the person who made it",
    "reservation.operator_cancel": "Booking cancelled by an operator",
    "workspace.mount_refused": "A workspace volume labelled for another person or install was not mounted",
    "setting.change": "Setting changed",
    "port.expose": "Instance port exposed by its owner",
    "port.close": "Exposed instance port closed",
    "share.create": "Share link made for an exposed port",
    "share.revoke": "Share link for an exposed port revoked",
}

ACTION_CODE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


def actor_name_of(actor) -> str:
    """How the log names an operator: "Olivia Operator <olivia@ops.example.com>", the address, or "system"."""
    if actor is None:
        return "system"
    full_name = actor.get_full_name()
    return f"{full_name} <{actor.email}>" if full_name else actor.email


def audit_record(
    *, actor, action: str, target=None, reason: str = "", details: dict | None = None
) -> AuditEntry:
    """Append one entry to the audit log and return it.

    `actor` is the operator (a saved user) or None for the system. `action` is a dotted code such as
    "host.drain" (see AUDIT_ACTIONS). `target` is the model instance acted on, a string naming something
    that is not a row (e.g. a setting's name), or None. `details` must be JSON-serialisable (dates,
    decimals and UUIDs are fine).

    Call it inside the same transaction.atomic() as the action it records, so that neither is kept
    without the other.

    Raises ValueError for a malformed action code, an unsaved actor, or details that cannot be stored.
    """
    if not ACTION_CODE.match(action or "") or len(action) > AuditEntry._meta.get_field("action").max_length:
        raise ValueError(f"Audit action {action!r} is not a dotted code like 'host.drain'.")
    if actor is not None and getattr(actor, "pk", None) is None:
        raise ValueError("The actor must be a saved user, or None for the system.")
    details = details or {}
    try:
        json.dumps(details, cls=DjangoJSONEncoder)
    except TypeError as error:
        raise ValueError(f"Audit details must be JSON-serialisable: {error}") from error

    target_type = target_id = target_repr = ""
    if isinstance(target, models.Model):
        target_type, target_id, target_repr = target._meta.label_lower, str(target.pk), str(target)
    elif target is not None:
        target_repr = str(target)
    return AuditEntry.objects.create(
        actor=actor,
        actor_name=actor_name_of(actor)[:300],
        action=action,
        target_type=target_type,
        target_id=target_id,
        target_repr=target_repr[:300],
        reason=(reason or "").strip(),
        details=details,
    )
