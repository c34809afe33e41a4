"""Who may open which JupyterLab: the portal session decides, per request.

Only the owner of a running instance gets through. Staff get no special access either: a JupyterLab is
a shell on the owner's code, data and credentials, and operators act on instances (stop, inspect)
from the console, never from inside them.
"""

import enum
import json
import threading
import time
import uuid
from dataclasses import dataclass
from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.signals import user_logged_out
from django.contrib.sessions.models import Session
from django.db import close_old_connections, connection
from django.utils import timezone

from portal.instances.models import Instance


class Outcome(enum.Enum):
    ALLOW = "allow"
    # No session, an expired or flushed one, or an inactive user: sign in again.
    ANONYMOUS = "anonymous"
    # Malformed id, no such instance, or someone else's: indistinguishable on purpose.
    NOT_FOUND = "not_found"
    # The owner's, but not running (queued, provisioning, stopping, stopped, failed).
    NOT_RUNNING = "not_running"


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    # Where JupyterLab answers ("http://127.0.0.1:49153") and the token it wants; set only on ALLOW.
    endpoint: str = ""
    token: str = ""
    state: str = ""

    @property
    def allowed(self) -> bool:
        return self.outcome is Outcome.ALLOW


def parse_instance_id(raw: str) -> uuid.UUID | None:
    """Returns the UUID in `raw`, or None when it is not one (the caller answers 404)."""
    try:
        return uuid.UUID(raw)
    except (ValueError, AttributeError):
        return None


class _SessionReader:
    """The session as `auth.get_user` reads it, minus the key rotation it may ask for.

    After a SECRET_KEY rotation, get_user cycles the session key when the hash matches a fallback
    key. The gateway cannot hand the browser a new cookie, so a rotation here would log the user out
    of the portal. The portal's own next page view rotates it instead. A flush, after a hash that no
    longer verifies, goes through: that session is dead either way.
    """

    def __init__(self, store):
        self._store = store

    def __getitem__(self, key):
        return self._store[key]

    def get(self, key, default=None):
        return self._store.get(key, default)

    def __setitem__(self, key, value):
        pass

    def cycle_key(self):
        pass

    def flush(self):
        self._store.flush()


DATABASE_SESSIONS = "django.contrib.sessions.backends.db"


def session_user(session_key: str | None, *, session_data: str | None = None):
    """Returns the active user signed in with `session_key`, or AnonymousUser.

    Uses Django's own session engine and `auth.get_user`, so expiry, logout (a flushed session) and a
    password change (the session hash no longer verifies) all end access exactly as they end the
    portal session. Never raises for a bad key. `session_data` is the session's row as already read
    (`_session_with_instance`), so the store need not read it again.
    """
    if not session_key:
        return AnonymousUser()
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if session_data is not None:
        # What SessionBase._get_session would load from the row.
        store._session_cache = store.decode(session_data)
    user = auth.get_user(SimpleNamespace(session=_SessionReader(store)))
    # Some backends (social-auth's) load the user without looking at is_active; a deleted or
    # deactivated account must lose its instances' JupyterLab at once.
    if not user.is_authenticated or not user.is_active or getattr(user, "deleted_at", None) is not None:
        return AnonymousUser()
    return user


