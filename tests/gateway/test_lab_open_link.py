"""The "Open JupyterLab" link, /instances/<uuid>/open, in path mode (make run) and subdomain mode
(production), where a short-lived ticket carries the portal session to the lab's own host."""

import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
import websocket
from django.conf import settings as django_settings

from portal.gateway import tickets
from portal.instances.models import Instance

from .helpers import HTML, browser, lab_host, open_until_ticket, redeem_ticket, session_cookie_for, ws_connect

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "nginx-shared-secret-for-tests"


@pytest.fixture
def subdomain_mode(settings):
    settings.GATEWAY_LAB_URL = "https://{instance_id}.lab.example.com"
    settings.GATEWAY_AUTH_SECRET = SECRET


def open_lab(portal_server, session_key, instance_id):
    with browser(portal_server, session_key) as some_browser:
        return some_browser.get(f"/instances/{instance_id}/open", headers=HTML)


def ticket_for(portal_server, session_key, instance_id):
    """Follows "Open JupyterLab" up to the ticket; returns (redeem URL, the browser's lab-host cookies)."""
    return open_until_ticket(portal_server, session_key, instance_id)


def redeem(portal_server, location, lab_cookies=None):
    """Follows the redirect to the lab host as nginx would pass it on: path and query unchanged."""
    return redeem_ticket(portal_server, location, {} if lab_cookies is None else lab_cookies)


def auth_with_lab_cookie(portal_server, instance_id, lab_cookie):
    with browser(portal_server) as nginx:
        return nginx.get(
            f"/instances/{instance_id}/auth",
            headers={
                "X-DevCloud-Gateway-Secret": SECRET,
                "Cookie": f"{tickets.lab_cookie_name()}={lab_cookie}",
            },
        )


def lab_cookie_from(response) -> str:
    (set_cookie,) = [
        c for c in response.headers.get_list("set-cookie") if c.startswith(f"{tickets.lab_cookie_name()}=")
    ]
    name, _, rest = set_cookie.partition("=")
    assert "HttpOnly" in set_cookie and "Path=/" in set_cookie and "SameSite=Lax" in set_cookie
    assert "Domain" not in set_cookie
    return rest.split(";")[0]


def entered(portal_server, session_key, instance_id):
    """The whole handshake; returns the redeem response (it carries the lab cookie)."""
    location, lab_cookies = ticket_for(portal_server, session_key, instance_id)
    return redeem(portal_server, location, lab_cookies)


def test_it_opens_the_lab_path_on_this_host_in_path_mode(client, alice, alice_lab, portal_server):
    response = open_lab(portal_server, session_cookie_for(client, alice), alice_lab.id)

    assert response.status_code == 302
    assert response.headers["location"] == f"/instances/{alice_lab.id}/lab/"


def test_it_sends_an_anonymous_browser_to_log_in_before_opening(alice_lab, portal_server):
    response = open_lab(portal_server, None, alice_lab.id)

    assert response.status_code == 302
    assert response.headers["location"] == f"/accounts/login/?next=/instances/{alice_lab.id}/open"


def test_it_refuses_to_open_someone_else_lab(client, bob, alice_lab, portal_server, subdomain_mode):
    response = open_lab(portal_server, session_cookie_for(client, bob), alice_lab.id)

    assert response.status_code == 404
    assert "ticket" not in response.headers.get("location", "")


def test_it_hands_the_owner_to_the_lab_subdomain_with_a_ticket(
    client, alice, alice_lab, portal_server, subdomain_mode
):
    session_key = session_cookie_for(client, alice)
    first_hop = open_lab(portal_server, session_key, alice_lab.id)
    ticket_url, _ = ticket_for(portal_server, session_key, alice_lab.id)

    # The portal first sends the browser to the lab host for a handshake cookie, with no ticket yet.
    assert first_hop.status_code == 302
    first_hop_to = f"https://{lab_host(alice_lab.id)}/instances/{alice_lab.id}/redeem"
    assert first_hop.headers["location"] == first_hop_to
    location = urlsplit(ticket_url)
    assert f"{location.scheme}://{location.netloc}" == f"https://{alice_lab.id}.lab.example.com"
    assert location.path == f"/instances/{alice_lab.id}/redeem"
    ticket = parse_qs(location.query)["ticket"][0]
    # The ticket is encrypted: neither the session key nor the Jupyter token can be read from the URL.
    assert session_key not in ticket and alice_lab.jupyter_token not in ticket_url
    assert first_hop.headers["referrer-policy"] == "no-referrer"


