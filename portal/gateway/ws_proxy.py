"""Joins the browser's websocket (kernel channels, terminals, events) to JupyterLab's.

The gateway connects upstream first and accepts the browser only once JupyterLab has accepted, with
the subprotocol JupyterLab chose, so a refusal upstream (an unknown kernel: 404) reaches the browser as
the same refusal. Frames go both ways as they are, text as text and binary as binary, and whichever
side closes first has its close code passed to the other.
"""

import asyncio
import json
import logging

import websockets
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .headers import decoded_headers, strip_portal_cookies, upstream_origin

logger = logging.getLogger(__name__)

# Jupyter messages carry images and dataframes; tornado's default cap upstream is 10 MiB, and a
# container should not be able to make the gateway hold more than this in memory for one frame.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Opening a kernel's channels waits for the kernel to answer; on a busy host that takes seconds.
OPEN_TIMEOUT = 30.0

# Codes a close frame may carry (RFC 6455 section 7.4); 1005 and 1006 only describe a missing or
# abnormal close and cannot be sent.
_SENDABLE = set(range(1000, 1004)) | set(range(1007, 1012)) | set(range(3000, 5000))


def _sendable(code: int | None, fallback: int) -> int:
    return code if code in _SENDABLE else fallback


async def refuse(scope, send, status: int, body: bytes = b"") -> None:
    """Refuses a websocket handshake with an HTTP status (403 when the server cannot say which)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


def _message(text: str) -> bytes:
    return json.dumps({"message": text}).encode()


def _upstream_url(scope, endpoint: str) -> str:
    base = "ws" + endpoint[len("http") :] if endpoint.startswith("http") else endpoint
    url = base + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"")
    return url + ("?" + query.decode("latin-1") if query else "")


async def proxy_websocket(
    scope,
    receive,
    send,
    *,
    decision,
    still_allowed=None,
    recheck_seconds: float = 60.0,
    upstream_name: str = "JupyterLab",
):
    """Proxies the websocket in `scope` to JupyterLab at `decision.endpoint` until either side closes.

    `still_allowed` is an async callable re-checked every `recheck_seconds`; when it says no (the user
    logged out, was deactivated, or the instance stopped), both sides are closed with 1008. Refuses the
    browser with 502 when JupyterLab cannot be reached, and with JupyterLab's own status when it
    refuses. Never raises for network failures on either side. `upstream_name` is what the messages
    call the other end ("the app on port 8000" for an exposed port).
    """
    headers = decoded_headers(scope)
    upstream_headers = [("Origin", upstream_origin(decision.endpoint))]
    if decision.token:
        # An exposed port (portal/ports) has no token: the instance's own app gets no credential.
        upstream_headers.append(("Authorization", f"token {decision.token}"))
    cookies = strip_portal_cookies(headers.get("cookie", ""))
    if cookies:
        upstream_headers.append(("Cookie", cookies))
    subprotocols = scope.get("subprotocols") or None
    try:
        upstream = await connect(
            _upstream_url(scope, decision.endpoint),
            additional_headers=upstream_headers,
            subprotocols=subprotocols,
            open_timeout=OPEN_TIMEOUT,
            max_size=MAX_MESSAGE_BYTES,
            compression=None,
            user_agent_header=None,
        )
    except InvalidStatus as error:
        await refuse(
            scope, send, error.response.status_code, _message(f"{upstream_name} refused the connection.")
        )
        return
    except (OSError, TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI) as error:
        logger.info("gateway: websocket %s upstream failed: %r", scope["path"], error)
        await refuse(scope, send, 502, _message(f"{upstream_name} isn't answering yet, or anymore."))
        return

    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    browser_closed: dict = {}

    async def browser_to_lab():
        while True:
            message = await receive()
            if message["type"] == "websocket.receive":
                text = message.get("text")
                await upstream.send(text if text is not None else message.get("bytes") or b"")
            elif message["type"] == "websocket.disconnect":
                browser_closed["code"] = message.get("code")
                browser_closed["reason"] = message.get("reason") or ""
                return

    async def lab_to_browser():
        async for data in upstream:
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})

    async def watch_access():
        while True:
            await asyncio.sleep(recheck_seconds)
            if not await still_allowed():
                return

    tasks = {asyncio.ensure_future(browser_to_lab()), asyncio.ensure_future(lab_to_browser())}
    watcher = asyncio.ensure_future(watch_access()) if still_allowed else None
    if watcher:
        tasks.add(watcher)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    if watcher in done:
        # Access ended while the socket was open: policy violation on both sides.
        await upstream.close(code=1008, reason="access ended")
        await _close_browser(send, 1008, "Your portal session or this instance ended.")
    elif browser_closed:
        # 1005 (no code) and 1006 (dropped) cannot be sent; "going away" is what a closed tab means.
        await upstream.close(
            code=_sendable(browser_closed.get("code"), 1001), reason=browser_closed["reason"]
        )
    else:
        # JupyterLab closed (kernel shut down, server stopping) or the connection to it broke.
        await upstream.close()
        received = upstream.protocol.close_rcvd
        if received is None:
            await _close_browser(send, 1011, f"{upstream_name} went away.")
        else:
            await _close_browser(send, _sendable(received.code, 1000), received.reason)


async def _close_browser(send, code: int, reason: str) -> None:
    try:
        await send({"type": "websocket.close", "code": code, "reason": reason[:120]})
    except (RuntimeError, ConnectionClosed, OSError):
        # The browser already went away; there is nobody left to tell.
        pass
