"""The gateway's fast path (portal/gateway/fast_path.py): a lab GET from a session the gateway has just
allowed is forwarded below the ASGI layers, and must answer exactly as the general path would.

The first request of a session is decided the general way and remembered; the ones after it take the
fast path. The server here runs with the HTTP protocol the deploy kit gives uvicorn
(tests/gateway/helpers.py, ServerThread).
"""

import logging
import socket
import threading
import uuid

import pytest
from django.conf import settings
from django.test import Client

from portal.gateway import app as gateway_app
from portal.gateway.http_proxy import reply
from portal.gateway.pages import Reply

from .helpers import RecordingUpstream, browser, lab_url, make_instance, session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)

UPSTREAM_ID = uuid.uuid4()


@pytest.fixture
def upstream():
    with RecordingUpstream(instance_id=UPSTREAM_ID) as server:
        yield server


@pytest.fixture
def alice_fake_lab(alice, image, upstream):
    return make_instance(
        alice, image, endpoint=upstream.endpoint, token="t0ken" * 8, instance_id=UPSTREAM_ID
    )


@pytest.fixture
def general_path_marked(monkeypatch):
    """Makes every request the general path forwards answer 299, so a test can tell the paths apart."""

    async def marked(scope, receive, send, **kwargs):
        await reply(send, Reply(299, [(b"content-type", b"text/plain")], b"general path"))

    monkeypatch.setattr(gateway_app, "proxy_http", marked)


def test_a_sessions_later_lab_requests_skip_the_general_path_and_its_first_does_not(
    client, alice, alice_fake_lab, upstream, portal_server, general_path_marked
):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        first = alice_browser.get(lab_url(alice_fake_lab.id, "api/status"))
        later = [alice_browser.get(lab_url(alice_fake_lab.id, "api/status")) for _ in range(3)]

    assert first.status_code == 299
    assert [response.status_code for response in later] == [200, 200, 200]
    assert all(response.json() == {"ok": True} for response in later)


def test_the_fast_path_never_answers_another_session_or_a_logged_out_one(
    client, alice, bob, alice_fake_lab, upstream, portal_server, general_path_marked
):
    alice_session = session_cookie_for(client, alice)
    with browser(portal_server, alice_session) as alice_browser:
        alice_browser.get(lab_url(alice_fake_lab.id, "api/status"))
        assert alice_browser.get(lab_url(alice_fake_lab.id, "api/status")).status_code == 200
    with browser(portal_server, session_cookie_for(Client(), bob)) as bob_browser:
        assert bob_browser.get(lab_url(alice_fake_lab.id, "api/status")).status_code == 404
    with browser(portal_server, alice_session + "x") as forger:
        assert forger.get(lab_url(alice_fake_lab.id, "api/status")).status_code == 401

    client.logout()

    with browser(portal_server, alice_session) as alice_browser:
        assert alice_browser.get(lab_url(alice_fake_lab.id, "api/status")).status_code == 401


def test_the_fast_path_sends_jupyterlab_the_token_and_none_of_the_portals_cookies(
    client, alice, alice_fake_lab, upstream, portal_server
):
    alice_session = session_cookie_for(client, alice)
    with browser(portal_server, alice_session) as alice_browser:
        alice_browser.cookies.set(settings.CSRF_COOKIE_NAME, "portal-csrf")
        alice_browser.cookies.set("_xsrf", "jupyters-own")
        for _ in range(2):
            assert alice_browser.get(lab_url(alice_fake_lab.id, "api/status?x=%2F1")).status_code == 200

    general, fast = upstream.requests
    for seen in (general, fast):
        assert seen["headers"]["authorization"] == f"token {alice_fake_lab.jupyter_token}"
        assert alice_session not in " ".join(seen["cookies"])
        assert "portal-csrf" not in " ".join(seen["cookies"])
        assert "_xsrf=jupyters-own" in " ".join(seen["cookies"])
        assert seen["path"] == f"{upstream.prefix}api/status?x=%2F1"
    assert fast["headers"]["host"] == general["headers"]["host"]


def test_the_fast_path_filters_what_the_instance_sends_back_as_the_general_path_does(
    client, alice, alice_fake_lab, upstream, portal_server
):
    prefix = upstream.prefix
    upstream.responses["api/status"] = (
        200,
        [
            ("Set-Cookie", f"{settings.SESSION_COOKIE_NAME}=planted; Path=/"),
            ("Set-Cookie", f"__Host-{settings.SESSION_COOKIE_NAME}=planted; Path=/"),
            ("Set-Cookie", "everywhere=1; Path=/"),
            ("Set-Cookie", f"parent=1; Domain=127.0.0.1; Path={prefix}"),
            ("Set-Cookie", f"smuggled=1; Path={prefix}; {settings.SESSION_COOKIE_NAME}=planted"),
            ("Set-Cookie", f"_xsrf=fine; Path={prefix}"),
            ("Set-Cookie", "relative=fine"),
            ("Access-Control-Allow-Origin", "https://evil.example"),
            ("Location", f"{upstream.endpoint}{prefix}tree?token={alice_fake_lab.jupyter_token}"),
        ],
        b"{}",
    )
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        general, fast = (alice_browser.get(lab_url(alice_fake_lab.id, "api/status")) for _ in range(2))

    for response in (general, fast):
        names = sorted(c.split("=")[0] for c in response.headers.get_list("set-cookie"))
        assert names == ["_xsrf", "relative"]
        assert "access-control-allow-origin" not in response.headers
        assert response.headers["location"] == f"{prefix}tree"
    assert fast.content == general.content == b"{}"


