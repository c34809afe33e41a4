"""Forwards one HTTP request to JupyterLab and streams the answer back, both ways unbuffered.

The path goes upstream unchanged (JupyterLab runs with base_url /instances/<uuid>/lab/), as the raw
bytes the browser sent, so percent-encoded file names in the contents API survive.
"""

import asyncio
import logging
import zlib
from urllib.parse import parse_qs

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from . import pages
from .headers import decoded_headers, downstream_response_headers, upstream_request_headers

logger = logging.getLogger(__name__)

# Connecting to a container on the same host or network takes milliseconds; if it takes seconds the
# container is not there (sock_connect; `connect` also covers waiting for a pooled connection). Reads
# can be slow (a big download, a slow contents request), and pooled keep-alive connections are what
# makes the gateway cheap.
TIMEOUT = aiohttp.ClientTimeout(total=None, connect=15.0, sock_connect=5.0, sock_read=300.0)
# Everything that can go wrong on the way to or from JupyterLab: refused, unreachable, timed out, cut off.
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def new_client() -> aiohttp.ClientSession:
    """The one client the gateway shares across requests (connection pooling per instance endpoint).

    aiohttp rather than httpx: per request it costs about a third of httpx's time, which is most of
    what the gateway adds to a lab request (benchmarks/bench_gateway.py). Its cookie jar keeps nothing:
    the client serves every user, so a cookie it kept from one response would be sent on another
    user's request; cookies travel only in each request's headers. Bodies come as JupyterLab sent them
    (no decompression) and nothing from the environment (proxies) applies.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, keepalive_timeout=30.0),
        timeout=TIMEOUT,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        trust_env=False,
        # The browser's own Accept-Encoding (narrowed to what the gateway can decode) or none.
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
    )


class ClientGone(Exception):
    """The browser disconnected while its request body was still being read."""


def path_with_query(scope) -> str:
    query = scope.get("query_string", b"").decode("latin-1")
    return scope["path"] + (f"?{query}" if query else "")


def query_value(scope, name: str) -> str:
    return parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name, [""])[0]


async def _request_body(receive):
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


async def _scrubbed(chunks, secret: bytes):
    """Yields `chunks` with every occurrence of `secret` removed, holding back only len(secret)-1 bytes.

    JupyterLab writes its token into the page config of every HTML page it serves (`"token": "..."`),
    which would put it in the browser. With the token removed the page config says `"token": ""`, and
    the lab then authenticates with cookies through the gateway, which adds the token itself.
    """
    keep = len(secret) - 1
    pending = b""
    async for chunk in chunks:
        pending = (pending + chunk).replace(secret, b"")
        if len(pending) > keep:
            yield pending[: len(pending) - keep]
            pending = pending[len(pending) - keep :]
    if pending:
        yield pending


async def _decoded(chunks, encoding: str):
    """Yields `chunks` decompressed per Content-Encoding (gzip, deflate or none: what the gateway asks
    JupyterLab for), so a page can be scrubbed of its token."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        async for chunk in chunks:
            yield chunk
        return
    # 16 + MAX_WBITS reads a gzip wrapper; 32 + MAX_WBITS reads zlib or gzip (HTTP "deflate" is zlib).
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else 32 + zlib.MAX_WBITS)
    async for chunk in chunks:
        data = decoder.decompress(chunk)
        if data:
            yield data
    tail = decoder.flush()
    if tail:
        yield tail


async def reply(send, answer: pages.Reply, *, head: bool = False) -> None:
    headers = list(answer.headers)
    if answer.body:
        headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else answer.body})


async def proxy_http(
    scope, receive, send, *, client: aiohttp.ClientSession, decision, prefix: str, down=None
) -> None:
    """Sends the request in `scope` to `decision.endpoint` and streams JupyterLab's answer back.

    Answers 502 (a page saying JupyterLab isn't answering, or `down(headers, path_with_query)`'s page
    when given) when the container refuses the connection,
    is unreachable, or does not send response headers in time. Never raises for upstream failures;
    a failure after the headers went out ends the response early (the browser sees a cut download).
    """
    headers = decoded_headers(scope)
    query = scope.get("query_string", b"")
    target = decision.endpoint + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    if query:
        target += "?" + query.decode("latin-1")
    has_body = "content-length" in headers or "transfer-encoding" in headers

    def send_upstream():
        # encoded=True: the path goes exactly as the browser sent it, percent-encoding and all.
        return client.request(
            scope["method"],
            URL(target, encoded=True),
            headers=CIMultiDict(upstream_request_headers(scope, decision.token, decision.endpoint)),
            data=_request_body(receive) if has_body else None,
            allow_redirects=False,
        )

    try:
        try:
            upstream = await send_upstream()
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # A kept-alive connection JupyterLab closed just as it was reused. A GET or HEAD can be
            # sent again, once, on a new connection; anything else may already have had its effect.
            if has_body or scope["method"] not in ("GET", "HEAD"):
                raise
            upstream = await send_upstream()
    except ClientGone:
        return
    except (*UPSTREAM_ERRORS, ValueError) as error:
        logger.info("gateway: %s %s upstream failed: %r", scope["method"], scope["path"], error)
        answer = (down or pages.upstream_down)(headers, path_with_query(scope))
        await reply(send, answer, head=scope["method"] == "HEAD")
        return
    try:
        content_type = upstream.headers.get("content-type", "")
        rewrite = content_type.startswith("text/html") and bool(decision.token)
        start = {
            "type": "http.response.start",
            "status": upstream.status,
            "headers": downstream_response_headers(
                upstream.raw_headers, path_prefix=prefix, endpoint=decision.endpoint, rewrite_body=rewrite
            ),
        }
        if not rewrite and _small(upstream):
            # Most lab requests (API calls, polls) answer a few hundred bytes: read them whole and send
            # them in one message, without the two tasks that stream a large body and watch for the
            # browser leaving, which cost more than the request itself.
            try:
                body = await upstream.read()
            except UPSTREAM_ERRORS as error:
                logger.info("gateway: %s %s upstream broke: %r", scope["method"], scope["path"], error)
                answer = (down or pages.upstream_down)(headers, path_with_query(scope))
                return await reply(send, answer, head=scope["method"] == "HEAD")
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        await send(start)
        raw = upstream.content.iter_any()
        if rewrite:
            decoded = _decoded(raw, upstream.headers.get("content-encoding", ""))
            body = _scrubbed(decoded, decision.token.encode())
        else:
            body = raw
        # uvicorn drops what is sent after the browser left without saying so; watching for the
        # disconnect stops pulling a large download from the container for nobody.
        streaming = asyncio.ensure_future(_forward_body(body, send))
        watching = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({streaming, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, watching):
                task.cancel()
            await asyncio.gather(streaming, watching, return_exceptions=True)
        if streaming.done() and not streaming.cancelled() and streaming.exception():
            raise streaming.exception()
    except (*UPSTREAM_ERRORS, zlib.error) as error:
        logger.info("gateway: %s %s upstream broke mid-response: %r", scope["method"], scope["path"], error)
    finally:
        upstream.release()


# Bodies up to this size (by Content-Length) are read whole rather than streamed.
SMALL_BODY = 64 * 1024


def _small(upstream: aiohttp.ClientResponse) -> bool:
    length = upstream.headers.get("content-length", "")
    return length.isdigit() and int(length) <= SMALL_BODY


async def _forward_body(chunks, send) -> None:
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