def test_it_lets_nginx_in_with_the_lab_cookie_a_ticket_gave(
    client, alice, alice_lab, portal_server, subdomain_mode
):
    redeemed = entered(portal_server, session_cookie_for(client, alice), alice_lab.id)

    assert redeemed.status_code == 302
    assert redeemed.headers["location"] == f"/instances/{alice_lab.id}/lab/"
    lab_cookie = lab_cookie_from(redeemed)
    allowed = auth_with_lab_cookie(portal_server, alice_lab.id, lab_cookie)
    assert allowed.status_code == 204
    assert allowed.headers["x-devcloud-token"] == alice_lab.jupyter_token

    client.logout()

    assert auth_with_lab_cookie(portal_server, alice_lab.id, lab_cookie).status_code == 401


def test_it_refuses_a_lab_cookie_made_for_another_instance(
    client, alice, image, alice_lab, portal_server, subdomain_mode
):
    other = Instance.objects.create(
        user=alice,
        size="1x",
        image=image,
        state="running",
        driver_state={"endpoint": "http://127.0.0.1:1"},
        jupyter_token="t",
    )
    lab_cookie = lab_cookie_from(entered(portal_server, session_cookie_for(client, alice), other.id))

    assert auth_with_lab_cookie(portal_server, other.id, lab_cookie).status_code == 204
    assert auth_with_lab_cookie(portal_server, alice_lab.id, lab_cookie).status_code == 401


def test_it_refuses_a_ticket_for_another_instance_or_tampered(
    client, alice, alice_lab, portal_server, subdomain_mode
):
    location, lab_cookies = ticket_for(portal_server, session_cookie_for(client, alice), alice_lab.id)
    ticket = parse_qs(urlsplit(location).query)["ticket"][0]

    elsewhere = redeem(
        portal_server, f"https://x/instances/{uuid.uuid4()}/redeem?ticket={ticket}", lab_cookies
    )
    tampered = redeem(
        portal_server, location[:-3] + ("AAA" if not location.endswith("AAA") else "BBB"), lab_cookies
    )

    for response in (elsewhere, tampered):
        assert response.status_code == 403
        assert "This link has expired" in response.text
        assert f'href="{django_settings.SITE_URL}/instances/"' in response.text
        assert "set-cookie" not in response.headers


def test_it_refuses_an_expired_ticket(client, alice, alice_lab, portal_server, subdomain_mode, monkeypatch):
    location, lab_cookies = ticket_for(portal_server, session_cookie_for(client, alice), alice_lab.id)
    monkeypatch.setattr(tickets, "TICKET_SECONDS", -1)

    response = redeem(portal_server, location, lab_cookies)

    assert response.status_code == 403
    assert "set-cookie" not in response.headers


def test_it_sends_a_stale_ticket_back_to_the_portal(client, alice, alice_lab, portal_server, subdomain_mode):
    # Stopped after the ticket was issued: the portal's /open page says so on the portal's own host.
    location, lab_cookies = ticket_for(portal_server, session_cookie_for(client, alice), alice_lab.id)
    Instance.objects.filter(id=alice_lab.id).update(state=Instance.State.STOPPED)

    response = redeem(portal_server, location, lab_cookies)

    assert response.status_code == 302
    assert response.headers["location"] == f"{django_settings.SITE_URL}/instances/{alice_lab.id}/open"
    assert "set-cookie" not in response.headers


def test_it_serves_no_lab_on_the_portal_host_in_subdomain_mode(
    client, alice, alice_lab, portal_server, subdomain_mode
):
    # The owner's own code must not run in the portal's origin, even when the owner asks for it.
    alice_session = session_cookie_for(client, alice)
    with browser(portal_server, alice_session) as alice_browser:
        page = alice_browser.get(f"/instances/{alice_lab.id}/lab/lab", headers=HTML)
        api = alice_browser.get(f"/instances/{alice_lab.id}/lab/api/status")

    assert page.status_code == 302
    assert page.headers["location"] == f"/instances/{alice_lab.id}/open"
    assert api.status_code == 404
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        ws_connect(portal_server, f"/instances/{alice_lab.id}/lab/api/events/subscribe", alice_session)
    assert refused.value.status_code == 404


def test_it_proxies_the_lab_host_with_the_lab_cookie(client, alice, alice_lab, portal_server, subdomain_mode):
    # Without nginx's auth_request, the lab host can be passed to the gateway whole (docs/gateway.md).
    lab_cookie = lab_cookie_from(entered(portal_server, session_cookie_for(client, alice), alice_lab.id))

    with browser(portal_server) as lab_browser:
        response = lab_browser.get(
            f"/instances/{alice_lab.id}/lab/api/status",
            headers={"Host": lab_host(alice_lab.id), "Cookie": f"{tickets.lab_cookie_name()}={lab_cookie}"},
        )

    assert response.status_code == 200
    assert "started" in response.json()
