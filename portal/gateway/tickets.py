"""How the portal session reaches a lab on its own subdomain (production's subdomain mode).

The portal's session cookie is host-only on the portal's host and never goes to a lab host. Instead, a
handshake between the two hosts, started by "Open JupyterLab" (/instances/<uuid>/open on the portal):
1. the portal checks the session and sends the browser to the lab host's /instances/<uuid>/redeem;
2. the lab host gives this browser a random handshake cookie (host-only, HttpOnly, HANDSHAKE_SECONDS)
   and sends it back to the portal's /open with only the cookie's hash (`handshake=`);
3. the portal checks the session again and hands out a ticket: the session key, the instance id and
   that hash, encrypted and timestamped, valid for TICKET_SECONDS;
4. the lab host's /redeem?ticket=... accepts the ticket only from the browser holding the handshake
   cookie whose hash it carries, and only once (spent tickets are remembered in the shared "gateway"
   cache). It then sets the host-only lab cookie, holding the session key and instance id, encrypted;
5. on every request there nginx asks /instances/<uuid>/auth, which decrypts the lab cookie and runs the
   same check as the portal session would: logging out of the portal ends lab access too.

The binding is what stops login CSRF into a lab: a ticket Bob obtained for his own lab is useless in
Alice's browser, which never held Bob's handshake cookie, so Bob cannot sign her in to his lab (where
whatever she types or uploads would be his). In production the cookies are `__Host-` names, so no other
subdomain (another lab) can plant a handshake cookie of its choosing.

Tickets and lab cookies are encrypted (Fernet, keyed from SECRET_KEY) rather than only signed because
they carry the portal session key: even if one leaked into the instance, it opens nothing but that lab.
"""

import base64
import hashlib
import hmac
import json
import re
import secrets

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.cache import caches
from django.db import close_old_connections

# Long enough for a redirect on a slow link, short enough that a ticket seen in history is stale.
TICKET_SECONDS = 30
# The handshake cookie lives across the two redirects between the hosts, then is deleted.
HANDSHAKE_SECONDS = 120
# Spent tickets are remembered past any lifetime a ticket could have on a process whose clock is
# ahead (Fernet accepts timestamps up to 60 seconds in the future).
SPENT_SECONDS = TICKET_SECONDS + 120
# The cache that remembers spent tickets; shared by every web process (settings.CACHES).
TICKET_CACHE = "gateway"
_BINDING = re.compile(r"^[0-9a-f]{64}$")


def lab_cookie_name() -> str:
    """The lab host's sign-in cookie: settings.GATEWAY_LAB_COOKIE_NAME (`__Host-` in production)."""
    return getattr(settings, "GATEWAY_LAB_COOKIE_NAME", "devcloud_lab")


def handshake_cookie_name() -> str:
    """The cookie that binds a ticket to the browser that asked for it, on the lab host."""
    return f"{lab_cookie_name()}_handshake"


def _fernet() -> Fernet:
    key = hashlib.sha256(f"devcloud.gateway.ticket:{settings.SECRET_KEY}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def _seal(purpose: str, **payload) -> str:
    return _fernet().encrypt(json.dumps({"p": purpose, **payload}).encode()).decode()


def _open(value: str, purpose: str, *, instance_id: str, max_age: int | None) -> dict | None:
    try:
        payload = json.loads(_fernet().decrypt(value.encode(), ttl=max_age))
    except (InvalidToken, ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or payload.get("p") != purpose or payload.get("i") != instance_id:
        return None
    return payload if payload.get("k") else None


def seal(purpose: str, **payload) -> str:
    """Returns `payload` encrypted and timestamped for `purpose` (the exposed ports' tickets and cookies)."""
    return _seal(purpose, **payload)


def unseal(value: str, purpose: str, *, max_age: int | None) -> dict | None:
    """Returns what seal() put in `value` for `purpose`, or None when it is not that, tampered or older
    than `max_age` seconds."""
    try:
        payload = json.loads(_fernet().decrypt(value.encode(), ttl=max_age))
    except (InvalidToken, ValueError, TypeError):
        return None
    return payload if isinstance(payload, dict) and payload.get("p") == purpose else None


def spend(ticket: str) -> bool:
    """Marks `ticket` spent; True only the first time, in any process. Writes to the database: call it
    from a thread."""
    spent_key = "gateway-ticket:" + hashlib.sha256(ticket.encode()).hexdigest()
    try:
        # add() is atomic across processes: of two redemptions at once, exactly one adds the key.
        return caches[TICKET_CACHE].add(spent_key, 1, timeout=SPENT_SECONDS)
    finally:
        close_old_connections()


def handshake_new() -> tuple[str, str]:
    """Returns (a fresh handshake cookie value, its binding: the hash the portal puts in the ticket)."""
    value = secrets.token_urlsafe(32)
    return value, handshake_binding(value)


def handshake_binding(value: str) -> str:
    """Returns the binding of a handshake cookie value (hex SHA-256); only the hash crosses to the portal."""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def binding_well_formed(binding: str) -> bool:
    return bool(_BINDING.match(binding or ""))


def ticket_issue(*, session_key: str, instance_id: str, binding: str) -> str:
    """Returns a ticket for opening `instance_id`'s lab with this session, valid for TICKET_SECONDS, in
    the browser whose handshake cookie has `binding` as its hash. Raises ValueError for a malformed one."""
    if not binding_well_formed(binding):
        raise ValueError("malformed handshake binding")
    return _seal("ticket", k=session_key, i=instance_id, b=binding)


def ticket_redeem(ticket: str, *, instance_id: str, handshake: str) -> str | None:
    """Spends a ticket presented with the browser's handshake cookie value `handshake`.

    Returns the session key in the ticket when it is fresh, untampered, made for `instance_id`, bound to this
    handshake cookie and not spent before (it is spent now); otherwise None. Writes to the database
    (the spent-ticket cache), so call it from a thread, not the event loop.
    """
    payload = _open(ticket, "ticket", instance_id=instance_id, max_age=TICKET_SECONDS)
    if payload is None or not handshake:
        return None
    if not hmac.compare_digest(str(payload.get("b", "")), handshake_binding(handshake)):
        return None
    spent_key = "gateway-ticket:" + hashlib.sha256(ticket.encode()).hexdigest()
    try:
        # add() is atomic across processes: of two redemptions at once, exactly one adds the key.
        first = caches[TICKET_CACHE].add(spent_key, 1, timeout=SPENT_SECONDS)
    finally:
        # Outside Django's request cycle: what request_finished does for a view.
        close_old_connections()
    return payload["k"] if first else None


def lab_cookie_value(*, session_key: str, instance_id: str) -> str:
    """Returns the lab cookie's value for this session and instance (no expiry: the session decides)."""
    return _seal("lab", k=session_key, i=instance_id)


def lab_cookie_session_key(value: str, *, instance_id: str) -> str | None:
    """Returns the session key in a lab cookie made for `instance_id`, else None."""
    payload = _open(value, "lab", instance_id=instance_id, max_age=None)
    return payload["k"] if payload else None


def lab_base_url(instance_id: str) -> str:
    """Returns the lab's origin in subdomain mode ("https://<uuid>.lab.example.com"), or "" in path mode."""
    template = getattr(settings, "GATEWAY_LAB_URL", "")
    return template.format(instance_id=instance_id).rstrip("/") if template else ""