def _session_with_instance(session_key: str, instance_id: uuid.UUID | None) -> tuple | None:
    """(session data, instance owner's id, instance row) for an unexpired session, in one query.

    None when there is no such session; the owner and row are None when there is no such instance. The
    row has the fields access_check reads; it is looked at only once the session's user is known to
    own the instance. Plain SQL: this runs on the
    first request of every lab session, and compiling the equivalent queryset cost more than the
    round trip it saves.
    """
    quote = connection.ops.quote_name
    instance_pk = Instance._meta.pk

    def column(model, name: str) -> str:
        return quote(model._meta.get_field(name).column)

    sql = (
        f"SELECT s.{column(Session, 'session_data')}, i.{column(Instance, 'user')}, "
        f"i.{column(Instance, 'state')}, i.{column(Instance, 'driver_state')}, "
        f"i.{column(Instance, 'jupyter_token')} "
        f"FROM {quote(Session._meta.db_table)} s LEFT JOIN {quote(Instance._meta.db_table)} i "
        f"ON i.{quote(instance_pk.column)} = %s "
        f"WHERE s.{column(Session, 'session_key')} = %s AND s.{column(Session, 'expire_date')} > %s"
    )
    params = [
        instance_pk.get_db_prep_value(instance_id, connection) if instance_id is not None else None,
        session_key,
        connection.ops.adapt_datetimefield_value(timezone.now()),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    session_data, user_id, state, driver_state, token = row
    if isinstance(driver_state, str):
        driver_state = json.loads(driver_state)
    if user_id is None:
        return session_data, None, None
    owner = Instance._meta.get_field("user").target_field.to_python(user_id)
    return session_data, owner, {"state": state, "driver_state": driver_state, "jupyter_token": token}


def access_check(*, session_key: str | None, instance_id: str) -> Decision:
    """Decides whether the browser holding `session_key` may open instance `instance_id`'s JupyterLab.

    Returns a Decision; never raises for bad input. Runs database queries, so call it from a thread,
    not the event loop. The session is checked before the instance, so an anonymous browser learns
    nothing about which ids exist. With sessions in the database (the default), the session and the
    instance are read in one query, and the user in a second: the first request of a session waits
    on two round trips instead of three.
    """
    try:
        parsed = parse_instance_id(instance_id)
        if session_key and settings.SESSION_ENGINE == DATABASE_SESSIONS:
            found = _session_with_instance(session_key, parsed)
            if found is None:
                return Decision(Outcome.ANONYMOUS)
            session_data, owner, row = found
            user = session_user(session_key, session_data=session_data)
            if not user.is_authenticated:
                return Decision(Outcome.ANONYMOUS)
            if owner != user.pk:
                row = None
        else:
            user = session_user(session_key)
            if not user.is_authenticated:
                return Decision(Outcome.ANONYMOUS)
            row = None
            if parsed is not None:
                row = (
                    Instance.objects.filter(id=parsed, user_id=user.pk)
                    .values("state", "driver_state", "jupyter_token")
                    .first()
                )
        if row is None:
            return Decision(Outcome.NOT_FOUND)
        if row["state"] != Instance.State.RUNNING:
            return Decision(Outcome.NOT_RUNNING, state=row["state"])
        endpoint = str((row["driver_state"] or {}).get("endpoint") or "").rstrip("/")
        return Decision(Outcome.ALLOW, endpoint=endpoint, token=row["jupyter_token"], state=row["state"])
    finally:
        # The gateway's threads live outside Django's request cycle; this is what request_finished
        # does for a view, so CONN_MAX_AGE is honoured and no connection is leaked.
        close_old_connections()


class DecisionCache:
    """Remembers ALLOW decisions for a few seconds, keyed by (session key, instance id).

    Opening JupyterLab fires a hundred requests within a second; without this each one costs a session
    read, a user read and an instance read. It is safe because:
    - the key includes the session key, a secret only that browser holds, so an entry can only ever
      answer the same browser that was just allowed;
    - only ALLOW is cached, so a denial is always fresh and an instance that just became ready opens
      at once;
    - revocation (logout, deactivation, stop) is late by at most `ttl` seconds; logout in this process
      evicts at once (see `_evict_on_logout`), and a stopped instance's JupyterLab is gone anyway.
    """

    def __init__(self, ttl: float = 3.0, max_entries: int = 10_000):
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[float, Decision]] = {}
        self._lock = threading.Lock()

    def get(self, session_key: str, instance_id: str) -> Decision | None:
        """Returns the cached decision, or None when there is none or it expired."""
        with self._lock:
            entry = self._entries.get((session_key, instance_id))
            if entry is None:
                return None
            expires_at, decision = entry
            if expires_at < time.monotonic():
                del self._entries[(session_key, instance_id)]
                return None
            return decision

    def put(self, session_key: str, instance_id: str, decision: Decision) -> None:
        if not decision.allowed or not session_key or self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                now = time.monotonic()
                self._entries = {k: v for k, v in self._entries.items() if v[0] >= now}
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
            self._entries[(session_key, instance_id)] = (time.monotonic() + self.ttl, decision)

    def forget_session(self, session_key: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == session_key]:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


decision_cache = DecisionCache()


def _evict_on_logout(sender, request, user, **kwargs):
    # Runs before the session is flushed, while the old key is still known.
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        decision_cache.forget_session(session_key)


user_logged_out.connect(_evict_on_logout, dispatch_uid="gateway_evict_on_logout")
