"""The gateway as an ASGI app, and the router that puts it next to Django in portal.asgi.

Routes it answers (everything else is Django's):
- /instances/<uuid>/lab/...  HTTP and websocket, proxied to that instance's JupyterLab for its owner;
- /instances/<uuid>/open     where "Open JupyterLab" links: the lab path here, or a ticket to the
                             instance's subdomain in production (see tickets.py);
- /instances/<uuid>/redeem   on the lab's subdomain: turns a ticket into the lab cookie;
- /instances/<uuid>/auth     nginx `auth_request` target for production (docs/gateway.md);
- /ports/<label>/open        where an exposed port's address sends a browser to sign in, and where share
                             links point: a ticket to the port's own host (port_hosts.py);
- every path on an exposed port's own host (`<short id>-<port>.<lab domain>`), HTTP and websocket,
                             proxied to that port of the instance for its owner or a share link's holder.
"""

import asyncio
import hmac
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http.cookie import parse_cookie

from portal.ports.addresses import label_of_host

from . import lab_path, pages, tickets
from .access import Decision, Outcome, access_check, decision_cache
from .headers import decoded_headers, origin_allowed, strip_portal_cookies
from .http_proxy import new_client, path_with_query, proxy_http, query_value, reply
from .lab_upstream import close_lab_upstream
from .pages import redirect, set_cookie
from .port_hosts import PortHosts
from .ws_proxy import proxy_websocket, refuse

logger = logging.getLogger(__name__)

