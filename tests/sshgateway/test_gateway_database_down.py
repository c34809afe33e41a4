"""The SSH gateway while its database does not answer (a restart, an outage): a person who connects is
told so, in words, rather than cut off without a word, and the gateway lets people in again once the
database answers, without a restart of its own."""

import contextlib
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from portal.sshgateway.server import DATABASE_DOWN, LOGIN_TIMEOUT_SECONDS
from tests.support.worker import current_database_url

from .conftest import add_key, start_gateway, stop_gateway

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120, func_only=True),
]


class Relay:
    """A TCP relay from a loopback port to PostgreSQL that can be cut (every connection dropped, new ones
    refused) and put back on the same port: the database going away and coming back, as the gateway sees it.
    Put back `silent`, it takes connections and never answers: a database that hangs."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.port = 0
        self._listener = None
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self, *, silent: bool = False) -> None:
        self.silent = silent
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone would leave the port bound.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                connection.close()
            self._connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                client = listener.accept()[0]
                with self._lock:
                    self._connections.append(client)
                if self.silent:
                    continue
                server = socket.create_connection(self.upstream)
                with self._lock:
                    self._connections.append(server)
                for source, sink in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def through(url: str, port: int) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{credentials}{'@' if credentials else ''}127.0.0.1:{port}"))


def ask_the_gateway(gateway, key) -> subprocess.CompletedProcess:
    """`ssh <gateway>` with no instance: the gateway's own help text, after it checked the key."""
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(key.private),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-p",
            str(gateway.port),
            "alice@127.0.0.1",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def relayed(alice, keygen, tmp_path):
    """(the relay, a gateway reaching the database through it, alice's key), the gateway answering."""
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    database = urlsplit(current_database_url())
    relay = Relay((database.hostname, database.port or 5432))
    relay.up()
    gateway = start_gateway(tmp_path, database_url=through(current_database_url(), relay.port))
    try:
        assert "SSH gateway" in ask_the_gateway(gateway, key).stdout
        yield relay, gateway, key
    finally:
        relay.cut()  # first: a gateway thread stuck on a silent database would hold up its exit
        stop_gateway(gateway)


def test_while_the_database_is_down_a_login_is_told_why_and_once_it_is_back_logins_work(relayed):
    relay, gateway, key = relayed

    relay.cut()
    down = ask_the_gateway(gateway, key)
    relay.up()
    back = ask_the_gateway(gateway, key)

    assert down.returncode == 255
    assert DATABASE_DOWN in down.stderr, down.stderr
    assert "SSH gateway" in back.stdout, back.stderr + gateway.log()
    assert "the database did not answer" in gateway.log()


def test_a_database_that_hangs_is_reported_before_the_login_times_out(relayed):
    relay, gateway, key = relayed

    relay.cut()
    relay.up(silent=True)
    started = time.monotonic()
    down = ask_the_gateway(gateway, key)
    waited = time.monotonic() - started

    assert DATABASE_DOWN in down.stderr, down.stderr
    assert waited < LOGIN_TIMEOUT_SECONDS
