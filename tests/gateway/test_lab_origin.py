"""The Origin check compares scheme, host and port: behind TLS, a page served over plain http:// on the
same host name is another origin (a network attacker can inject one into any http:// response), and it
must not drive a kernel with the user's cookies."""

import secrets
import uuid

import pytest
import websocket
from django.conf import settings

from .helpers import (
    EchoWebsocketUpstream,
    RecordingUpstream,
    browser,
    lab_url,
    make_instance,
    session_cookie_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

UPSTREAM_ID = uuid.uuid4()
# What the TLS-terminating proxy in front of uvicorn adds; uvicorn trusts it from 127.0.0.1.
BEHIND_TLS = {"X-Forwarded-Proto": "https"}


@pytest.fixture
def upstream():
    with RecordingUpstream(instance_id=UPSTREAM_ID) as server:
        yield server


@pytest.fixture
def alice_fake_lab(alice, image, upstream):
    return make_instance(
        alice, image, endpoint=upstream.endpoint, token=secrets.token_hex(24), instance_id=UPSTREAM_ID
    )


def host_of(portal_server) -> str:
    return portal_server.url.removeprefix("http://")


def test_it_refuses_a_post_from_the_http_origin_of_an_https_portal(
    client, alice, alice_fake_lab, upstream, portal_server
):
    host = host_of(portal_server)
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        url = lab_url(alice_fake_lab.id, "api/kernels")
        same_origin = alice_browser.post(url, json={}, headers={**BEHIND_TLS, "Origin": f"https://{host}"})
        downgraded = alice_browser.post(url, json={}, headers={**BEHIND_TLS, "Origin": f"http://{host}"})

    assert same_origin.status_code == 200
    assert downgraded.status_code == 403
    assert len(upstream.requests) == 1


def test_it_refuses_a_websocket_from_the_http_origin_of_an_https_portal(client, alice, image, portal_server):
    with EchoWebsocketUpstream() as upstream:
        lab = make_instance(alice, image, endpoint=upstream.endpoint, token=secrets.token_hex(24))
        cookie = f"{settings.SESSION_COOKIE_NAME}={session_cookie_for(client, alice)}"
        url = portal_server.url.replace("http://", "ws://") + lab_url(lab.id, "api/events/subscribe")
        host = host_of(portal_server)

        same_origin = websocket.create_connection(
            url, origin=f"https://{host}", cookie=cookie, header=["X-Forwarded-Proto: https"], timeout=30
        )
        same_origin.close()
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(
                url, origin=f"http://{host}", cookie=cookie, header=["X-Forwarded-Proto: https"], timeout=30
            )

    assert refused.value.status_code == 403
    assert len(upstream.handshakes) == 1


@pytest.mark.parametrize("origin", ["http://[", "http://\u00e9vil.example", "null"])
def test_it_refuses_a_malformed_origin(client, alice, alice_fake_lab, upstream, portal_server, origin):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.post(
            lab_url(alice_fake_lab.id, "api/kernels"), json={}, headers={"Origin": origin.encode()}
        )

    assert response.status_code == 403
    assert upstream.requests == []
