"""Idle culling asks each tenant's JupyterLab how it is used, and the tenant controls that server: it can
answer one byte at a time forever, or send an endless body. A round must still end, within the probe
deadline, and such an instance counts as not answering (skipped this round: neither busy nor idle).

The hostile servers here are real sockets on 127.0.0.1.
"""

import secrets
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import culling
from portal.instances.models import Instance, LaunchPolicy
from provisioning.drivers import fake

pytestmark = pytest.mark.timeout(120)

# How long a hostile server keeps going before giving up on its own; far past any sane deadline.
HOSTILE_FOR_SECONDS = 60
# ...and how much a flooding one sends at most, so a culler without a cap cannot exhaust this machine.
HOSTILE_MAX_BYTES = 256 * 1024 * 1024
# A round with one hostile lab in it ends within this (the culler's deadline is 10 seconds).
ROUND_SECONDS = 15
# The culler reads answers of at most 1 MiB; what else it receives is whatever was already in flight.
READ_AT_MOST = 16 * 1024 * 1024


class HostileServer:
    """Accepts connections on 127.0.0.1 and answers every request with `behaviour(connection)`."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection):
        with connection:
            connection.settimeout(HOSTILE_FOR_SECONDS)
            try:
                connection.recv(65536)
                self.behaviour(self, connection)
            except OSError:
                # The culler hung up, which is what it should do.
                pass

    def send(self, connection, data: bytes):
        connection.sendall(data)
        self.sent += len(data)

    def close(self):
        self.stopped.set()
        self.listener.close()


def dribble_headers(server, connection):
    """Slowloris: a status line and headers that never end, one byte at a time."""
    deadline = time.monotonic() + HOSTILE_FOR_SECONDS
    server.send(connection, b"HTTP/1.1 200 OK\r\n")
    while time.monotonic() < deadline and not server.stopped.is_set():
        server.send(connection, b"X")
        time.sleep(0.2)


def dribble_body(server, connection):
    """Headers at once, then a JSON body that never ends, one byte at a time."""
    deadline = time.monotonic() + HOSTILE_FOR_SECONDS
    server.send(
        connection, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    server.send(connection, b'{"last_activity": "')
    while time.monotonic() < deadline and not server.stopped.is_set():
        server.send(connection, b" ")
        time.sleep(0.2)


def flood_body(server, connection):
    """An endless body, as fast as the culler reads (a 1 GB /api/status, say)."""
    chunk = b"[" + b"0," * 32767 + b"0"
    server.send(connection, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    deadline = time.monotonic() + HOSTILE_FOR_SECONDS
    while time.monotonic() < deadline and server.sent < HOSTILE_MAX_BYTES and not server.stopped.is_set():
        server.send(connection, chunk)


@pytest.fixture(autouse=True)
def policy(db, settings):
    settings.DEVCLOUD_DRIVER = "fake"
    fake.install()
    policy = LaunchPolicy.current()
    policy.idle_minutes = {"1x": 60, "8x": 30}
    policy.idle_grace_minutes = 10
    policy.save()
    return policy


def running_instance(alice, endpoint):
    ready_at = timezone.now() - timedelta(hours=3)
    return Instance.objects.create(
        user=alice,
        size="1x",
        image=fake.make_image("cpu"),
        driver="fake",
        state=Instance.State.RUNNING,
        step=Instance.Step.READY,
        ready_at=ready_at,
        metered_until=ready_at,
        jupyter_token=secrets.token_hex(24),
        driver_state={"endpoint": endpoint},
    )


@pytest.mark.parametrize("behaviour", [dribble_headers, dribble_body, flood_body])
def test_a_hostile_lab_cannot_stall_a_culling_round(alice, behaviour, django_capture_on_commit_callbacks):
    server = HostileServer(behaviour)
    try:
        instance = running_instance(alice, server.endpoint)
        started = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            report = culling.cull_idle(timezone.now() + timedelta(hours=10))
        took = time.monotonic() - started
    finally:
        server.close()

    assert took < ROUND_SECONDS
    # Not evidence either way: neither stopped nor warned, counted as not answering.
    assert (report.checked, report.unreachable, report.warned, report.stopped) == (1, 1, 0, 0)
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING


def test_the_culler_reads_no_more_than_its_cap_of_a_huge_answer(alice, django_capture_on_commit_callbacks):
    server = HostileServer(flood_body)
    try:
        running_instance(alice, server.endpoint)
        with django_capture_on_commit_callbacks(execute=True):
            report = culling.cull_idle()
        # Whatever the server pushed into socket buffers after the culler hung up is not read; it stays
        # far below a response the size of the host's memory.
        time.sleep(0.5)
        sent = server.sent
    finally:
        server.close()

    assert report.unreachable == 1
    assert sent < READ_AT_MOST