LAB_PATH = re.compile(r"^/instances/(?P<instance_id>[^/]+)/lab(?:/|$)")
AUTH_PATH = re.compile(r"^/instances/(?P<instance_id>[^/]+)/auth/?$")
OPEN_PATH = re.compile(r"^/instances/(?P<instance_id>[^/]+)/open/?$")
REDEEM_PATH = re.compile(r"^/instances/(?P<instance_id>[^/]+)/redeem/?$")
PORT_OPEN_PATH = re.compile(r"^/ports/(?P<label>[^/]+)/open/?$")
NOT_FOUND = pages.Reply(404, [(b"content-type", b"text/plain")], b"Not found")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class Gateway:
    """Authorises each request by the portal session and proxies it to the instance's JupyterLab."""

    def __init__(self, *, cache=decision_cache, access_threads: int = 4, recheck_seconds: float = 60.0):
        self.cache = cache
        # Session and instance reads run here rather than in asgiref's single thread-sensitive thread,
        # so a slow Django view never holds up JupyterLab traffic (and vice versa).
        self._pool = ThreadPoolExecutor(max_workers=access_threads, thread_name_prefix="gateway-access")
        self._client = None
        self._client_loop = None
        # How often an open websocket checks that its user may still use it.
        self.recheck_seconds = recheck_seconds
        self.ports = PortHosts(self)

    @staticmethod
    def handles(path: str) -> bool:
        return any(
            route.match(path) for route in (LAB_PATH, AUTH_PATH, OPEN_PATH, REDEEM_PATH, PORT_OPEN_PATH)
        )

    @staticmethod
    def port_label(scope) -> str | None:
        """The exposed port's label when the request is for an exposed port's own host, else None."""
        for name, value in scope.get("headers", []):
            if name == b"host":
                return label_of_host(value.decode("latin-1"))
        return None

    def claims(self, scope) -> bool:
        """Whether the gateway answers this request rather than Django: a gateway path, or any path on
        an exposed port's host."""
        return self.handles(scope["path"]) or self.port_label(scope) is not None

    def client(self):
        # The client pools connections on one event loop; a second loop (tests start servers in
        # threads) gets its own client.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client, self._client_loop = new_client(), loop
        return self._client

    async def aclose(self) -> None:
        close_lab_upstream()
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.close()
        self._client = None

    @staticmethod
    def session_key(headers: dict[str, str], instance_id: str) -> str | None:
        """The portal session this request acts for: from the lab cookie (subdomain mode) or the portal's."""
        cookies = parse_cookie(headers.get("cookie", ""))
        lab_cookie = cookies.get(tickets.lab_cookie_name())
        if lab_cookie:
            session_key = tickets.lab_cookie_session_key(lab_cookie, instance_id=instance_id)
            if session_key:
                return session_key
        return cookies.get(settings.SESSION_COOKIE_NAME)

    async def decide(
        self,
        headers: dict[str, str],
        instance_id: str,
        *,
        fresh: bool = False,
        session_key: str | None = None,
    ) -> Decision:
        """Returns the access decision for this request's session and `instance_id`."""
        session_key = session_key or self.session_key(headers, instance_id)
        if session_key and not fresh:
            cached = self.cache.get(session_key, instance_id)
            if cached is not None:
                return cached
        check = partial(access_check, session_key=session_key, instance_id=instance_id)
        decision = await asyncio.get_running_loop().run_in_executor(self._pool, check)
        if session_key:
            self.cache.put(session_key, instance_id, decision)
        return decision

    def cached_lab_get(self, scope) -> tuple[Decision, str, dict[str, str]] | None:
        """(decision, lab prefix, decoded headers) when `scope` is a lab GET the fast path may forward
        (fast_path.py).

        That is a GET without a body, on the lab's own host in subdomain mode, from a session whose
        ALLOW (with an endpoint) is in the decision cache: exactly the requests `_lab_http` would
        forward without reading the database. Anything else is None and goes the general way.
        """
        if scope["method"] != "GET":
            return None
        lab = LAB_PATH.match(scope["path"])
        if lab is None or self.port_label(scope) is not None:
            return None
        headers = decoded_headers(scope)
        if "content-length" in headers or "transfer-encoding" in headers or "expect" in headers:
            return None
        instance_id = lab["instance_id"]
        if self._off_lab_host(headers, instance_id):
            return None
        session_key = self.session_key(headers, instance_id)
        decision = self.cache.get(session_key, instance_id) if session_key else None
        if decision is None or not decision.allowed or not decision.endpoint:
            return None
        return decision, f"/instances/{instance_id}/lab/", headers

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        port_label = self.port_label(scope)
        if port_label is not None:
            # An exposed port's host belongs to the instance's app, whatever the path.
            return await self.ports.serve(scope, receive, send, port_label)
        lab = LAB_PATH.match(path)
        if scope["type"] == "http" and lab:
            await self._lab_http(scope, receive, send, lab["instance_id"])
        elif scope["type"] == "websocket" and lab:
            await self._lab_websocket(scope, receive, send, lab["instance_id"])
        elif scope["type"] == "http" and AUTH_PATH.match(path):
            await self._auth_request(scope, send, AUTH_PATH.match(path)["instance_id"])
        elif scope["type"] == "http" and OPEN_PATH.match(path):
            await self._open(scope, send, OPEN_PATH.match(path)["instance_id"])
        elif scope["type"] == "http" and REDEEM_PATH.match(path):
            await self._redeem(scope, send, REDEEM_PATH.match(path)["instance_id"])
        elif scope["type"] == "http" and PORT_OPEN_PATH.match(path):
            await self.ports.open(scope, send, PORT_OPEN_PATH.match(path)["label"])
        elif scope["type"] == "websocket":
            await refuse(scope, send, 404)
        else:
            await reply(send, NOT_FOUND)

    @staticmethod
    def _off_lab_host(headers: dict[str, str], instance_id: str) -> bool:
        """In subdomain mode, whether this lab request arrived on another host than the lab's own.

        Serving a lab on the portal's host would put the instance's code in the portal's origin, which
        is what subdomain mode exists to prevent, so such requests are sent through /open instead.
        """
        lab_origin = tickets.lab_base_url(instance_id)
        return bool(lab_origin) and urlsplit(lab_origin).netloc.lower() != headers.get("host", "").lower()

    async def _lab_http(self, scope, receive, send, instance_id: str) -> None:
        headers = decoded_headers(scope)
        if self._off_lab_host(headers, instance_id):
            if scope["method"] in ("GET", "HEAD") and pages.wants_html(headers):
                return await reply(send, redirect(f"/instances/{instance_id}/open"))
            return await reply(send, NOT_FOUND)
        decision = await self.decide(headers, instance_id)
        head = scope["method"] == "HEAD"
        refusal = self._refusal(scope, headers, decision)
        if refusal:
            return await reply(send, refusal, head=head)
        if scope["method"] not in SAFE_METHODS and not origin_allowed(scope, headers):
            return await reply(send, pages.forbidden_origin(headers), head=head)
        if not decision.endpoint:
            return await reply(send, pages.upstream_down(headers, path_with_query(scope)), head=head)
        prefix = f"/instances/{instance_id}/lab/"
        await proxy_http(scope, receive, send, client=self.client(), decision=decision, prefix=prefix)

    async def _lab_websocket(self, scope, receive, send, instance_id: str) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        headers = decoded_headers(scope)
        if self._off_lab_host(headers, instance_id):
            return await refuse(scope, send, 404)
        decision = await self.decide(headers, instance_id)
        statuses = {Outcome.ANONYMOUS: 401, Outcome.NOT_FOUND: 404, Outcome.NOT_RUNNING: 409}
        if not decision.allowed:
            return await refuse(scope, send, statuses[decision.outcome])
        if not origin_allowed(scope, headers):
            # Cross-site websocket hijacking: the browser attaches cookies to any site's handshake.
            return await refuse(scope, send, 403)
        if not decision.endpoint:
            return await refuse(scope, send, 502)

        async def still_allowed() -> bool:
            return (await self.decide(headers, instance_id, fresh=True)).allowed

        await proxy_websocket(
            scope,
            receive,
            send,
            decision=decision,
            still_allowed=still_allowed,
            recheck_seconds=self.recheck_seconds,
        )

    async def _auth_request(self, scope, send, instance_id: str) -> None:
        """nginx `auth_request`: 204 with where and how to reach JupyterLab, or 401/403.

        Only a caller presenting GATEWAY_AUTH_SECRET (nginx) gets an answer, because the answer contains
        the Jupyter token; anyone else gets a bare 403 (404 when no secret is configured: the route is
        off). nginx treats any status other than 2xx, 401 and 403 as a server error, so "no such
        instance", "not running" and "another site's Origin" are 403 here, with the gateway's own status
        in X-DevCloud-Status. nginx must pass the original Host (`$http_host`), the scheme
        (X-Forwarded-Proto) and the browser's Origin and Cookie headers. The 204 also carries the Cookie
        header the instance may see (X-DevCloud-Cookie), so nginx strips exactly what the gateway does.
        nginx caches the 204 for a few seconds, keyed by everything this reads from the request.
        """
        headers = decoded_headers(scope)
        secret = getattr(settings, "GATEWAY_AUTH_SECRET", "")
        no_store = (b"cache-control", b"no-store")
        if scope["method"] not in ("GET", "HEAD") or not secret:
            return await reply(send, NOT_FOUND)
        # Bytes, not str: compare_digest refuses str with non-ASCII characters (a TypeError, a 500).
        presented = headers.get("x-devcloud-gateway-secret", "").encode("latin-1")
        if not hmac.compare_digest(presented, secret.encode()):
            return await reply(send, pages.Reply(403, [no_store]))
        # Fresh: nginx remembers this answer itself (docs/gateway.md). Were it answered from the decision
        # cache too, nginx could renew an entry from one that was about to lapse, and an ended session
        # would keep its lab for both lifetimes added up.
        decision = await self.decide(headers, instance_id, fresh=True)
        if not origin_allowed(scope, headers):
            # JupyterLab skips its own Origin check for token-authenticated requests, and nginx adds
            # the token, so this is where another site's websocket or fetch is stopped.
            answer = pages.Reply(403, [(b"x-devcloud-status", b"403"), no_store])
        elif decision.allowed and decision.endpoint:
            answer = pages.Reply(
                204,
                [
                    (b"x-devcloud-upstream", decision.endpoint.encode()),
                    (b"x-devcloud-token", decision.token.encode()),
                    (b"x-devcloud-cookie", strip_portal_cookies(headers.get("cookie", "")).encode("latin-1")),
                    no_store,
                ],
            )
        elif decision.outcome is Outcome.ANONYMOUS:
            answer = pages.Reply(401, [(b"x-devcloud-status", b"401"), no_store])
        else:
            status = {Outcome.NOT_FOUND: b"404", Outcome.NOT_RUNNING: b"409"}.get(decision.outcome, b"502")
            answer = pages.Reply(403, [(b"x-devcloud-status", status), no_store])
        await reply(send, answer)

    async def _open(self, scope, send, instance_id: str) -> None:
        """Where "Open JupyterLab" points: checks the portal session, then sends the browser to the lab.

        In path mode that is /instances/<uuid>/lab/ on this host. In subdomain mode (GATEWAY_LAB_URL set)
        the portal cookie cannot go to the lab host, so the hosts hand the session over (tickets.py): a
        request without `handshake=` is sent to the lab host to get a handshake cookie; one with it (the
        lab host sent it back) gets a ticket bound to that cookie.
        """
        headers = decoded_headers(scope)
        if scope["method"] not in ("GET", "HEAD"):
            return await reply(send, NOT_FOUND)
        session_key = parse_cookie(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME)
        decision = await self.decide(headers, instance_id, session_key=session_key)
        # After signing in, the browser comes back without the handshake, which will have expired.
        refusal = self._refusal({**scope, "query_string": b""}, headers, decision)
        if refusal:
            return await reply(send, refusal)
        lab_origin = tickets.lab_base_url(instance_id)
        binding = query_value(scope, "handshake")
        if not lab_origin:
            location = lab_path(instance_id)
        elif not tickets.binding_well_formed(binding):
            location = f"{lab_origin}/instances/{instance_id}/redeem"
        else:
            ticket = tickets.ticket_issue(session_key=session_key, instance_id=instance_id, binding=binding)
            location = f"{lab_origin}/instances/{instance_id}/redeem?{urlencode({'ticket': ticket})}"
        await reply(send, redirect(location))

    async def _redeem(self, scope, send, instance_id: str) -> None:
        """On the lab host: the two lab-host steps of the handshake (tickets.py).

        Without a ticket it gives this browser a fresh handshake cookie and sends it back to the portal's
        /open with the cookie's hash. With one, it exchanges the ticket for the lab cookie, provided the
        ticket is bound to this browser's handshake cookie and unspent, then enters JupyterLab.
        """
        headers = decoded_headers(scope)
        if scope["method"] not in ("GET", "HEAD"):
            return await reply(send, pages.link_expired(headers))
        ticket = query_value(scope, "ticket")
        if not ticket:
            value, binding = tickets.handshake_new()
            back = f"{settings.SITE_URL}/instances/{instance_id}/open?{urlencode({'handshake': binding})}"
            answer = redirect(back)
            answer.headers.append(
                set_cookie(tickets.handshake_cookie_name(), value, tickets.HANDSHAKE_SECONDS)
            )
            return await reply(send, answer)
        handshake = parse_cookie(headers.get("cookie", "")).get(tickets.handshake_cookie_name(), "")
        redeem = partial(tickets.ticket_redeem, ticket, instance_id=instance_id, handshake=handshake)
        session_key = await asyncio.get_running_loop().run_in_executor(self._pool, redeem)
        if not session_key:
            return await reply(send, pages.link_expired(headers))
        decision = await self.decide(headers, instance_id, session_key=session_key, fresh=True)
        if not decision.allowed:
            # Logged out or stopped since the ticket was issued: the portal says which, on its own host.
            return await reply(send, redirect(f"{settings.SITE_URL}/instances/{instance_id}/open"))
        answer = redirect(lab_path(instance_id))
        lab_cookie = tickets.lab_cookie_value(session_key=session_key, instance_id=instance_id)
        answer.headers.append(set_cookie(tickets.lab_cookie_name(), lab_cookie))
        # Spent: the handshake has done its job.
        answer.headers.append(set_cookie(tickets.handshake_cookie_name(), "", 0))
        await reply(send, answer)

    @staticmethod
    def _refusal(scope, headers, decision: Decision) -> pages.Reply | None:
        """The page for a decision that is not ALLOW, or None."""
        if decision.outcome is Outcome.ANONYMOUS:
            return pages.sign_in(scope["method"], path_with_query(scope), headers)
        if decision.outcome is Outcome.NOT_FOUND:
            return pages.not_found(headers)
        if decision.outcome is Outcome.NOT_RUNNING:
            return pages.not_running(headers, decision.state)
        return None


class Router:
    """Sends JupyterLab routes to the gateway and everything else to Django; answers lifespan itself.

    Django's ASGI handler refuses lifespan and websocket scopes, so the router owns startup and
    shutdown (closing the gateway's connection pool) and refuses websockets Django would not handle.
    """

    def __init__(self, *, django_app, gateway: Gateway):
        self.django_app = django_app
        self.gateway = gateway

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] in ("http", "websocket") and self.gateway.claims(scope):
            await self.gateway(scope, receive, send)
        elif scope["type"] == "websocket":
            await refuse(scope, send, 404)
        else:
            await self.django_app(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.gateway.aclose()
                except Exception:
                    logger.exception("gateway: closing the upstream client failed")
                await send({"type": "lifespan.shutdown.complete"})
                return
