"""uvicorn's HTTP protocol with the gateway's fast path: a lab GET whose access is already known is
forwarded below the ASGI layers.

Run as `uvicorn portal.asgi:application --http portal.gateway.fast_path:LabHttpProtocol` (the deploy kit's
web unit and `make run` do). For each request uvicorn has parsed, the protocol asks the gateway whether
it is a plain GET to a lab path from a session whose ALLOW decision the gateway holds in its cache
(`Gateway.cached_lab_get`: the same host, session and decision checks as the general path). If so it
sends the request to JupyterLab with the lean client in lab_upstream.py and writes the answer back as
uvicorn's own response writer would, with the headers filtered exactly as the general path filters them
(headers.py), all in event-loop callbacks. Everything else, and every answer that client declines
(HTML to scrub, large or streamed bodies, a JupyterLab it cannot reach), goes through the ASGI
application as before, so the fast path can only ever answer what the general path would have
answered, the same way.

What it saves is a task per request, the proxy-headers middleware, the router, the instrumented
wrapper, aiohttp's request and response objects and the ASGI message traffic: on this hardware that was
about half of what the gateway added to a JupyterLab poll (benchmarks/bench_gateway.py times both paths).
"""

import asyncio
import logging
import time

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from . import pages
from .headers import downstream_response_headers, upstream_request_headers
from .http_proxy import path_with_query, reply
from .lab_upstream import Declined, TimedOut, lab_upstream

logger = logging.getLogger(__name__)

_gateway = None
_observe = None


def serve(gateway, *, observe=None) -> None:
    """Makes `gateway` the one LabHttpProtocol consults; `observe(seconds)` records each fast answer's
    time to its response headers (the gateway latency metric, route "lab")."""
    global _gateway, _observe
    _gateway, _observe = gateway, observe


def request_bytes(scope, decision, headers: dict[str, str] | None = None) -> bytes:
    """The GET as JupyterLab receives it: the raw path and query as the browser sent them, and the
    headers upstream_request_headers allows (portal cookies stripped, the token added)."""
    target = scope["raw_path"]
    if scope["query_string"]:
        target += b"?" + scope["query_string"]
    netloc = decision.endpoint.split("://", 1)[1].encode("latin-1")
    lines = [b"GET ", target, b" HTTP/1.1\r\nhost: ", netloc, b"\r\n"]
    for name, value in upstream_request_headers(scope, decision.token, decision.endpoint, headers):
        lines += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    lines.append(b"\r\n")
    return b"".join(lines)


