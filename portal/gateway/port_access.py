"""Who may reach which exposed port (portal/ports), decided afresh on every request.

The owner, signed in to the portal, reaches the open ports of their running instances; anyone else only
through a share link that is neither revoked nor expired, and a link made for a named person only when
that person is signed in. Nothing here is cached; the owner's ALLOW alone is remembered for a few
seconds by the caller (port_hosts.PortHosts._caller_decision), so revoking a link or its expiry refuses
the very next request through it. Staff get no special access, as for the lab.
"""

import threading
import time
from dataclasses import dataclass

from django.db import close_old_connections
from django.utils import timezone

from portal.instances.models import Instance
from portal.ports.models import ExposedPort, ShareLink, share_digest

from .access import Decision, Outcome, session_user

# How often, at most, the traffic of one exposed port is written down for idle culling: the culler
# counts minutes, and a busy app must not cost a write per request.
TRAFFIC_WRITE_SECONDS = 30.0

NOT_EXPOSED = (
    "Nothing is exposed to you at this address. If this is your instance, expose the port from its page "
    "or with `devcloud expose`; if someone shared it with you, ask them for a new link."
)
SHARE_ENDED = "This share link was revoked or has expired. Ask the instance's owner for a new one."
SHARE_SOMEONE_ELSE = "This share link was made for another DevCloud account."


@dataclass(frozen=True)
class PortDecision(Decision):
    # The ExposedPort let in, and the share link that let the caller in (0: the owner).
    exposed_port_id: int = 0
    share_id: int = 0
    port: int = 0
    # Why a refusal is one, for the page or JSON the caller gets.
    message: str = ""


def _endpoint(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def port_access(
    *, label: str, session_key: str | None, share_id: int = 0, share_secret: str = ""
) -> PortDecision:
    """Decides whether the caller may reach the exposed port `label` ("<short id>-<port>").

    The caller is the portal session `session_key` (may be None), plus the share link it came with: by
    id (from its port cookie) or by secret (the link itself). Returns a PortDecision; never raises for
    bad input. Runs database queries, so call it from a thread, not the event loop.
    """
    try:
        exposed = (
            ExposedPort.objects.filter(host_label=label, closed_at__isnull=True)
            .select_related("instance")
            .first()
        )
        user = session_user(session_key)
        share = None
        if (share_id or share_secret) and exposed is None:
            # A link to a port that was closed: nothing to sign in for.
            return PortDecision(Outcome.NOT_FOUND, message=NOT_EXPOSED)
        if share_id or share_secret:
            links = ShareLink.objects.filter(exposed_port=exposed)
            share = (
                links.filter(id=share_id).first()
                if share_id
                else links.filter(secret_digest=share_digest(share_secret)).first()
            )
            if share is None:
                return PortDecision(Outcome.NOT_FOUND, message=SHARE_ENDED)
            if not share.active():
                return PortDecision(Outcome.NOT_FOUND, message=SHARE_ENDED)
            if share.user_id is not None and not user.is_authenticated:
                return PortDecision(Outcome.ANONYMOUS)
            if share.user_id is not None and share.user_id != user.pk:
                return PortDecision(Outcome.NOT_FOUND, message=SHARE_SOMEONE_ELSE)
        elif not user.is_authenticated:
            # Before anything about the port, so an anonymous caller learns nothing of which exist.
            return PortDecision(Outcome.ANONYMOUS)
        if exposed is None or (share is None and exposed.instance.user_id != user.pk):
            return PortDecision(Outcome.NOT_FOUND, message=NOT_EXPOSED)
        instance = exposed.instance
        if instance.state != Instance.State.RUNNING:
            return PortDecision(Outcome.NOT_RUNNING, state=instance.state)
        address = str((instance.driver_state or {}).get("address") or "")
        return PortDecision(
            Outcome.ALLOW,
            endpoint=_endpoint(address, exposed.port) if address else "",
            state=instance.state,
            exposed_port_id=exposed.id,
            share_id=share.id if share else 0,
            port=exposed.port,
        )
    finally:
        # Outside Django's request cycle: what request_finished does for a view.
        close_old_connections()


class TrafficRecorder:
    """Writes ExposedPort.last_traffic_at at most every TRAFFIC_WRITE_SECONDS per port and process."""

    def __init__(self, every: float = TRAFFIC_WRITE_SECONDS):
        self.every = every
        self._written: dict[int, float] = {}
        self._lock = threading.Lock()

    def due(self, exposed_port_id: int) -> bool:
        """Whether this port's traffic should be written now; if so, it counts as written."""
        now = time.monotonic()
        with self._lock:
            last = self._written.get(exposed_port_id)
            if last is not None and now - last < self.every:
                return False
            if len(self._written) > 10_000:
                self._written.clear()
            self._written[exposed_port_id] = now
            return True

    @staticmethod
    def write(exposed_port_id: int) -> None:
        """Records traffic now. Runs a query: call it from a thread."""
        try:
            ExposedPort.objects.filter(id=exposed_port_id).update(last_traffic_at=timezone.now())
        finally:
            close_old_connections()


traffic = TrafficRecorder()
