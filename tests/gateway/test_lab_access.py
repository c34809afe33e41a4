"""Nobody but the owner of a running instance gets into its JupyterLab, over HTTP or websockets.

Alice owns the instance. Bob is another developer, Olivia an operator (staff get no way in: the lab
holds the owner's code, data and credentials). Refusals never tell whether an id exists.
"""

import time
import uuid
from datetime import timedelta

import pytest
import websocket
from django.contrib.sessions.models import Session
from django.utils import timezone

from portal.gateway.access import decision_cache
from portal.instances.models import Instance

from .helpers import HTML, browser, lab_url, session_cookie_for, ws_connect

pytestmark = pytest.mark.django_db(transaction=True)


def lab_status(portal_server, session_key, instance_id, **kwargs):
    with browser(portal_server, session_key) as some_browser:
        return some_browser.get(lab_url(instance_id, "api/status"), **kwargs)


def lab_page(portal_server, session_key, instance_id):
    with browser(portal_server, session_key) as some_browser:
        return some_browser.get(lab_url(instance_id, "lab"), headers=HTML)


def ws_refusal(portal_server, session_key, instance_id) -> int:
    """The HTTP status the gateway refused a kernel websocket handshake with."""
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        ws_connect(portal_server, lab_url(instance_id, f"api/kernels/{uuid.uuid4()}/channels"), session_key)
    return refused.value.status_code


def test_it_refuses_another_user_as_if_the_instance_did_not_exist(client, bob, alice_lab, portal_server):
    bob_session = session_cookie_for(client, bob)

    assert lab_status(portal_server, bob_session, alice_lab.id).status_code == 404
    page = lab_page(portal_server, bob_session, alice_lab.id)
    forged = lab_page(portal_server, bob_session, uuid.uuid4())
    assert page.status_code == forged.status_code == 404
    assert page.text.replace(str(alice_lab.id), "") == forged.text.replace(
        str(forged.url.path.split("/")[2]), ""
    )
    assert ws_refusal(portal_server, bob_session, alice_lab.id) == 404


def test_it_gives_staff_no_access_to_a_developer_lab(client, olivia, alice_lab, portal_server):
    olivia_session = session_cookie_for(client, olivia)

    assert lab_status(portal_server, olivia_session, alice_lab.id).status_code == 404
    assert ws_refusal(portal_server, olivia_session, alice_lab.id) == 404


def test_it_sends_an_anonymous_browser_to_log_in_and_back(alice_lab, portal_server):
    response = lab_page(portal_server, None, alice_lab.id)

    assert response.status_code == 302
    assert response.headers["location"] == f"/accounts/login/?next=/instances/{alice_lab.id}/lab/lab"


def test_it_answers_anonymous_api_calls_with_401(alice_lab, portal_server):
    response = lab_status(portal_server, None, alice_lab.id)

    assert response.status_code == 401
    assert "Sign in" in response.json()["message"]
    assert ws_refusal(portal_server, None, alice_lab.id) == 401


def test_it_tells_an_anonymous_browser_nothing_about_which_ids_exist(alice_lab, portal_server):
    real = lab_status(portal_server, None, alice_lab.id)
    forged = lab_status(portal_server, None, uuid.uuid4())

    assert real.status_code == forged.status_code == 401
    assert real.content == forged.content


def test_it_refuses_a_forged_instance_id(client, alice, alice_lab, portal_server):
    alice_session = session_cookie_for(client, alice)

    assert lab_status(portal_server, alice_session, uuid.uuid4()).status_code == 404
    assert ws_refusal(portal_server, alice_session, uuid.uuid4()) == 404


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "1", "%2e%2e", "00000000-0000-0000-0000-00000000000g"])
def test_it_refuses_a_malformed_instance_id(client, alice, alice_lab, portal_server, bad_id):
    alice_session = session_cookie_for(client, alice)

    assert lab_status(portal_server, alice_session, bad_id).status_code == 404
    assert ws_refusal(portal_server, alice_session, bad_id) == 404