class LabHttpProtocol(HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        """Takes a lab GET the gateway has just allowed onto the fast path; leaves the rest to uvicorn."""
        exchange = self._fast_exchange()
        if exchange is None:
            return super().on_headers_complete()
        # The exchange stands in for uvicorn's RequestResponseCycle: it has the attributes the protocol
        # reads and writes (a disconnect, a shutdown, the next pipelined request), and its own writer.
        self.cycle = exchange
        exchange.begin()

    def _fast_exchange(self) -> "_Exchange | None":
        gateway = _gateway
        if (
            gateway is None
            or self.parser.get_method() != b"GET"
            or self.parser.should_upgrade()
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.limit_concurrency is not None
            or self.root_path
        ):
            return None
        url = httptools.parse_url(self.url)
        raw_path = url.path
        # A percent-encoded or non-ASCII path is left to uvicorn's own reading of it.
        if b"%" in raw_path or not raw_path.isascii():
            return None
        http_version = self.parser.get_http_version()
        scope = self.scope
        scope["method"], scope["path"], scope["raw_path"] = "GET", raw_path.decode("ascii"), raw_path
        scope["query_string"] = url.query or b""
        if http_version != "1.1":
            scope["http_version"] = http_version
        found = gateway.cached_lab_get(scope)
        if found is None:
            return None
        keep_alive = http_version != "1.0" and self.parser.should_keep_alive()
        return _Exchange(self, *found, keep_alive=keep_alive)

    def start_general(self, exchange: "_Exchange", app=None) -> None:
        """Hands the exchange's request to `app` (the ASGI application by default) as uvicorn would have."""
        cycle = RequestResponseCycle(
            scope=exchange.scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=exchange.keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.more_body, cycle.disconnected = exchange.more_body, exchange.disconnected
        if self.cycle is exchange:
            self.cycle = cycle
        super()._start_asgi_task(cycle, app or self.app)


class _NoWaiters:
    """The cycle's message event, which only an ASGI application's receive() would wait on."""

    def set(self) -> None:
        pass


class _Exchange:
    """One lab GET on the fast path, from the browser's request to JupyterLab's answer written back.

    Callbacks all the way when a pooled connection is free; a task only to open a new one.
    """

    message_event = _NoWaiters()

    def __init__(self, protocol: LabHttpProtocol, decision, prefix: str, headers: dict, *, keep_alive: bool):
        self.protocol, self.scope = protocol, protocol.scope
        self.decision, self.prefix, self.headers = decision, prefix, headers
        self.started = time.perf_counter()
        self.upstream = lab_upstream()
        self.request = b""
        self.address = None
        self.connection = None
        self.reused = False
        # What uvicorn's protocol reads and sets on its current cycle.
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False
        self.more_body = True
        self.body = bytearray()

    def begin(self) -> None:
        try:
            self.address = self.upstream.address(self.decision.endpoint)
        except Declined as why:
            return self._general(why)
        self.request = request_bytes(self.scope, self.decision, self.headers)
        connection = self.upstream.take(self.address)
        if connection is None:
            return self._connect_then_send()
        self.reused = True
        self._send(connection)

    def _connect_then_send(self) -> None:
        async def connect():
            try:
                connection = await self.upstream.connect(self.address)
            except Declined as why:
                return self._general(why)
            self._send(connection)

        task = self.protocol.loop.create_task(connect())
        task.add_done_callback(self.protocol.tasks.discard)
        self.protocol.tasks.add(task)

    def _send(self, connection) -> None:
        self.connection = connection
        connection.send(self.request, scrub_html=bool(self.decision.token), done=self._done)

    def _done(self, answer, error) -> None:
        if answer is not None:
            self.upstream.give_back(self.connection)
            return self._write(answer)
        if isinstance(error, TimedOut):
            logger.info("gateway: GET %s upstream did not answer in time", self.scope["path"])
            page = pages.upstream_down(self.headers, path_with_query(self.scope))

            async def answer_page(scope, receive, send):
                await reply(send, page)

            return self.protocol.start_general(self, answer_page)
        if self.reused and self.connection.went_unanswered():
            # Closed by JupyterLab while it sat in the pool: once more, on a new connection.
            self.reused = False
            return self._connect_then_send()
        self._general(error)

    def _general(self, why) -> None:
        logger.debug("gateway fast path: GET %s goes the general way: %s", self.scope["path"], why)
        self.protocol.start_general(self)

    def _write(self, answer) -> None:
        """Writes the response as uvicorn's RequestResponseCycle.send does for a whole body."""
        protocol = self.protocol
        if self.disconnected or protocol.transport.is_closing():
            return
        headers = downstream_response_headers(
            answer.headers, path_prefix=self.prefix, endpoint=self.decision.endpoint, rewrite_body=False
        )
        content = [STATUS_LINE[answer.status]]
        for name, value in [*protocol.server_state.default_headers, *headers]:
            content += [name.lower(), b": ", value, b"\r\n"]
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content += [b"\r\n", answer.body]
        self.response_complete = True
        if protocol.access_log and protocol.access_logger.isEnabledFor(logging.INFO):
            # The arguments uvicorn's own protocol gives, which its AccessFormatter unpacks.
            protocol.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                "GET",
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                answer.status,
            )
        protocol.transport.write(b"".join(content))
        if _observe is not None:
            _observe(time.perf_counter() - self.started)
        if not self.keep_alive:
            protocol.transport.close()
        protocol.on_response_complete()
