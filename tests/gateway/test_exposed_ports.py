"""An instance's web app on an exposed port, through the gateway, with a real container: the CPU image
running a small app (tests/support/port_app.py) on port 8000, reached at `<short id>-8000.localhost`."""

import json
from datetime import timedelta

import httpx
import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from portal.ports import services
from portal.ports.models import ExposedPort, ShareLink
from tests.conftest import make_user
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)
from tests.support.port_app import (
    APP_PORT,
    instance_container_fixture,  # noqa: F401  (registers instance_container)
)

from .helpers import enter_port, make_instance, port_get, port_host, session_cookie_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300, func_only=True),
]


@pytest.fixture(autouse=True)
def site_is_the_test_server(settings, portal_server):
    # Port hosts are `<label>.localhost` on the portal's port; the server answers on a free one.
    settings.SITE_URL = portal_server.url


@pytest.fixture
def alice_instance(alice, image, instance_container):
    instance = make_instance(
        alice,
        image,
        endpoint=instance_container.endpoint,
        token=instance_container.token,
        instance_id=instance_container.instance_id,
    )
    instance.driver_state = {**instance.driver_state, "address": instance_container.address}
    instance.save(update_fields=["driver_state"])
    return instance


@pytest.fixture
def exposed(alice, alice_instance):
    return services.port_expose(user=alice, instance_id=alice_instance.id, port=APP_PORT)


def test_it_serves_the_owners_exposed_port_through_the_gateway(client, alice, exposed, portal_server):
    response, cookies = enter_port(
        portal_server, exposed.host_label, session_key=session_cookie_for(client, alice)
    )

    assert response.status_code == 200
    assert response.text == f"hello from port {APP_PORT}\n"
    # The ticket was turned into this port's cookie; the portal session never reached the port's host.
    assert set(cookies) == {django_settings.GATEWAY_LAB_COOKIE_NAME}


def test_a_streamed_response_arrives_chunk_by_chunk(
    client, alice, exposed, portal_server, instance_container
):
    _, cookies = enter_port(portal_server, exposed.host_label, session_key=session_cookie_for(client, alice))
    headers = {
        "Host": port_host(portal_server, exposed.host_label),
        "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()),
        "Accept": "text/event-stream",
    }

    with (
        httpx.Client(base_url=portal_server.url, timeout=30) as browser,
        browser.stream("GET", "/stream?id=chunks", headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = response.iter_raw()
        received = b""
        while b"data: first\n\n" not in received:
            received += next(chunks)
        # The app is still waiting for its signal: what arrived is the first event alone.
        assert b"last" not in received

        instance_container.release("chunks")
        rest = b"".join(chunks)

    assert received + rest == b"data: first\n\ndata: last\n\n"


def test_another_person_is_refused(client, alice, bob, exposed, portal_server):
    response, cookies = enter_port(
        portal_server, exposed.host_label, session_key=session_cookie_for(client, bob)
    )

    assert response.status_code == 404
    assert "Nothing is exposed to you at this address" in response.text
    assert cookies == {}


def test_a_port_the_owner_did_not_expose_is_refused(client, alice, alice_instance, exposed, portal_server):
    unexposed = f"{alice_instance.short_id}-8001"

    response, _ = enter_port(portal_server, unexposed, session_key=session_cookie_for(client, alice))

    assert response.status_code == 404
    assert "Nothing is exposed to you at this address" in response.text


def test_a_closed_port_is_refused_from_the_next_request(
    client, alice, alice_instance, exposed, portal_server
):
    _, secret = services.share_create(user=alice, instance_id=alice_instance.id, port=APP_PORT, hours=1)
    response, holder_cookies = enter_port(portal_server, exposed.host_label, share=secret)
    assert response.status_code == 200

    services.port_close(user=alice, instance_id=alice_instance.id, port=APP_PORT)

    # Its share link's holder at once; the owner too, on opening it again.
    assert port_get(portal_server, exposed.host_label, "/", holder_cookies).status_code == 404
    owner, _ = enter_port(portal_server, exposed.host_label, session_key=session_cookie_for(client, alice))
    assert owner.status_code == 404


def test_no_portal_cookie_and_no_token_go_upstream(client, alice, exposed, portal_server):
    _, cookies = enter_port(portal_server, exposed.host_label, session_key=session_cookie_for(client, alice))
    sent = {
        **cookies,
        django_settings.SESSION_COOKIE_NAME: "stolen-session",
        django_settings.CSRF_COOKIE_NAME: "csrf",
        f"{django_settings.GATEWAY_LAB_COOKIE_NAME}_handshake": "handshake",
        "messages": "m",
        "app_theme": "dark",
    }

    response = port_get(portal_server, exposed.host_label, "/headers", sent)

    assert response.status_code == 200
    seen = response.json()
    assert seen["cookie"] == ["app_theme=dark"]
    assert seen["authorization"] is None


def test_a_websocket_passes_through(client, alice, exposed, portal_server):
    import websocket

    _, cookies = enter_port(portal_server, exposed.host_label, session_key=session_cookie_for(client, alice))
    host = port_host(portal_server, exposed.host_label)

    ws = websocket.create_connection(
        f"ws://127.0.0.1:{portal_server.port}/ws",
        host=host,
        origin=f"http://{host}",
        cookie="; ".join(f"{k}={v}" for k, v in cookies.items()),
        timeout=30,
    )
    try:
        ws.send("hello")
        assert ws.recv() == "hello"
        ws.send_binary(b"\x00\x01")
        assert ws.recv() == b"\x00\x01"
    finally:
        ws.close()


def test_a_websocket_from_another_origin_is_refused(client, alice, exposed, portal_server):
    import websocket

    _, cookies = enter_port(portal_server, exposed.host_label, session_key=session_cookie_for(client, alice))

    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            f"ws://127.0.0.1:{portal_server.port}/ws",
            host=port_host(portal_server, exposed.host_label),
            origin="http://evil.example",
            cookie="; ".join(f"{k}={v}" for k, v in cookies.items()),
            timeout=30,
        )
    assert refused.value.status_code == 403


def test_a_websocket_to_a_port_nothing_listens_on_names_the_port_not_jupyterlab(
    client, alice, alice_instance, portal_server
):
    import websocket

    silent = services.port_expose(user=alice, instance_id=alice_instance.id, port=APP_PORT + 1)
    _, cookies = enter_port(portal_server, silent.host_label, session_key=session_cookie_for(client, alice))
    host = port_host(portal_server, silent.host_label)

    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            f"ws://127.0.0.1:{portal_server.port}/ws",
            host=host,
            origin=f"http://{host}",
            cookie="; ".join(f"{k}={v}" for k, v in cookies.items()),
            timeout=30,
        )

    assert refused.value.status_code == 502
    message = json.loads(refused.value.resp_body)["message"]
    assert message == f"The app on port {APP_PORT + 1} isn't answering yet, or anymore."


