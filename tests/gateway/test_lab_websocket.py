"""Websockets through the gateway: frames, subprotocols and close codes pass as they are, and access
that ends (logout) ends open sockets too. The upstream is an echo server standing in for JupyterLab."""

import secrets
import struct
import time
import uuid

import pytest
import websocket
from django.conf import settings

import portal.asgi

from .helpers import EchoWebsocketUpstream, lab_url, make_instance, session_cookie_for, ws_connect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def echo_upstream():
    with EchoWebsocketUpstream() as server:
        yield server


@pytest.fixture
def alice_echo_lab(alice, image, echo_upstream):
    return make_instance(alice, image, endpoint=echo_upstream.endpoint, token=secrets.token_hex(24))


def close_code(ws) -> int:
    """Reads until the close frame and returns its code."""
    for _ in range(100):
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return struct.unpack("!H", frame.data[:2])[0]
    raise AssertionError("no close frame")


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def test_it_passes_text_and_binary_frames_unchanged(client, alice, alice_echo_lab, portal_server):
    ws = ws_connect(
        portal_server, lab_url(alice_echo_lab.id, "api/events/subscribe"), session_cookie_for(client, alice)
    )
    payload = secrets.token_bytes(1_000_000)
    try:
        ws.send("héllo")
        assert ws.recv_data() == (websocket.ABNF.OPCODE_TEXT, "héllo".encode())
        ws.send_binary(payload)
        assert ws.recv_data() == (websocket.ABNF.OPCODE_BINARY, payload)
    finally:
        ws.close()


def test_it_negotiates_the_subprotocol_with_the_lab(
    client, alice, alice_echo_lab, echo_upstream, portal_server
):
    session_key = session_cookie_for(client, alice)
    with_protocol = ws_connect(
        portal_server,
        lab_url(alice_echo_lab.id, "api/kernels/k/channels"),
        session_key,
        subprotocols=["v1.kernel.websocket.jupyter.org"],
    )
    without = ws_connect(portal_server, lab_url(alice_echo_lab.id, "api/kernels/k/channels"), session_key)
    with_protocol.close()
    without.close()

    assert with_protocol.subprotocol == "v1.kernel.websocket.jupyter.org"
    assert without.subprotocol is None
    # The stand-in records a handshake from its own thread, possibly after the client moved on.
    assert wait_for(lambda: len(echo_upstream.handshakes) == 2)
    assert [h["subprotocol"] for h in echo_upstream.handshakes] == ["v1.kernel.websocket.jupyter.org", None]


def test_it_keeps_the_portal_session_from_the_lab_websocket(
    client, alice, alice_echo_lab, echo_upstream, portal_server
):
    session_key = session_cookie_for(client, alice)
    ws = ws_connect(
        portal_server,
        lab_url(alice_echo_lab.id, "api/kernels/k/channels") + "?session_id=s1",
        None,
        cookie=f"{settings.SESSION_COOKIE_NAME}={session_key}; _xsrf=lab-cookie",
    )
    ws.close()

    assert wait_for(lambda: len(echo_upstream.handshakes) == 1)
    (handshake,) = echo_upstream.handshakes
    assert session_key not in repr(handshake)
    assert handshake["headers"]["cookie"] == "_xsrf=lab-cookie"
    assert handshake["headers"]["authorization"] == f"token {alice_echo_lab.jupyter_token}"
    assert handshake["headers"]["origin"] == echo_upstream.endpoint
    assert handshake["path"] == f"/instances/{alice_echo_lab.id}/lab/api/kernels/k/channels?session_id=s1"


def test_it_passes_the_browser_close_code_to_the_lab(
    client, alice, alice_echo_lab, echo_upstream, portal_server
):
    ws = ws_connect(
        portal_server, lab_url(alice_echo_lab.id, "api/events/subscribe"), session_cookie_for(client, alice)
    )
    ws.close(status=4001)

    assert wait_for(lambda: echo_upstream.closed_with == [4001]), echo_upstream.closed_with


def test_it_passes_the_lab_close_code_to_the_browser(client, alice, alice_echo_lab, portal_server):
    ws = ws_connect(
        portal_server, lab_url(alice_echo_lab.id, "api/events/subscribe"), session_cookie_for(client, alice)
    )
    ws.send("close 4321")

    assert close_code(ws) == 4321


def test_it_closes_an_open_websocket_when_the_user_logs_out(
    client, alice, alice_echo_lab, echo_upstream, portal_server, monkeypatch
):
    monkeypatch.setattr(portal.asgi.gateway, "recheck_seconds", 0.3)
    ws = ws_connect(
        portal_server, lab_url(alice_echo_lab.id, "api/events/subscribe"), session_cookie_for(client, alice)
    )
    ws.send("still here")
    assert ws.recv() == "still here"

    client.logout()

    assert close_code(ws) == 1008
    assert wait_for(lambda: echo_upstream.closed_with == [1008]), echo_upstream.closed_with


def test_it_refuses_a_websocket_outside_any_lab(client, alice, portal_server):
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        ws_connect(portal_server, f"/instances/{uuid.uuid4()}/", session_cookie_for(client, alice))

    assert refused.value.status_code == 404
