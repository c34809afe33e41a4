"""The readiness wait asks a starting JupyterLab once a second until the lab prints that it serves, then
at once: a burst of starting instances leaves their start-up the CPU, and the launch still ends the
moment JupyterLab answers. A lab that never prints the line is still found."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from portal.instances.lifecycle import wait_until_ready
from portal.instances.models import Instance
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