def test_a_share_link_admits_anyone_with_it_until_it_is_revoked(
    alice, alice_instance, exposed, portal_server
):
    link, secret = services.share_create(user=alice, instance_id=alice_instance.id, port=APP_PORT, hours=1)

    response, cookies = enter_port(portal_server, exposed.host_label, share=secret)
    assert response.status_code == 200
    assert response.text == f"hello from port {APP_PORT}\n"

    services.share_revoke(user=alice, instance_id=alice_instance.id, share_id=link.id)

    refused = port_get(portal_server, exposed.host_label, "/", cookies)
    assert refused.status_code == 404
    assert "revoked or has expired" in refused.text
    # The link itself no longer opens anything either.
    again, _ = enter_port(portal_server, exposed.host_label, share=secret)
    assert again.status_code == 404


def test_an_expired_share_link_is_refused(alice, alice_instance, exposed, portal_server):
    link, secret = services.share_create(user=alice, instance_id=alice_instance.id, port=APP_PORT, hours=1)
    _, cookies = enter_port(portal_server, exposed.host_label, share=secret)
    assert port_get(portal_server, exposed.host_label, "/", cookies).status_code == 200

    ShareLink.objects.filter(id=link.id).update(
        created_at=timezone.now() - timedelta(hours=2), expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert port_get(portal_server, exposed.host_label, "/", cookies).status_code == 404


def test_only_a_digest_of_the_share_secret_is_stored(alice, alice_instance, exposed):
    link, secret = services.share_create(user=alice, instance_id=alice_instance.id, port=APP_PORT, hours=1)

    row = ShareLink.objects.filter(id=link.id).values().get()
    assert secret not in json.dumps(row, default=str)


def test_a_share_link_for_a_named_person_admits_that_person_only(
    client, alice, bob, alice_instance, exposed, portal_server
):
    carol = make_user("carol@example.com", first_name="Carol")
    _, secret = services.share_create(
        user=alice, instance_id=alice_instance.id, port=APP_PORT, hours=1, email="bob@example.com"
    )

    anonymous, _ = enter_port(portal_server, exposed.host_label, share=secret)
    assert anonymous.status_code == 302
    assert anonymous.headers["location"].startswith("/accounts/login/")

    as_carol, carol_cookies = enter_port(
        portal_server, exposed.host_label, share=secret, session_key=session_cookie_for(client, carol)
    )
    assert as_carol.status_code == 404
    assert "made for another DevCloud account" in as_carol.text
    assert carol_cookies == {}

    as_bob, _ = enter_port(
        portal_server, exposed.host_label, share=secret, session_key=session_cookie_for(client, bob)
    )
    assert as_bob.status_code == 200
    assert as_bob.text == f"hello from port {APP_PORT}\n"


def test_traffic_to_the_port_is_recorded_for_idle_culling(client, alice, exposed, portal_server):
    assert ExposedPort.objects.get(id=exposed.id).last_traffic_at is None

    response, _ = enter_port(portal_server, exposed.host_label, session_key=session_cookie_for(client, alice))
    assert response.status_code == 200

    assert ExposedPort.objects.get(id=exposed.id).last_traffic_at is not None