def test_pages_that_carry_the_token_and_large_answers_go_the_general_way(
    client, alice, alice_fake_lab, upstream, portal_server
):
    token = alice_fake_lab.jupyter_token
    upstream.responses["lab"] = (200, [("Content-Type", "text/html")], f'{{"token": "{token}"}}'.encode())
    big = bytes(range(256)) * 1024  # 256 KiB, more than the fast path reads whole
    upstream.responses["files/big.bin"] = (200, [("Content-Type", "application/octet-stream")], big)
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        alice_browser.get(lab_url(alice_fake_lab.id, "api/status"))
        page = alice_browser.get(lab_url(alice_fake_lab.id, "lab"))
        download = alice_browser.get(lab_url(alice_fake_lab.id, "files/big.bin"))

    assert page.status_code == 200 and token not in page.text and '"token": ""' in page.text
    assert download.status_code == 200 and download.content == big


class OneAnswerPerConnection:
    """A stand-in JupyterLab that keeps a connection alive after its first answer, then drops it on the
    next request without a byte: what a JupyterLab that timed out an idle connection looks like to a
    client that reuses it at that moment."""

    def __init__(self, prefix: str):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.prefix = prefix
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer_once, args=(connection,), daemon=True).start()

    @staticmethod
    def _answer_once(connection):
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                request += chunk
            body = b'{"answered": true}'
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            # Waits for the next request on this connection, and drops it unanswered.
            connection.recv(65536)

    def close(self):
        self.listener.close()


def test_a_kept_alive_connection_jupyterlab_drops_is_retried_once_on_a_new_one(
    client, alice, image, portal_server, general_path_marked
):
    instance_id = uuid.uuid4()
    lab = OneAnswerPerConnection(f"/instances/{instance_id}/lab/")
    try:
        instance = make_instance(alice, image, endpoint=lab.endpoint, token="t" * 48, instance_id=instance_id)
        with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
            alice_browser.get(lab_url(instance.id, "api/status"))
            answers = [alice_browser.get(lab_url(instance.id, "api/status")) for _ in range(3)]
    finally:
        lab.close()

    assert [answer.json() for answer in answers] == [{"answered": True}] * 3
    # One for the first answer, then a new one each time the kept-alive one was dropped.
    assert lab.connections == 3


def test_pipelined_lab_requests_on_one_connection_are_answered_in_order(
    client, alice, alice_fake_lab, upstream, portal_server
):
    alice_session = session_cookie_for(client, alice)
    upstream.responses["api/one"] = (200, [("Content-Type", "text/plain")], b"first")
    upstream.responses["api/two"] = (200, [("Content-Type", "text/plain")], b"second")
    with browser(portal_server, alice_session) as alice_browser:
        assert alice_browser.get(lab_url(alice_fake_lab.id, "api/status")).status_code == 200

    requests = b"".join(
        (
            f"GET {lab_url(alice_fake_lab.id, name)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Cookie: {settings.SESSION_COOKIE_NAME}={alice_session}\r\n\r\n"
        ).encode()
        for name in ("api/one", "api/two")
    )
    with socket.create_connection(("127.0.0.1", portal_server.port), timeout=10) as connection:
        connection.sendall(requests)
        received = b""
        while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"second"):
            chunk = connection.recv(65536)
            assert chunk, f"the gateway closed the connection after {received!r}"
            received += chunk

    assert received.index(b"first") < received.index(b"second")


class FormattedAccessLog(logging.Handler):
    """uvicorn.access as `make run` prints it (uvicorn's own AccessFormatter), keeping each line or the
    error its formatting raised."""

    def __init__(self):
        from uvicorn.logging import AccessFormatter

        super().__init__(logging.INFO)
        self.setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False))
        self.lines, self.errors = [], []

    def emit(self, record):
        try:
            self.lines.append(self.format(record))
        except Exception as error:  # noqa: BLE001 -- what a log line costs make run's output is the point
            self.errors.append(repr(error))


@pytest.fixture
def access_log():
    logger = logging.getLogger("uvicorn.access")
    handler, level = FormattedAccessLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_fast_path_requests_are_logged_like_every_other_request(
    client, alice, alice_fake_lab, upstream, portal_server, access_log
):
    # make run logs every request; a line uvicorn's formatter cannot read was a traceback in its output.
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        answers = [alice_browser.get(lab_url(alice_fake_lab.id, "api/status")) for _ in range(3)]

    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert access_log.errors == []
    path = lab_url(alice_fake_lab.id, "api/status")
    assert sum(f'"GET {path} HTTP/1.1" 200' in line for line in access_log.lines) == 3
