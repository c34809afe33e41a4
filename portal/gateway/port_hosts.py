"""Exposed ports (portal/ports) through the gateway: each at its own host, `<short id>-<port>.<lab domain>`.

A port's host is an origin of its own, apart from the portal's and the lab's, so the portal session
never reaches it. A browser is let in as for a lab on its subdomain (tickets.py), with the same cookie
names, so the same rules keep them from the instance:
1. A request to the port's host without its cookie is sent to the portal's /ports/<label>/open (a share
   link points there too, with `share=<secret>`). The portal checks the session or the share link.
2. /open sends the browser to the port host's /_devcloud/redeem, which gives it a handshake cookie and
   sends it back to /open with the cookie's hash; /open then hands out a ticket bound to that hash.
3. /_devcloud/redeem?ticket=... spends the ticket once and sets the port's cookie: the session key
   and the share link's id, encrypted, bound to this port. It then redirects to the page first asked for.
4. Every request on the port's host decrypts that cookie and decides (port_access.py): afresh for a
   share link's holder, so a revoked or expired link is refused at once; for the owner from the lab's
   decision cache when it allowed them in the last few seconds (PortHosts._caller_decision says why).

Then the request goes to the instance's port as a lab request goes to JupyterLab (http_proxy.py,
ws_proxy.py): streamed both ways chunk by chunk, the portal's cookies stripped, the instance's
Set-Cookie headers filtered, no token added. /_devcloud/ is the one path the app cannot have.
"""

import asyncio
from functools import partial
from urllib.parse import urlencode

from django.conf import settings
from django.http.cookie import parse_cookie

from portal.ports.addresses import port_origin

from . import pages, tickets
from .access import Outcome
from .headers import decoded_headers, origin_allowed
from .http_proxy import path_with_query, proxy_http, query_value, reply
from .port_access import PortDecision, port_access, traffic
from .ws_proxy import proxy_websocket, refuse

REDEEM = "/_devcloud/redeem"
TICKET = "port-ticket"
COOKIE = "port"
# An open websocket to an exposed port checks this often that it is still allowed (a share link
# revoked, the port closed) and counts as traffic for idle culling.
RECHECK_SECONDS = 10.0


def _local_path(value: str) -> str:
    """`value` when it is a path on this host ("/..."), else "/": the redirect after sign-in goes nowhere else."""
    return value if value.startswith("/") and not value.startswith("//") and "\\" not in value else "/"


