"""The gateway's forwarded connection carries every byte the instance's sshd sends, from the first: its
greeting comes the moment the gateway connects, often before the client's channel is open, and a client
that misses it reads the key exchange as the greeting and gives up ("banner line contains invalid
characters")."""

import asyncio
import contextlib
import os
import queue
import signal
import socket
import subprocess
import threading

import pytest
from django.utils import timezone

from portal.instances.models import Instance
from portal.sshgateway.models import SshSession
from portal.sshgateway.server import KEY_PUSH_TIMEOUT_SECONDS, CountingForwarder, Forward, Gateway
from provisioning.models import GpuHost
from tests.e2e.helpers import wait_for
from tests.support.docker_instances import make_image, make_instance

from .conftest import add_key

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


class Listener:
    """A TCP or Unix listener that accepts and holds every connection, saying nothing: an engine that
    does not answer, or an instance's sshd to see whether the gateway lets go of it."""

    def __init__(self, family=socket.AF_INET, address=("127.0.0.1", 0)):
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.bind(address)
        self.socket.listen(8)
        self.accepted: queue.Queue = queue.Queue()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def port(self) -> int:
        return self.socket.getsockname()[1]

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                self.accepted.put(self.socket.accept()[0])

    def close(self):
        self.socket.close()


def ended_by_the_peer(connection: socket.socket, timeout: float) -> bool:
    connection.settimeout(timeout)
    try:
        return connection.recv(1) == b""
    except TimeoutError:
        return False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120, func_only=True)
def test_a_client_that_leaves_while_the_gateway_connects_leaves_no_session_open(
    alice, keygen, ssh_as, tmp_path
):
    # The engine takes the gateway's key refresh and never answers, so the gateway waits its
    # KEY_PUSH_TIMEOUT_SECONDS before it connects to the sshd: the person gives up (Ctrl-C) meanwhile.
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")  # before the instance runs, so the engine hears only from the gateway
    engine = Listener(socket.AF_UNIX, str(tmp_path / "engine.sock"))
    sshd = Listener()
    host = GpuHost.objects.create(name="gpu-silent-engine", docker_url=f"unix://{tmp_path / 'engine.sock'}")
    instance = make_instance(alice, make_image("devcloud/cpu:unbuilt"), host, driver="docker")
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING,
        driver_state={"endpoint": "http://127.0.0.1:9", "ssh_port": sshd.port},
        ready_at=timezone.now(),
        metered_until=timezone.now(),
    )

    client = subprocess.Popen(
        [*ssh_as(key).args(), f"developer@{instance.short_id}", "true"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        engine.accepted.get(timeout=30)  # the gateway is refreshing the keys
    finally:
        # ssh and the `ssh -W` it runs for -J: Ctrl-C reaches both.
        os.killpg(client.pid, signal.SIGKILL)
        client.wait()
    instance_side = sshd.accepted.get(timeout=KEY_PUSH_TIMEOUT_SECONDS + 15)

    assert ended_by_the_peer(instance_side, timeout=10), (
        "the gateway kept the instance's sshd connection open"
    )
    # Left open, the record would read as SSH use to idle culling for as long as the gateway runs.
    wait_for(
        lambda: SshSession.objects.get(instance_id=instance.pk).ended_at is not None,
        timeout=10,
        what="the session's record to end",
    )
    engine.close()
    sshd.close()
