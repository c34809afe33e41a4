"""The lab cookie (it carries the portal session, encrypted) and the portal's own cookies never reach the
instance, over HTTP or websockets, when the lab host is passed to the gateway whole (subdomain mode
without nginx's auth_request). Whatever reaches the container, its owner's code can read."""

import secrets
import uuid

import pytest
import websocket
from django.conf import settings

from .helpers import (
    EchoWebsocketUpstream,
    RecordingUpstream,
    browser,
    enter_lab,
    lab_host,
    lab_url,
    make_instance,
    session_cookie_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

UPSTREAM_ID = uuid.uuid4()


@pytest.fixture
def subdomain_mode(settings):
    settings.GATEWAY_LAB_URL = "https://{instance_id}.lab.example.com"


def everything_the_browser_holds(session_key, lab_cookies) -> str:
    portal = {settings.SESSION_COOKIE_NAME: session_key, settings.CSRF_COOKIE_NAME: "c" * 32}
    cookies = {**portal, **lab_cookies, "_xsrf": "jupyter-own"}
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


def test_it_never_sends_the_lab_or_portal_cookies_upstream_over_http(
    client, alice, image, portal_server, subdomain_mode
):
    with RecordingUpstream(instance_id=UPSTREAM_ID) as upstream:
        lab = make_instance(
            alice, image, endpoint=upstream.endpoint, token=secrets.token_hex(24), instance_id=UPSTREAM_ID
        )
        session_key = session_cookie_for(client, alice)
        lab_cookies = enter_lab(portal_server, session_key, lab.id)
        assert lab_cookies, "the handshake set no lab cookie"
        with browser(portal_server) as lab_browser:
            response = lab_browser.get(
                lab_url(lab.id, "api/status"),
                headers={
                    "Host": lab_host(lab.id),
                    "Cookie": everything_the_browser_holds(session_key, lab_cookies),
                },
            )

    assert response.status_code == 200
    (seen,) = upstream.requests
    everything = repr(seen)
    for value in [session_key, "c" * 32, *lab_cookies.values()]:
        assert value not in everything
    assert seen["cookies"] == ["_xsrf=jupyter-own"]


def test_it_never_sends_the_lab_or_portal_cookies_upstream_over_a_websocket(
    client, alice, image, portal_server, subdomain_mode
):
    with EchoWebsocketUpstream() as upstream:
        lab = make_instance(alice, image, endpoint=upstream.endpoint, token=secrets.token_hex(24))
        session_key = session_cookie_for(client, alice)
        lab_cookies = enter_lab(portal_server, session_key, lab.id)
        ws = websocket.create_connection(
            portal_server.url.replace("http://", "ws://") + lab_url(lab.id, "api/events/subscribe"),
            host=lab_host(lab.id),
            origin=f"http://{lab_host(lab.id)}",
            cookie=everything_the_browser_holds(session_key, lab_cookies),
            timeout=30,
        )
        try:
            ws.send("ping")
            assert ws.recv() == "ping"
        finally:
            ws.close()

    (handshake,) = upstream.handshakes
    everything = repr(handshake)
    for value in [session_key, "c" * 32, *lab_cookies.values()]:
        assert value not in everything
    assert handshake["headers"]["cookie"] == "_xsrf=jupyter-own"
