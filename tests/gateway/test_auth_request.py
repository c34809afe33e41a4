"""The nginx `auth_request` endpoint production uses: it names the upstream and token for the owner only,
and answers nobody but the reverse proxy holding the shared secret."""

import uuid

import pytest

from portal.instances.models import Instance

from .helpers import browser, session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "nginx-shared-secret-for-tests"


@pytest.fixture
def gateway_secret(settings):
    settings.GATEWAY_AUTH_SECRET = SECRET
    return SECRET


def auth_request(portal_server, session_key, instance_id, secret=SECRET):
    headers = {"X-DevCloud-Gateway-Secret": secret} if secret else {}
    with browser(portal_server, session_key) as proxy:
        return proxy.get(f"/instances/{instance_id}/auth", headers=headers)


def test_it_tells_nginx_where_the_owner_lab_is(client, alice, alice_lab, gateway_secret, portal_server):
    response = auth_request(portal_server, session_cookie_for(client, alice), alice_lab.id)

    assert response.status_code == 204
    assert response.headers["x-devcloud-upstream"] == alice_lab.driver_state["endpoint"]
    assert response.headers["x-devcloud-token"] == alice_lab.jupyter_token


def test_it_answers_401_for_a_browser_without_a_session(alice_lab, gateway_secret, portal_server):
    response = auth_request(portal_server, None, alice_lab.id)

    assert response.status_code == 401
    assert "x-devcloud-token" not in response.headers


def test_it_answers_403_for_another_user_and_unknown_ids(
    client, bob, alice_lab, gateway_secret, portal_server
):
    bob_session = session_cookie_for(client, bob)

    for instance_id in (alice_lab.id, uuid.uuid4(), "not-a-uuid"):
        response = auth_request(portal_server, bob_session, instance_id)
        assert response.status_code == 403
        assert response.headers["x-devcloud-status"] == "404"
        assert "x-devcloud-token" not in response.headers


def test_it_answers_403_for_an_instance_that_is_not_running(
    client, alice, alice_lab, gateway_secret, portal_server
):
    Instance.objects.filter(id=alice_lab.id).update(state=Instance.State.STOPPED)

    response = auth_request(portal_server, session_cookie_for(client, alice), alice_lab.id)

    assert response.status_code == 403
    assert response.headers["x-devcloud-status"] == "409"


@pytest.mark.parametrize("presented", [None, "wrong-secret"])
def test_it_hides_the_endpoint_from_anyone_without_the_secret(
    client, alice, alice_lab, gateway_secret, portal_server, presented
):
    response = auth_request(portal_server, session_cookie_for(client, alice), alice_lab.id, secret=presented)

    assert response.status_code == 403
    assert "x-devcloud-upstream" not in response.headers
    assert alice_lab.jupyter_token not in repr(response.headers) + response.text


def test_it_is_off_when_no_secret_is_configured(client, alice, alice_lab, settings, portal_server):
    settings.GATEWAY_AUTH_SECRET = ""

    response = auth_request(portal_server, session_cookie_for(client, alice), alice_lab.id, secret="")

    assert response.status_code == 404


@pytest.mark.parametrize(
    "presented",
    [
        "nginx-shared-secret-for-tésts".encode(),  # non-ASCII bytes, UTF-8
        b"\xff\xfe\x80 not even utf-8",
        SECRET.encode() + b"\xe9",
    ],
)
def test_it_answers_403_not_500_to_a_non_ascii_secret(
    client, alice, alice_lab, gateway_secret, portal_server, presented
):
    with browser(portal_server, session_cookie_for(client, alice)) as attacker:
        response = attacker.get(
            f"/instances/{alice_lab.id}/auth", headers={"X-DevCloud-Gateway-Secret": presented}
        )

    assert response.status_code == 403
    assert "x-devcloud-token" not in response.headers
    assert alice_lab.jupyter_token not in response.text


def test_it_refuses_an_http_origin_when_the_lab_is_served_over_https(
    client, alice, alice_lab, gateway_secret, portal_server
):
    # nginx terminates TLS and says so with X-Forwarded-Proto; a page on plain http:// (an attacker on the
    # network can inject one) is another origin, even on the same host name.
    host = "lab.example.test"
    with browser(portal_server, session_cookie_for(client, alice)) as nginx:
        same = nginx.get(
            f"/instances/{alice_lab.id}/auth",
            headers={
                "X-DevCloud-Gateway-Secret": SECRET,
                "Host": host,
                "X-Forwarded-Proto": "https",
                "Origin": f"https://{host}",
            },
        )
        downgraded = nginx.get(
            f"/instances/{alice_lab.id}/auth",
            headers={
                "X-DevCloud-Gateway-Secret": SECRET,
                "Host": host,
                "X-Forwarded-Proto": "https",
                "Origin": f"http://{host}",
            },
        )

    assert same.status_code == 204
    assert downgraded.status_code == 403
    assert downgraded.headers["x-devcloud-status"] == "403"
    assert "x-devcloud-token" not in downgraded.headers


def test_it_tells_nginx_which_cookies_the_instance_may_see(
    client, alice, alice_lab, gateway_secret, portal_server
):
    session_key = session_cookie_for(client, alice)
    with browser(portal_server, session_key) as nginx:
        nginx.cookies.set("_xsrf", "lab-own")
        nginx.cookies.set("devcloud_lab_handshake", "handshake-value")
        response = nginx.get(f"/instances/{alice_lab.id}/auth", headers={"X-DevCloud-Gateway-Secret": SECRET})

    assert response.status_code == 204
    assert response.headers["x-devcloud-cookie"] == "_xsrf=lab-own"
