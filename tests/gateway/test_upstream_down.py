"""When JupyterLab is not answering, the owner is told so and what to do, instead of a bare error."""

import secrets

import pytest
import websocket

from .helpers import HTML, browser, free_port, lab_url, make_instance, session_cookie_for, ws_connect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice_dead_lab(alice, image):
    # Nothing listens on this port: the container is gone or JupyterLab has not started yet.
    return make_instance(
        alice, image, endpoint=f"http://127.0.0.1:{free_port()}", token=secrets.token_hex(24)
    )


def test_it_explains_a_lab_that_is_not_answering(client, alice, alice_dead_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_dead_lab.id, "lab"), headers=HTML)

    assert response.status_code == 502
    assert "JupyterLab isn&#x27;t answering yet, or anymore." in response.text
    assert "wait a few seconds and try again" in response.text
    assert f'href="/instances/{alice_dead_lab.id}/lab/lab"' in response.text
    assert 'href="/instances/"' in response.text
    assert alice_dead_lab.jupyter_token not in response.text


def test_it_answers_api_calls_to_a_dead_lab_with_json(client, alice, alice_dead_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_dead_lab.id, "api/status"))

    assert response.status_code == 502
    assert "isn't answering" in response.json()["message"]


def test_it_refuses_a_websocket_to_a_dead_lab_with_502(client, alice, alice_dead_lab, portal_server):
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        ws_connect(
            portal_server,
            lab_url(alice_dead_lab.id, "api/events/subscribe"),
            session_cookie_for(client, alice),
        )

    assert refused.value.status_code == 502


def test_it_treats_a_running_instance_without_an_endpoint_as_not_answering(
    client, alice, image, portal_server
):
    instance = make_instance(alice, image, endpoint="", token=secrets.token_hex(24))

    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(instance.id, "api/status"))

    assert response.status_code == 502
