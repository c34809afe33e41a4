"""Forwards one HTTP request to JupyterLab and streams the answer back, both ways unbuffered.

The path goes upstream unchanged (JupyterLab runs with base_url /instances/<uuid>/lab/), as the raw
bytes the browser sent, so percent-encoded file names in the contents API survive.
"""

import asyncio
import logging
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from . import pages
from .headers import decoded_headers, downstream_response_headers, upstream_request_headers

logger = logging.getLogger(__name__)

# Connecting to a container on the same host or network takes milliseconds; if it takes seconds the
# container is not there. Reads can be slow (a big download, a slow contents request), and pooled
# keep-alive connections are what makes the gateway cheap.
TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=300.0, pool=10.0)
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30.0)


def new_client() -> httpx.AsyncClient:
    """The one client the gateway shares across requests (connection pooling per instance endpoint).

    Its cookie jar refuses every cookie: the client serves every user, so a cookie it kept from one
    response would be sent on another user's request. Cookies travel only in each request's headers.
    """
    return httpx.AsyncClient(
        timeout=TIMEOUT,
        limits=LIMITS,
        follow_redirects=False,
        trust_env=False,
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
    )


class ClientGone(Exception):
    """The browser disconnected while its request body was still being read."""


def path_with_query(scope) -> str:
    query = scope.get("query_string", b"").decode("latin-1")
    return scope["path"] + (f"?{query}" if query else "")


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


async def reply(send, answer: pages.Reply, *, head: bool = False) -> None:
    headers = list(answer.headers)
    if answer.body:
        headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else answer.body})


async def proxy_http(scope, receive, send, *, client: httpx.AsyncClient, decision, prefix: str) -> None:
    """Sends the request in `scope` to `decision.endpoint` and streams JupyterLab's answer back.

    Answers 502 (a page saying JupyterLab isn't answering) when the container refuses the connection,
    is unreachable, or does not send response headers in time. Never raises for upstream failures;
    a failure after the headers went out ends the response early (the browser sees a cut download).
    """
    headers = decoded_headers(scope)
    query = scope.get("query_string", b"")
    url = decision.endpoint + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    if query:
        url += "?" + query.decode("latin-1")
    has_body = "content-length" in headers or "transfer-encoding" in headers
    request = client.build_request(
        scope["method"],
        url,
        headers=upstream_request_headers(scope, decision.token, decision.endpoint),
        content=_request_body(receive) if has_body else None,
    )
    try:
        try:
            upstream = await client.send(request, stream=True)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            # A kept-alive connection JupyterLab closed just as it was reused. A GET or HEAD can be
            # sent again, once, on a new connection; anything else may already have had its effect.
            if has_body or scope["method"] not in ("GET", "HEAD"):
                raise
            upstream = await client.send(request, stream=True)
    except ClientGone:
        return
    except (httpx.TransportError, httpx.InvalidURL) as error:
        logger.info("gateway: %s %s upstream failed: %r", scope["method"], scope["path"], error)
        answer = pages.upstream_down(headers, path_with_query(scope))
        await reply(send, answer, head=scope["method"] == "HEAD")
        return
    try:
        content_type = upstream.headers.get("content-type", "")
        rewrite = content_type.startswith("text/html") and bool(decision.token)
        start = {
            "type": "http.response.start",
            "status": upstream.status_code,
            "headers": downstream_response_headers(
                upstream.headers.raw, path_prefix=prefix, endpoint=decision.endpoint, rewrite_body=rewrite
            ),
        }
        if not rewrite and _small(upstream):
            # Most lab requests (API calls, polls) answer a few hundred bytes: read them whole and send
            # them in one message, without the two tasks that stream a large body and watch for the
            # browser leaving, which cost more than the request itself.
            try:
                body = b"".join([chunk async for chunk in upstream.aiter_raw()])
            except httpx.TransportError as error:
                logger.info("gateway: %s %s upstream broke: %r", scope["method"], scope["path"], error)
                answer = pages.upstream_down(headers, path_with_query(scope))
                return await reply(send, answer, head=scope["method"] == "HEAD")
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        await send(start)
        body = _scrubbed(upstream.aiter_bytes(), decision.token.encode()) if rewrite else upstream.aiter_raw()
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
    except httpx.TransportError as error:
        logger.info("gateway: %s %s upstream broke mid-response: %r", scope["method"], scope["path"], error)
    finally:
        await upstream.aclose()


# Bodies up to this size (by Content-Length) are read whole rather than streamed.
SMALL_BODY = 64 * 1024


def _small(upstream: httpx.Response) -> bool:
    length = upstream.headers.get("content-length", "")
    return length.isdigit() and int(length) <= SMALL_BODY


async def _forward_body(chunks, send) -> None:
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
