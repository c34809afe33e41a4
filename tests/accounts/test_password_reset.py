import pytest
from django.test import override_settings
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from portal.accounts import services
from portal.accounts.models import User
from portal.accounts.tokens import password_reset_tokens
from tests.conftest import PASSWORD

from .conftest import link_path

RESET = "/accounts/password/reset/"
NEW = "a completely new passphrase"


def request_reset(client, run_on_commit, email):
    with run_on_commit():
        return client.post(RESET, {"email": email})


def reset_link(client, run_on_commit, mailoutbox, email="alice@example.com"):
    request_reset(client, run_on_commit, email)
    return link_path(mailoutbox[-1])


def set_password(client, link, password=NEW, confirm=None):
    """Follow the link like a browser: Django moves the token into the session, then the form posts."""
    form_url = client.get(link)["Location"]
    return client.post(form_url, {"new_password1": password, "new_password2": confirm or password})


def test_it_resets_the_password_with_the_emailed_link(client, alice, run_on_commit, mailoutbox):
    response = request_reset(client, run_on_commit, "Alice@Example.com")
    assert response.status_code == 302 and response["Location"] == "/accounts/password/reset/sent/"
    [message] = mailoutbox
    assert message.to == ["alice@example.com"] and "Reset your DevCloud password" in message.subject

    response = set_password(client, link_path(message))

    assert response.status_code == 302 and response["Location"] == "/accounts/password/reset/done/"
    alice.refresh_from_db()
    assert alice.check_password(NEW) and not alice.check_password(PASSWORD)


def test_it_answers_the_same_for_an_unknown_address_and_sends_nothing(
    client, alice, run_on_commit, mailoutbox
):
    known = request_reset(client, run_on_commit, "alice@example.com")
    unknown = request_reset(client, run_on_commit, "nobody@example.com")

    assert known["Location"] == unknown["Location"] == "/accounts/password/reset/sent/"
    assert [m.to for m in mailoutbox] == [["alice@example.com"]]


def test_it_sends_nothing_to_an_account_without_a_password_or_a_deleted_one(
    client, alice, run_on_commit, mailoutbox
):
    User.objects.create_user("gh@example.com", None, email_verified_at=alice.email_verified_at)
    services.account_delete(user=alice)

    request_reset(client, run_on_commit, "gh@example.com")
    request_reset(client, run_on_commit, "alice@example.com")

    assert mailoutbox == []


@pytest.mark.parametrize(
    "email, error", [("", "This field is required."), ("alice@", "Enter a valid email address.")]
)
def test_it_refuses_a_malformed_request(client, alice, run_on_commit, mailoutbox, email, error):
    response = request_reset(client, run_on_commit, email)

    assert response.status_code == 200
    assert error in response.content.decode()
    assert mailoutbox == []


@pytest.mark.parametrize(
    "password, confirm, error",
    [("short", None, "too short"), ("password123", None, "too common"), (NEW, NEW + "!", "didn’t match")],
)
def test_it_refuses_a_weak_or_mismatched_new_password(
    client, alice, run_on_commit, mailoutbox, password, confirm, error
):
    link = reset_link(client, run_on_commit, mailoutbox)

    response = set_password(client, link, password, confirm)

    assert response.status_code == 200
    assert error in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_a_reset_link_works_once(client, alice, run_on_commit, mailoutbox):
    link = reset_link(client, run_on_commit, mailoutbox)
    set_password(client, link)

    response = client.get(link, follow=True)

    assert "This reset link does not work" in response.content.decode()


def test_a_reset_link_dies_when_the_password_changes(client, alice, run_on_commit, mailoutbox):
    link = reset_link(client, run_on_commit, mailoutbox)
    alice.set_password("changed in the meantime")
    alice.save()

    response = client.get(link, follow=True)

    assert "This reset link does not work" in response.content.decode()


def test_a_reset_link_dies_when_the_email_changes(client, alice, run_on_commit, mailoutbox):
    link = reset_link(client, run_on_commit, mailoutbox)
    with run_on_commit():
        services.email_change_request(user=alice, new_email="alice@new.example", password=PASSWORD)
    client.force_login(alice)
    client.post(link_path(mailoutbox[-1]))
    client.post("/accounts/logout/")
    alice.refresh_from_db()
    assert alice.email == "alice@new.example"

    response = client.get(link, follow=True)

    assert "This reset link does not work" in response.content.decode()


@override_settings(PASSWORD_RESET_TIMEOUT=3600)
def test_a_reset_link_expires(client, alice):
    old = password_reset_tokens._num_seconds(password_reset_tokens._now()) - 7200
    token = password_reset_tokens._make_token_with_timestamp(alice, old, password_reset_tokens.secret)
    uid = urlsafe_base64_encode(force_bytes(alice.pk))

    response = client.get(f"/accounts/password/reset/{uid}/{token}/", follow=True)

    assert "This reset link does not work" in response.content.decode()


def test_a_reset_lifts_the_login_lockout(client, alice, run_on_commit, mailoutbox):
    for _ in range(5):
        client.post("/accounts/login/", {"username": "alice@example.com", "password": "wrong"})
    assert (
        client.post("/accounts/login/", {"username": "alice@example.com", "password": PASSWORD}).status_code
        == 429
    )

    set_password(client, reset_link(client, run_on_commit, mailoutbox))

    response = client.post("/accounts/login/", {"username": "alice@example.com", "password": NEW})
    assert response.status_code == 302