class PortHosts:
    """The gateway's half for exposed ports; shares the gateway's client and thread pool."""

    def __init__(self, gateway):
        self.gateway = gateway

    async def _decide(self, **kwargs) -> PortDecision:
        check = partial(port_access, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.gateway._pool, check)

    async def _run(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self.gateway._pool, function, *args)

    def _open_url(self, label: str, **query) -> str:
        query = {name: value for name, value in query.items() if value}
        return f"{settings.SITE_URL}/ports/{label}/open" + (f"?{urlencode(query)}" if query else "")

    @staticmethod
    def _refusal(scope, headers, decision: PortDecision) -> pages.Reply | None:
        if decision.outcome is Outcome.ANONYMOUS:
            return pages.sign_in(scope["method"], path_with_query(scope), headers)
        if decision.outcome is Outcome.NOT_FOUND:
            return pages.port_refused(headers, decision.message)
        if decision.outcome is Outcome.NOT_RUNNING:
            return pages.port_not_running(headers, decision.state)
        return None

    # --- On the portal's host ---------------------------------------------------------------------

    async def open(self, scope, send, label: str) -> None:
        """/ports/<label>/open: checks the session or the share link, then hands the browser a ticket for
        the port's host (after the handshake that binds it to this browser)."""
        headers = decoded_headers(scope)
        if scope["method"] not in ("GET", "HEAD"):
            return await reply(send, pages.Reply(404, [(b"content-type", b"text/plain")], b"Not found"))
        session_key = parse_cookie(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME)
        share = query_value(scope, "share")
        after = _local_path(query_value(scope, "next"))
        decision = await self._decide(label=label, session_key=session_key, share_secret=share)
        # After signing in, the browser comes back here without the handshake, which will have expired.
        sign_in_scope = {
            **scope,
            "query_string": urlencode({k: v for k, v in (("share", share), ("next", after)) if v}).encode(),
        }
        refusal = self._refusal(sign_in_scope, headers, decision)
        if refusal:
            return await reply(send, refusal)
        binding = query_value(scope, "handshake")
        if not tickets.binding_well_formed(binding):
            query = urlencode({k: v for k, v in (("share", share), ("next", after)) if v})
            return await reply(
                send, pages.redirect(f"{port_origin(label)}{REDEEM}" + (f"?{query}" if query else ""))
            )
        ticket = tickets.seal(TICKET, i=label, k=session_key or "", s=decision.share_id, b=binding, n=after)
        await reply(send, pages.redirect(f"{port_origin(label)}{REDEEM}?{urlencode({'ticket': ticket})}"))

    # --- On the port's own host -------------------------------------------------------------------

    async def serve(self, scope, receive, send, label: str) -> None:
        if scope["type"] == "http" and scope["path"] == REDEEM:
            await self._redeem(scope, send, label)
        elif scope["type"] == "http":
            await self._http(scope, receive, send, label)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send, label)

    async def _redeem(self, scope, send, label: str) -> None:
        headers = decoded_headers(scope)
        if scope["method"] not in ("GET", "HEAD"):
            return await reply(send, pages.port_refused(headers, "Not found."))
        ticket = query_value(scope, "ticket")
        if not ticket:
            value, binding = tickets.handshake_new()
            back = self._open_url(
                label, handshake=binding, share=query_value(scope, "share"), next=query_value(scope, "next")
            )
            answer = pages.redirect(back)
            answer.headers.append(
                pages.set_cookie(tickets.handshake_cookie_name(), value, tickets.HANDSHAKE_SECONDS)
            )
            return await reply(send, answer)
        payload = tickets.unseal(ticket, TICKET, max_age=tickets.TICKET_SECONDS)
        handshake = parse_cookie(headers.get("cookie", "")).get(tickets.handshake_cookie_name(), "")
        if (
            payload is None
            or payload.get("i") != label
            or not handshake
            or payload.get("b") != tickets.handshake_binding(handshake)
            or not await self._run(tickets.spend, ticket)
        ):
            return await reply(send, pages.link_expired(headers))
        session_key, share_id = payload.get("k") or None, int(payload.get("s") or 0)
        decision = await self._decide(label=label, session_key=session_key, share_id=share_id)
        if not decision.allowed:
            return await reply(send, self._refusal(scope, headers, decision) or pages.link_expired(headers))
        answer = pages.redirect(_local_path(str(payload.get("n") or "/")))
        cookie = tickets.seal(COOKIE, i=label, k=session_key or "", s=share_id)
        answer.headers.append(pages.set_cookie(tickets.lab_cookie_name(), cookie))
        answer.headers.append(pages.set_cookie(tickets.handshake_cookie_name(), "", 0))
        await reply(send, answer)

    def _caller(self, headers, label: str) -> tuple[str | None, int] | None:
        """(session key, share link id) from the port's cookie, or None when it has none for this port."""
        value = parse_cookie(headers.get("cookie", "")).get(tickets.lab_cookie_name())
        payload = tickets.unseal(value, COOKIE, max_age=None) if value else None
        if payload is None or payload.get("i") != label:
            return None
        return payload.get("k") or None, int(payload.get("s") or 0)

    async def _caller_decision(self, label: str, session_key: str | None, share_id: int) -> PortDecision:
        """The decision for a request on the port's host.

        The owner's ALLOW is remembered for the lab's few seconds (the gateway's DecisionCache, keyed by
        the session and the port), so a page's burst of requests reads the database once: the owner
        could reach their own port from JupyterLab anyway, so a close that takes a moment to reach
        their own browser exposes nothing, and a logout evicts the entry as for the lab. A share link's
        holder is decided afresh on every request: a revoked or expired link is refused at once.
        """
        key = f"port:{label}"
        if session_key and not share_id:
            cached = self.gateway.cache.get(session_key, key)
            if cached is not None:
                return cached
        decision = await self._decide(label=label, session_key=session_key, share_id=share_id)
        if session_key and not share_id:
            self.gateway.cache.put(session_key, key, decision)
        return decision

    async def _record_traffic(self, decision: PortDecision) -> None:
        if traffic.due(decision.exposed_port_id):
            await self._run(traffic.write, decision.exposed_port_id)

    async def _http(self, scope, receive, send, label: str) -> None:
        headers = decoded_headers(scope)
        head = scope["method"] == "HEAD"
        caller = self._caller(headers, label)
        decision = None
        if caller is not None:
            decision = await self._caller_decision(label, *caller)
        if caller is None or decision.outcome is Outcome.ANONYMOUS:
            # Not signed in on this host (or the session ended): the portal decides who this is.
            if scope["method"] in ("GET", "HEAD"):
                return await reply(send, pages.redirect(self._open_url(label, next=path_with_query(scope))))
            return await reply(
                send, pages.sign_in(scope["method"], path_with_query(scope), headers), head=head
            )
        refusal = self._refusal(scope, headers, decision)
        if refusal:
            return await reply(send, refusal, head=head)
        if scope["method"] not in ("GET", "HEAD", "OPTIONS") and not origin_allowed(scope, headers):
            return await reply(send, pages.forbidden_origin(headers), head=head)
        down = partial(pages.port_down, port=decision.port)
        if not decision.endpoint:
            return await reply(send, down(headers, path_with_query(scope)), head=head)
        await self._record_traffic(decision)
        await proxy_http(
            scope, receive, send, client=self.gateway.client(), decision=decision, prefix="/", down=down
        )

    async def _websocket(self, scope, receive, send, label: str) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        headers = decoded_headers(scope)
        caller = self._caller(headers, label)
        if caller is None:
            return await refuse(scope, send, 401)
        decision = await self._caller_decision(label, *caller)
        statuses = {Outcome.ANONYMOUS: 401, Outcome.NOT_FOUND: 404, Outcome.NOT_RUNNING: 409}
        if not decision.allowed:
            return await refuse(scope, send, statuses[decision.outcome])
        if not origin_allowed(scope, headers):
            return await refuse(scope, send, 403)
        if not decision.endpoint:
            return await refuse(scope, send, 502)
        await self._record_traffic(decision)

        async def still_allowed() -> bool:
            now = await self._decide(label=label, session_key=caller[0], share_id=caller[1])
            if now.allowed:
                # An open websocket is use, even when no frame crossed it since the last check.
                await self._record_traffic(now)
            return now.allowed

        await proxy_websocket(
            scope,
            receive,
            send,
            decision=decision,
            still_allowed=still_allowed,
            recheck_seconds=RECHECK_SECONDS,
            upstream_name=f"The app on port {decision.port}",
        )
