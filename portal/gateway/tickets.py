"""How the portal session reaches a lab on its own subdomain (production's subdomain mode).

The portal's session cookie is host-only on the portal's host and never goes to a lab host. Instead:
1. "Open JupyterLab" (/instances/<uuid>/open on the portal) hands the owner a ticket: the session key
   and instance id, encrypted and timestamped, valid for TICKET_SECONDS;
2. the browser carries it to https://<uuid>.<lab domain>/instances/<uuid>/redeem?ticket=..., which sets
   a host-only lab cookie holding the same pair, encrypted, and redirects into JupyterLab;
3. on every request there nginx asks /instances/<uuid>/auth, which decrypts the lab cookie and runs the
   same check as the portal session would: logging out of the portal ends lab access too.

Both are encrypted (Fernet, keyed from SECRET_KEY) rather than only signed because they carry the
portal session key: even if one leaked into the instance, it opens nothing but that same lab.
"""

import base64
import hashlib
import json

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

# Long enough for a redirect on a slow link, short enough that a ticket seen in history is stale.
TICKET_SECONDS = 30
LAB_COOKIE_NAME = "devcloud_lab"


def _fernet() -> Fernet:
    key = hashlib.sha256(f"devcloud.gateway.ticket:{settings.SECRET_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def _seal(purpose: str, *, session_key: str, instance_id: str) -> str:
    payload = json.dumps({"p": purpose, "k": session_key, "i": instance_id}).encode()
    return _fernet().encrypt(payload).decode()


def _open(value: str, purpose: str, *, instance_id: str, max_age: int | None) -> str | None:
    try:
        payload = json.loads(_fernet().decrypt(value.encode(), ttl=max_age))
    except (InvalidToken, ValueError, TypeError):
        return None
    if payload.get("p") != purpose or payload.get("i") != instance_id:
        return None
    return payload.get("k") or None


def ticket_issue(*, session_key: str, instance_id: str) -> str:
    """Returns a ticket for opening `instance_id`'s lab with this session, valid for TICKET_SECONDS."""
    return _seal("ticket", session_key=session_key, instance_id=instance_id)


def ticket_redeem(ticket: str, *, instance_id: str) -> str | None:
    """Returns the session key in a fresh, untampered ticket for `instance_id`, else None."""
    return _open(ticket, "ticket", instance_id=instance_id, max_age=TICKET_SECONDS)


def lab_cookie_value(*, session_key: str, instance_id: str) -> str:
    """Returns the lab cookie's value for this session and instance (no expiry: the session decides)."""
    return _seal("lab", session_key=session_key, instance_id=instance_id)


def lab_cookie_session_key(value: str, *, instance_id: str) -> str | None:
    """Returns the session key in a lab cookie made for `instance_id`, else None."""
    return _open(value, "lab", instance_id=instance_id, max_age=None)


def lab_base_url(instance_id: str) -> str:
    """Returns the lab's origin in subdomain mode ("https://<uuid>.lab.example.com"), or "" in path mode."""
    template = getattr(settings, "GATEWAY_LAB_URL", "")
    return template.format(instance_id=instance_id).rstrip("/") if template else ""
