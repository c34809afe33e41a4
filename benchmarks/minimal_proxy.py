"""The least a Python reverse proxy can do, for bench_gateway.py to compare the gateway with: an ASGI app
that forwards every GET, as it came, to BENCH_PROXY_UPSTREAM with the gateway's own aiohttp client
settings (portal.gateway.http_proxy.new_client) and answers with the whole body. No session, no access
decision, no header rewriting. Served by the same uvicorn command line as the portal, it measures what
one more hop through uvicorn and aiohttp costs on this machine, which no gateway written this way can
go below.
"""

import os

from portal.gateway.http_proxy import new_client

UPSTREAM = os.environ.get("BENCH_PROXY_UPSTREAM", "")
_client = None


async def app(scope, receive, send):
    global _client
    if scope["type"] != "http":
        return
    if _client is None:
        _client = new_client()
    headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
    async with _client.get(UPSTREAM + scope["path"], headers=headers) as upstream:
        body = await upstream.read()
        content_type = upstream.headers.get("content-type", "application/octet-stream").encode()
    await send(
        {
            "type": "http.response.start",
            "status": upstream.status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
