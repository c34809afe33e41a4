"""What the gateway does between a client and an instance's sshd, when timing goes against it:
- the sshd's greeting comes the moment the gateway connects, often before the client's channel is open;
  a client that missed it would read the key exchange as the greeting and give up ("banner line contains
  invalid characters");
- a client that leaves while the gateway is still connecting must leave no connection or session open;
- a host whose engine hangs holds up the connections to its own instances, nobody else's login."""

import asyncio
import contextlib
import os
import queue
import signal
import socket
import subprocess
import threading
import time

import pytest
from django.utils import timezone

from portal.instances.models import Instance
from portal.sshgateway.models import SshSession
from portal.sshgateway.server import KEY_PUSH_TIMEOUT_SECONDS, CountingForwarder, Forward, Gateway
from provisioning.models import GpuHost
from tests.e2e.helpers import wait_for
from tests.support.docker_instances import make_image, make_instance

from .conftest import add_key

# As many as asyncio's default thread pool has threads (cores + 4, at most 32): the pool the gateway's
# database calls run in.
STUCK_CONNECTIONS = min(32, (os.cpu_count() or 1) + 4)

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
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def port(self) -> int:
        return self.socket.getsockname()[1]

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                connection = self.socket.accept()[0]
                self.held.append(connection)  # open until close(), whoever takes it from the queue
                self.accepted.put(connection)

    def close(self):
        # shutdown() wakes the thread blocked in accept(); close() alone would leave it there.
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()
        for connection in self.held:
            connection.close()


def an_instance_on_a_silent_engine(owner, tmp_path) -> tuple[Listener, Listener, Instance]:
    """A running instance whose host's engine accepts connections and never answers (a stuck dockerd), with
    a stand-in for its sshd. Returns (the engine, the sshd, the instance)."""
    engine = Listener(socket.AF_UNIX, str(tmp_path / "engine.sock"))
    sshd = Listener()
    host = GpuHost.objects.create(name="gpu-silent-engine", docker_url=f"unix://{tmp_path / 'engine.sock'}")
    instance = make_instance(owner, make_image("devcloud/cpu:unbuilt"), host, driver="docker")
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING,
        driver_state={"endpoint": "http://127.0.0.1:9", "ssh_port": sshd.port},
        ready_at=timezone.now(),
        metered_until=timezone.now(),
    )
    return engine, sshd, instance


def connect(ssh, instance) -> subprocess.Popen:
    """`ssh -J <gateway> developer@<instance> true`, in a process group of its own."""
    return subprocess.Popen(
        [*ssh.args(), f"developer@{instance.short_id}", "true"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def give_up(client: subprocess.Popen) -> None:
    """What Ctrl-C does: ends ssh and the `ssh -W` it runs for -J."""
    os.killpg(client.pid, signal.SIGKILL)
    client.wait()


def settled(read, *, quiet: float = 1.0, timeout: float = 30) -> None:
    """Waits until read(), (session id, ended_at) pairs, stays the same for `quiet` seconds with every
    session ended."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = list(read())
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet and all(ended_at for _, ended_at in now):
            return
        time.sleep(0.1)
    raise AssertionError(f"The gateway's sessions never settled: {last}")


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
    engine, sshd, instance = an_instance_on_a_silent_engine(alice, tmp_path)

    client = connect(ssh_as(key), instance)
    try:
        engine.accepted.get(timeout=30)  # the gateway is refreshing the keys
    finally:
        give_up(client)
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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120, func_only=True)
def test_connections_stuck_on_a_silent_engine_do_not_hold_up_anyone_else(
    alice, bob, keygen, ssh_as, gateway, tmp_path
):
    alice_key, bob_key = keygen("alice-laptop"), keygen("bob-laptop")
    add_key(alice, alice_key, "laptop")
    add_key(bob, bob_key, "laptop")
    engine, sshd, instance = an_instance_on_a_silent_engine(alice, tmp_path)
    # More than enough to hold every thread of that pool, should one of them fall short of the refresh.
    stuck = [connect(ssh_as(alice_key), instance) for _ in range(STUCK_CONNECTIONS + 4)]
    try:
        # Each one's key refresh hangs on the engine, the first within a second and the others with it.
        engine.accepted.get(timeout=30)
        time.sleep(3)

        # Bob, on another host or none, only asks the gateway what he can reach.
        started = time.monotonic()
        asked = subprocess.run(
            ["ssh", "-F", str(ssh_as(bob_key).config), "-p", str(gateway.port), "bob@127.0.0.1"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        waited = time.monotonic() - started
    finally:
        for client in stuck:
            give_up(client)
        engine.close()
        # The gateway goes on with each abandoned connection once its refresh fails (a session's record,
        # then its end); let it finish before the test's rows are emptied under it.
        settled(lambda: SshSession.objects.values_list("pk", "ended_at").order_by("pk"))
        sshd.close()

    assert "SSH gateway" in asked.stdout, asked.stderr
    assert waited < KEY_PUSH_TIMEOUT_SECONDS, f"Bob waited {waited:.1f} s behind a stuck engine"
