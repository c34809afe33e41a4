"""The floor of any proxy hop on this machine, for bench_gateway.py: a process that copies bytes between
each client connection and a connection of its own to BENCH_RELAY_UPSTREAM (host:port), on uvloop as the
portal runs. It reads nothing it relays: no HTTP parsing, no headers, no access decision. Whatever a
reverse proxy adds to a request beyond this relay's figure is its own work; up to it is the hop itself
(one more process to wake, one more connection each way).

Run as `python -m benchmarks.tcp_relay PORT`.
"""

import asyncio
import os
import sys

import uvloop


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
    finally:
        writer.close()


async def _relay(host: str, port: int, client_reader, client_writer) -> None:
    upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
    await asyncio.gather(
        _copy(client_reader, upstream_writer), _copy(upstream_reader, client_writer), return_exceptions=True
    )


async def serve(port: int, upstream: str) -> None:
    host, upstream_port = upstream.rsplit(":", 1)
    server = await asyncio.start_server(
        lambda reader, writer: _relay(host, int(upstream_port), reader, writer), "127.0.0.1", port
    )
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), os.environ["BENCH_RELAY_UPSTREAM"]))
