import pytest

from portal.accounts import services
from portal.accounts.models import User
from portal.accounts.tokens import email_verification_tokens
from portal.credits.selectors import balance_for
from tests.conftest import PASSWORD, make_user

from .conftest import link_path

CHANGE = "/accounts/settings/email/"


def request_change(client, run_on_commit, new_email="alice@new.example", password=PASSWORD):
    data = {} if new_email is None else {"new_email": new_email, "password": password}
    with run_on_commit():
        return client.post(CHANGE, data, follow=True)


def test_it_sends_a_link_to_the_new_address_and_changes_only_when_followed(
    alice_client, alice, run_on_commit, mailoutbox
):
    response = request_change(alice_client, run_on_commit, "Alice@New.Example")

    page = response.content.decode()
    assert "We sent a link to alice@new.example" in page
    assert "Changing to <strong>alice@new.example</strong>" in page
    alice.refresh_from_db()
    assert alice.email == "alice@example.com" and alice.pending_email == "alice@new.example"
    [message] = mailoutbox
    assert message.to == ["alice@new.example"]
    link = link_path(message)
    assert link.startswith("/accounts/email/confirm/")

    page = alice_client.get(link).content.decode()
    assert "from <strong>alice@example.com</strong> to <strong>alice@new.example</strong>" in page
    response = alice_client.post(link, follow=True)

    assert "Your email address is now alice@new.example." in response.content.decode()
    alice.refresh_from_db()
    assert (alice.email, alice.pending_email) == ("alice@new.example", "")
    assert alice.email_verified
    alice_client.post("/accounts/logout/")
    assert (
        alice_client.post(
            "/accounts/login/", {"username": "alice@new.example", "password": PASSWORD}
        ).status_code
        == 302
    )


def test_a_change_link_works_once(alice_client, alice, run_on_commit, mailoutbox):
    request_change(alice_client, run_on_commit)
    link = link_path(mailoutbox[-1])
    alice_client.post(link)

    response = alice_client.post(link)

    assert response.status_code == 400
    assert "This link does not work" in response.content.decode()


def test_a_newer_request_kills_the_older_link(alice_client, alice, run_on_commit, mailoutbox):
    request_change(alice_client, run_on_commit, "first@new.example")
    first = link_path(mailoutbox[-1])
    request_change(alice_client, run_on_commit, "second@new.example")

    assert alice_client.get(first).status_code == 400
    alice.refresh_from_db()
    assert alice.email == "alice@example.com" and alice.pending_email == "second@new.example"


def test_cancelling_kills_the_link(alice_client, alice, run_on_commit, mailoutbox):
    request_change(alice_client, run_on_commit)
    link = link_path(mailoutbox[-1])

    alice_client.post("/accounts/settings/email/cancel/")

    assert alice_client.get(link).status_code == 400
    alice.refresh_from_db()
    assert (alice.email, alice.pending_email) == ("alice@example.com", "")


def test_it_refuses_the_change_when_the_address_was_taken_meanwhile(
    alice_client, alice, run_on_commit, mailoutbox
):
    request_change(alice_client, run_on_commit)
    link = link_path(mailoutbox[-1])
    make_user("ALICE@new.example")

    response = alice_client.get(link)

    assert response.status_code == 400
    assert "That address is taken" in response.content.decode()
    alice.refresh_from_db()
    assert alice.email == "alice@example.com"


@pytest.mark.parametrize(
    "new_email, password, error",
    [
        (None, None, "This field is required."),
        ("", PASSWORD, "This field is required."),
        ("alice@", PASSWORD, "Enter a valid email address."),
        ("alice@new.example", "", "This field is required."),
        ("alice@new.example", "wrong password", "That is not your current password."),
        ("ALICE@example.com", PASSWORD, "That is already your email address."),
        ("Bob@Example.com", PASSWORD, "Another account uses this email address."),
    ],
    ids=["nothing", "empty", "malformed", "no-password", "wrong-password", "same", "taken"],
)
def test_it_refuses_bad_input_and_changes_nothing(
    alice_client, alice, bob, run_on_commit, mailoutbox, new_email, password, error
):
    response = request_change(alice_client, run_on_commit, new_email, password)

    assert response.status_code == 200
    assert error in response.content.decode()
    alice.refresh_from_db()
    assert (alice.email, alice.pending_email) == ("alice@example.com", "")
    assert mailoutbox == []


def test_an_unverified_user_who_confirms_a_new_address_gets_the_grant(
    client, charlie, run_on_commit, mailoutbox
):
    client.force_login(charlie)
    request_change(client, run_on_commit, "charles@example.net")

    client.post(link_path(mailoutbox[-1]))

    charlie.refresh_from_db()
    assert charlie.email == "charles@example.net" and charlie.email_verified
    assert balance_for(charlie) == 25 * 3600


def test_a_verification_link_cannot_confirm_a_change(client, charlie):
    services.email_change_request(user=charlie, new_email="charles@example.net", password=PASSWORD)
    token = email_verification_tokens.make_token(charlie)
    uid = services._uid(charlie)

    response = client.get(f"/accounts/email/confirm/{uid}/{token}/")

    assert response.status_code == 400
    charlie.refresh_from_db()
    assert charlie.email == "charlie@example.com"


def test_an_account_without_a_password_changes_without_one(client, run_on_commit, mailoutbox):
    github_user = User.objects.create_user("gh@example.com", None)
    client.force_login(github_user)

    page = client.get(CHANGE).content.decode()
    assert "Current password" not in page
    with run_on_commit():
        client.post(CHANGE, {"new_email": "gh@new.example"})

    assert mailoutbox[-1].to == ["gh@new.example"]
