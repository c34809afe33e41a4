"""The readiness wait asks a starting JupyterLab once a second until the lab prints that it serves, then
at once: a burst of starting instances leaves their start-up the CPU, and the launch still ends the
moment JupyterLab answers. A lab that never prints the line is still found. An instance with an sshd is
ready only once that sshd greets too, so `devcloud ssh` works the moment `launch --wait` returns."""

import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from portal.instances import lifecycle
from portal.instances.lifecycle import wait_until_ready
from portal.instances.models import Instance, InstanceEvent
from provisioning.drivers import fake
from provisioning.drivers.base import PollResult

pytestmark = pytest.mark.django_db(transaction=True)


class StartingLab:
    """A stand-in JupyterLab: /api/status answers 503 until `ready` is set; counts what it was asked."""

    def __init__(self):
        self.ready = threading.Event()
        self.asked = 0
        lab = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                lab.asked += 1
                self.send_response(200 if lab.ready.is_set() else 503)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"


class OutputWatchingDriver:
    """A driver that follows its instance's output, as the docker driver does; `print_serving_line()`
    makes the instance print JupyterLab's serving line."""

    watches_output = True

    def __init__(self):
        self._printed = threading.Event()

    def print_serving_line(self):
        self._printed.set()

    def wait_for_output(self, instance, text, deadline, cancelled):
        while not self._printed.wait(0.02):
            if cancelled.is_set() or time.monotonic() >= deadline:
                return False
        return True

    def poll(self, instance):
        return PollResult(status="running")


@pytest.fixture
def lab():
    lab = StartingLab()
    yield lab
    lab.server.shutdown()


@pytest.fixture
def starting(alice):
    host = fake.make_host("gpu-01")
    image = fake.make_image("cpu")
    return Instance.objects.create(
        user=alice, size="1x", image=image, host=host, state=Instance.State.PROVISIONING, jupyter_token="t" * 48
    )


def _wait_in_background(instance, driver, endpoint):
    outcome = {}
    thread = threading.Thread(
        target=lambda: outcome.update(result=wait_until_ready(instance, driver, endpoint=endpoint)), daemon=True
    )
    thread.start()
    return thread, outcome


def test_it_asks_a_starting_lab_about_once_a_second_until_the_lab_prints_that_it_serves(lab, starting):
    driver = OutputWatchingDriver()
    thread, outcome = _wait_in_background(starting, driver, lab.endpoint)

    time.sleep(2.5)
    asked_while_starting = lab.asked
    lab.ready.set()
    driver.print_serving_line()
    thread.join(timeout=10)

    assert outcome["result"].ready
    # At 20 polls a second it would have asked about fifty times.
    assert 1 <= asked_while_starting <= 4


def test_it_finds_a_lab_that_never_prints_the_serving_line(lab, starting):
    driver = OutputWatchingDriver()
    thread, outcome = _wait_in_background(starting, driver, lab.endpoint)

    time.sleep(0.5)
    lab.ready.set()
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert outcome["result"].ready


def test_a_driver_that_cannot_follow_output_is_polled_fast_from_the_start(lab, starting):
    driver = OutputWatchingDriver()
    driver.watches_output = False
    thread, outcome = _wait_in_background(starting, driver, lab.endpoint)

    time.sleep(1.0)
    asked = lab.asked
    lab.ready.set()
    thread.join(timeout=10)

    assert outcome["result"].ready
    assert asked >= 8


@pytest.mark.parametrize("watches_output", [True, False])
def test_once_it_serves_it_asks_about_twenty_times_a_second_not_in_a_loop(lab, starting, watches_output):
    driver = OutputWatchingDriver()
    driver.watches_output = watches_output
    driver.print_serving_line()
    thread, outcome = _wait_in_background(starting, driver, lab.endpoint)

    time.sleep(1.0)
    asked = lab.asked
    lab.ready.set()
    thread.join(timeout=10)

    assert outcome["result"].ready
    # Every READY_POLL_SECONDS (0.05 s); without a pause between polls it asked hundreds of times.
    assert 8 <= asked <= 30


class StartingSshd:
    """A stand-in for an instance's published sshd port: until `ready` is set it accepts and closes at
    once, as the engine's port proxy does before sshd inside listens; then it greets like OpenSSH."""

    def __init__(self):
        self.ready = threading.Event()
        self.greeted = 0
        sshd = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                if sshd.ready.is_set():
                    sshd.greeted += 1
                    self.request.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u6\r\n")
                    self.request.recv(64)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]


@pytest.fixture
def sshd():
    sshd = StartingSshd()
    yield sshd
    sshd.server.shutdown()
    sshd.server.server_close()


def _with_sshd(instance, port):
    instance.driver_state = {"ssh_port": port}
    return instance


def test_an_instance_whose_lab_answers_is_not_ready_until_its_sshd_greets(lab, starting, sshd):
    driver = OutputWatchingDriver()
    driver.print_serving_line()
    lab.ready.set()
    thread, outcome = _wait_in_background(_with_sshd(starting, sshd.port), driver, lab.endpoint)

    time.sleep(1.5)
    assert thread.is_alive() and "result" not in outcome
    sshd.ready.set()
    greeted_at = time.monotonic()
    thread.join(timeout=10)

    assert outcome["result"].ready
    # Checked in the same loop as the lab: done within a poll or two, no fixed sleep.
    assert time.monotonic() - greeted_at < 0.5
    assert sshd.greeted == 1


def test_an_sshd_that_greets_first_waits_only_for_the_lab(lab, starting, sshd):
    driver = OutputWatchingDriver()
    driver.print_serving_line()
    sshd.ready.set()
    thread, outcome = _wait_in_background(_with_sshd(starting, sshd.port), driver, lab.endpoint)

    time.sleep(0.5)
    assert thread.is_alive()
    lab.ready.set()
    thread.join(timeout=10)

    assert outcome["result"].ready and sshd.greeted == 1


def test_an_image_whose_sshd_never_greets_is_ready_after_the_grace_with_a_timeline_line(
    lab, starting, monkeypatch
):
    monkeypatch.setattr(lifecycle, "SSH_GRACE_AFTER_LAB_SECONDS", 1.0)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nothing_listens = closed.getsockname()[1]
    driver = OutputWatchingDriver()
    driver.print_serving_line()
    lab.ready.set()
    started = time.monotonic()

    outcome = wait_until_ready(_with_sshd(starting, nothing_listens), driver, endpoint=lab.endpoint)

    assert outcome.ready and 1.0 <= time.monotonic() - started < 3
    lines = list(InstanceEvent.objects.filter(instance=starting).values_list("message", flat=True))
    assert lines == [
        "Its SSH server did not answer within 1 seconds of JupyterLab, so SSH may not reach it; JupyterLab works."
    ]
