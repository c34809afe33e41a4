from portal.accounts import services
from tests.conftest import PASSWORD

from .conftest import link_path

RESEND = "/accounts/verify/resend/"


def test_it_sends_a_new_link_to_an_unverified_user(client, charlie, run_on_commit, mailoutbox):
    client.force_login(charlie)

    with run_on_commit():
        response = client.post(RESEND, HTTP_REFERER="http://testserver/instances/")

    assert response.status_code == 302 and response["Location"] == "http://testserver/instances/"
    [message] = mailoutbox
    assert message.to == ["charlie@example.com"]
    client.post(link_path(message))
    charlie.refresh_from_db()
    assert charlie.email_verified


def test_it_also_resends_the_link_for_a_pending_address(client, charlie, run_on_commit, mailoutbox):
    services.email_change_request(user=charlie, new_email="charles@example.net", password=PASSWORD)
    client.force_login(charlie)

    with run_on_commit():
        response = client.post(RESEND, {"next": "/accounts/settings/"}, follow=True)

    assert sorted(m.to[0] for m in mailoutbox) == ["charles@example.net", "charlie@example.com"]
    assert "We sent a new link to charlie@example.com and charles@example.net" in response.content.decode()


def test_it_sends_nothing_when_the_address_is_confirmed(alice_client, run_on_commit, mailoutbox):
    with run_on_commit():
        response = alice_client.post(RESEND, follow=True)

    assert mailoutbox == []
    assert "Your email address is already confirmed." in response.content.decode()


def test_it_ignores_a_next_page_on_another_site(client, charlie, run_on_commit):
    client.force_login(charlie)

    with run_on_commit():
        response = client.post(RESEND, {"next": "https://evil.example/"})

    assert response["Location"] == "/"


def test_it_answers_only_post(client, charlie, mailoutbox):
    client.force_login(charlie)

    assert client.get(RESEND).status_code == 405
    assert mailoutbox == []