def test_it_refuses_a_session_after_logout(client, alice, alice_lab, portal_server):
    alice_session = session_cookie_for(client, alice)
    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 200

    client.logout()

    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 401
    assert lab_page(portal_server, alice_session, alice_lab.id).status_code == 302
    assert ws_refusal(portal_server, alice_session, alice_lab.id) == 401


def test_it_refuses_a_session_removed_elsewhere_once_the_cache_lapses(
    client, alice, alice_lab, portal_server
):
    # Another portal process flushed it: no signal reaches this one, so the short cache is the limit.
    alice_session = session_cookie_for(client, alice)
    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 200

    Session.objects.filter(session_key=alice_session).delete()
    time.sleep(decision_cache.ttl + 0.2)

    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 401


def test_it_refuses_an_expired_session(client, alice, alice_lab, portal_server):
    alice_session = session_cookie_for(client, alice)
    Session.objects.filter(session_key=alice_session).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )

    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 401
    assert ws_refusal(portal_server, alice_session, alice_lab.id) == 401


def test_it_refuses_a_session_from_before_a_password_change(client, alice, alice_lab, portal_server):
    alice_session = session_cookie_for(client, alice)
    alice.set_password("a completely new passphrase")
    alice.save()

    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 401


def test_it_keeps_the_portal_session_through_a_secret_key_rotation(
    client, alice, alice_lab, portal_server, settings
):
    alice_session = session_cookie_for(client, alice)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-freshly-rotated-secret-key-0123456789abcdefghijklmnopqrstuvwxyz"

    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 200
    # The gateway must not rotate the session key behind the portal's back (the browser would be
    # left holding a dead cookie).
    assert Session.objects.filter(session_key=alice_session).exists()


def test_it_refuses_an_inactive_user(client, alice, alice_lab, portal_server):
    alice_session = session_cookie_for(client, alice)
    alice.is_active = False
    alice.save(update_fields=["is_active"])

    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 401
    assert ws_refusal(portal_server, alice_session, alice_lab.id) == 401


@pytest.mark.parametrize("state", ["queued", "provisioning", "stopping", "stopped", "failed"])
def test_it_refuses_an_instance_that_is_not_running(client, alice, alice_lab, portal_server, state):
    Instance.objects.filter(id=alice_lab.id).update(state=state)
    alice_session = session_cookie_for(client, alice)

    page = lab_page(portal_server, alice_session, alice_lab.id)
    assert page.status_code == 409
    assert "isn&#x27;t running" in page.text
    assert 'href="/instances/"' in page.text
    assert lab_status(portal_server, alice_session, alice_lab.id).status_code == 409
    assert ws_refusal(portal_server, alice_session, alice_lab.id) == 409


def test_it_refuses_a_websocket_opened_from_another_site(client, alice, alice_lab, portal_server):
    alice_session = session_cookie_for(client, alice)
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        ws_connect(
            portal_server,
            lab_url(alice_lab.id, "api/events/subscribe"),
            alice_session,
            origin="https://evil.example",
        )

    assert refused.value.status_code == 403


def test_it_leaves_the_rest_of_the_portal_to_django(client, alice, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get("/instances/", headers=HTML)

    assert response.status_code == 200
    assert "Instances" in response.text


def test_deciding_a_sessions_first_lab_request_reads_the_database_twice(
    client, alice, alice_lab, django_assert_num_queries
):
    # The session with the instance, then the user (Django's auth.get_user): a page load's first
    # request waits on two round trips, not three.
    from portal.gateway.access import access_check

    alice_session = session_cookie_for(client, alice)
    with django_assert_num_queries(2):
        decision = access_check(session_key=alice_session, instance_id=str(alice_lab.id))

    assert decision.allowed and decision.endpoint and decision.token == alice_lab.jupyter_token
