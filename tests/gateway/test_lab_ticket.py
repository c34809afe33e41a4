"""A lab ticket opens a lab only in the browser that asked for it, and only once.

The attack: Bob obtains a ticket for his own lab and gets Alice's browser to follow the redeem link (a
link in a chat, an <img>, a redirect from his site). Without a binding, Alice's browser would be signed
in to Bob's lab on the trusted lab domain, where whatever she types or uploads is Bob's.
"""

import pytest
from django.conf import settings as django_settings

from .helpers import (
    enter_lab,
    lab_host,
    lab_url,
    make_instance,
    open_until_ticket,
    redeem_ticket,
    session_cookie_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def subdomain_mode(settings):
    settings.GATEWAY_LAB_URL = "https://{instance_id}.lab.example.com"


@pytest.fixture
def bob_lab(bob, image, jupyterlab):
    endpoint, token = jupyterlab
    return make_instance(bob, image, endpoint=endpoint, token=token)


def no_lab_cookie_set(response) -> bool:
    """No cookie was set by the response, other than ones it deletes."""
    return all("Max-Age=0" in header for header in response.headers.get_list("set-cookie"))


def test_it_refuses_a_ticket_redeemed_in_another_browser(
    client, alice, bob, bob_lab, portal_server, subdomain_mode
):
    bob_session = session_cookie_for(client, bob)
    ticket_url, _ = open_until_ticket(portal_server, bob_session, bob_lab.id)
    # Alice's browser holds nothing on Bob's lab host; Bob sends it straight to his redeem link.
    alice_lab_cookies: dict[str, str] = {}

    response = redeem_ticket(portal_server, ticket_url, alice_lab_cookies)

    assert response.status_code == 403
    assert "This link has expired" in response.text
    assert no_lab_cookie_set(response) and alice_lab_cookies == {}


def test_it_refuses_a_ticket_bound_to_another_browser_handshake(
    client, bob, bob_lab, portal_server, subdomain_mode
):
    # Alice's browser went through the first hop on Bob's lab host too (Bob linked her to /open on his
    # lab), so it holds a handshake cookie of its own there; Bob's ticket is bound to his, not hers.
    bob_session = session_cookie_for(client, bob)
    ticket_url, _ = open_until_ticket(portal_server, bob_session, bob_lab.id)
    alice_lab_cookies: dict[str, str] = {}
    first_hop_url = f"https://{lab_host(bob_lab.id)}/instances/{bob_lab.id}/redeem"
    first_hop = redeem_ticket(portal_server, first_hop_url, alice_lab_cookies)
    assert first_hop.status_code == 302

    response = redeem_ticket(portal_server, ticket_url, alice_lab_cookies)

    assert response.status_code == 403
    assert "This link has expired" in response.text
    assert no_lab_cookie_set(response)


def test_it_refuses_the_same_ticket_twice(client, bob, bob_lab, portal_server, subdomain_mode):
    bob_session = session_cookie_for(client, bob)
    ticket_url, lab_cookies = open_until_ticket(portal_server, bob_session, bob_lab.id)
    # What the browser held before the first redemption, replayed with the same link.
    before = dict(lab_cookies)

    first = redeem_ticket(portal_server, ticket_url, lab_cookies)
    again = redeem_ticket(portal_server, ticket_url, before)

    assert first.status_code == 302
    assert first.headers["location"] == lab_url(bob_lab.id)
    assert again.status_code == 403
    assert "This link has expired" in again.text
    assert no_lab_cookie_set(again)


def test_the_owner_gets_in_through_the_whole_handshake(client, bob, bob_lab, portal_server, subdomain_mode):
    lab_cookies = enter_lab(portal_server, session_cookie_for(client, bob), bob_lab.id)

    assert lab_cookies
    assert django_settings.SESSION_COOKIE_NAME not in lab_cookies
