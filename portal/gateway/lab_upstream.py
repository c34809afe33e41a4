"""A lean HTTP/1.1 client for the gateway's fast path: one GET to JupyterLab, answered whole.

Most lab requests are small JSON polls (/api/status, /api/kernels, /api/contents listings) from a session
whose access was decided a moment ago. For those, aiohttp's request and response objects and the tasks
and futures around them cost more than the request itself: on this hardware the aiohttp hop added about
half again to JupyterLab's own time (benchmarks/bench_gateway.py). This client writes the request bytes
on a pooled keep-alive connection, parses the answer with httptools as it arrives and calls back; no
task, no future.

It accepts only an answer it can hand over whole without looking inside: a final status, a
Content-Length of at most SMALL_BODY (or none on 204 and 304), no Transfer-Encoding, and not an HTML
page while a token is to be scrubbed. Anything else (and any failure) is `Declined`, the connection is
dropped, and the caller sends the request the general way (portal/gateway/http_proxy.py), which
streams, decodes and scrubs. A GET has no effect JupyterLab could apply twice, so sending it again is
safe.
"""

import asyncio
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

# As the general path's (http_proxy.SMALL_BODY): bodies up to this size are read whole.
SMALL_BODY = 64 * 1024
CONNECT_SECONDS = 5.0
# As the general path's read timeout: JupyterLab may be slow (a large contents listing, a busy kernel
# manager), and past this the browser gets the "JupyterLab isn't answering" page.
ANSWER_SECONDS = 300.0
# As the general path's pool: a connection unused this long is closed.
IDLE_SECONDS = 30.0
IDLE_PER_ENDPOINT = 32


class Declined(Exception):
    """The answer is not one the fast path hands over, or JupyterLab could not be reached this way."""


class TimedOut(Exception):
    """JupyterLab took the request and did not answer within ANSWER_SECONDS."""


@dataclass(frozen=True)
class Answer:
    status: int
    # As they came: (name, value) bytes, names in JupyterLab's spelling.
    headers: list
    body: bytes


# Called once per request, with the answer or the reason there is none.
Done = Callable[[Answer | None, Exception | None], None]


class Connection(asyncio.Protocol):
    """One keep-alive connection to a JupyterLab; carries one request at a time."""

    def __init__(self):
        self.transport = None
        self.address = None
        self.idle_timer = None
        self.reusable = False
        self._done: Done | None = None
        self._timer = None
        self._parser = None
        self._headers: list = []
        self._body: list = []
        self._size = 0
        self._scrub_html = False

    def send(self, request: bytes, *, scrub_html: bool, done: Done) -> None:
        """Writes `request`; `done` is called from the event loop when the answer is in, or is not."""
        self._headers, self._body, self._size = [], [], 0
        self._scrub_html = scrub_html
        self.reusable = False
        self._done = done
        self._parser = httptools.HttpResponseParser(self)
        self._timer = asyncio.get_running_loop().call_later(ANSWER_SECONDS, self._time_out)
        self.transport.write(request)

    def went_unanswered(self) -> bool:
        """Whether not a byte of the answer came before the connection was lost (closed while idle)."""
        return not self._headers and not self._size

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.transport = None
        self.reusable = False
        self._finish(None, Declined(f"connection lost: {exc!r}"))

    def data_received(self, data):
        if self._done is None:
            # Bytes nobody asked for: this connection is not in a state to trust.
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._decline(f"unreadable answer: {error}")

    # httptools callbacks; after a decline the rest of a fed chunk is ignored.
    def on_header(self, name: bytes, value: bytes):
        if self._done is not None:
            self._headers.append((name, value))

    def on_headers_complete(self):
        if self._done is None:
            return
        status = self._parser.get_status_code()
        length = None
        for name, value in self._headers:
            lowered = name.lower()
            if lowered == b"transfer-encoding":
                return self._decline("a streamed body")
            if lowered == b"content-length":
                length = int(value) if value.strip().isdigit() else -1
            if lowered == b"content-type" and self._scrub_html and value.lower().startswith(b"text/html"):
                return self._decline("an HTML page")
        if not 200 <= status <= 599 or status == 101:
            return self._decline(f"status {status}")
        if length is None and status not in (204, 304):
            return self._decline("no Content-Length")
        if length is not None and not 0 <= length <= SMALL_BODY:
            return self._decline("a large body")

    def on_body(self, body: bytes):
        if self._done is None:
            return
        self._size += len(body)
        if self._size > SMALL_BODY:
            return self._decline("a large body")
        self._body.append(body)

    def on_message_complete(self):
        if self._done is None:
            return
        self.reusable = self._parser.should_keep_alive()
        self._finish(Answer(self._parser.get_status_code(), self._headers, b"".join(self._body)), None)

    def _decline(self, why: str) -> None:
        self._finish(None, Declined(why))
        self.close()

    def _time_out(self) -> None:
        self._finish(None, TimedOut())
        self.close()

    def _finish(self, answer: Answer | None, error: Exception | None) -> None:
        done, self._done = self._done, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if done is not None:
            done(answer, error)


class LabUpstream:
    """Keep-alive connections to the instances' JupyterLabs, per endpoint, on one event loop."""

    def __init__(self, loop):
        self._loop = loop
        self._idle: dict[tuple[str, int], list[Connection]] = {}

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def address(endpoint: str) -> tuple[str, int]:
        """(host, port) of an endpoint such as "http://127.0.0.1:49153"; Declined for anything else."""
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise Declined(f"not a plain-HTTP endpoint: {endpoint!r}")
        return parts.hostname, parts.port or 80

    def take(self, address) -> Connection | None:
        """An idle connection to `address`, the most recently used first, or None."""
        idle = self._idle.get(address)
        while idle:
            connection = idle.pop()
            if connection.idle_timer is not None:
                connection.idle_timer.cancel()
                connection.idle_timer = None
            if connection.transport is not None and not connection.transport.is_closing():
                return connection
        return None

    async def connect(self, address) -> Connection:
        try:
            _transport, connection = await asyncio.wait_for(
                self._loop.create_connection(Connection, *address), CONNECT_SECONDS
            )
        except (OSError, asyncio.TimeoutError) as error:
            raise Declined(f"cannot connect: {error!r}") from error
        connection.address = address
        return connection

    def give_back(self, connection: Connection) -> None:
        """Keeps `connection` for the next request to its address, if JupyterLab keeps it open."""
        idle = self._idle.setdefault(connection.address, [])
        if not connection.reusable or len(idle) >= IDLE_PER_ENDPOINT:
            connection.close()
            return
        idle.append(connection)
        connection.idle_timer = self._loop.call_later(IDLE_SECONDS, self._expire, connection)

    def _expire(self, connection: Connection) -> None:
        idle = self._idle.get(connection.address, [])
        if connection in idle:
            idle.remove(connection)
        connection.close()
        if not idle:
            self._idle.pop(connection.address, None)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                if connection.idle_timer is not None:
                    connection.idle_timer.cancel()
                connection.close()
        self._idle.clear()


_per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LabUpstream]" = weakref.WeakKeyDictionary()


def lab_upstream() -> LabUpstream:
    """This event loop's pool (tests run servers on several loops, each in its own thread)."""
    loop = asyncio.get_running_loop()
    upstream = _per_loop.get(loop)
    if upstream is None:
        upstream = _per_loop[loop] = LabUpstream(loop)
    return upstream


def close_lab_upstream() -> None:
    upstream = _per_loop.pop(asyncio.get_running_loop(), None)
    if upstream is not None:
        upstream.close()
