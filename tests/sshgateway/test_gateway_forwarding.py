"""The gateway's forwarded connection carries every byte the instance's sshd sends, from the first: its
greeting comes the moment the gateway connects, often before the client's channel is open, and a client
that misses it reads the key exchange as the greeting and gives up ("banner line contains invalid
characters")."""

import asyncio

from portal.sshgateway.server import CountingForwarder, Forward, Gateway

GREETING = b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"


class Channel:
    """What the gateway's SSH channel to the client is to the forwarder: a transport that takes writes."""

    def __init__(self):
        self.received = b""

    def get_extra_info(self, name, default=None):
        return default

    def write(self, data: bytes) -> None:
        self.received += data


async def a_forward_opened_after_the_greeting_arrived() -> bytes:
    """Connect to an sshd that greets at once, let the greeting arrive before the client's channel opens
    (a busy gateway), then open the channel as asyncssh does. Returns what reached the client."""
    greeted = asyncio.Event()

    async def sshd(reader, writer):
        writer.write(GREETING)
        await writer.drain()
        greeted.set()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(sshd, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    forward = Forward(Gateway(), session_id=0)
    loop = asyncio.get_running_loop()
    instance_side_transport, instance_side = await loop.create_connection(
        lambda: CountingForwarder(forward=forward, client_side=False), "127.0.0.1", port
    )
    await greeted.wait()
    await asyncio.sleep(0.2)

    client_side = CountingForwarder(instance_side, forward=forward, client_side=True)
    channel = Channel()
    client_side.connection_made(channel)
    for _ in range(50):
        if channel.received:
            break
        await asyncio.sleep(0.02)
    forward.ended = True  # the session's record is not under test: closing writes none
    instance_side_transport.abort()
    server.close()
    return channel.received


def test_the_sshd_greeting_that_arrives_before_the_client_channel_opens_reaches_the_client():
    assert asyncio.run(a_forward_opened_after_the_greeting_arrived()) == GREETING
