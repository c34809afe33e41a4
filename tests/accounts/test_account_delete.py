import pytest
from axes.models import AccessAttempt, AccessLog
from django.contrib.auth import SESSION_KEY
from django.test import Client
from social_django.models import UserSocialAuth

from portal.accounts.models import SshKey, User
from portal.credits.models import LedgerEntry
from portal.credits.selectors import balance_for
from tests.conftest import PASSWORD

from .conftest import link_path
from .test_sshkeys import ED25519

DELETE = "/accounts/settings/delete/"


def sign_up_and_verify(run_on_commit, mailoutbox, email):
    """A newcomer's whole path: sign up, open the emailed link, type the password and press its button
    (which logs in). Returns (user, browser, the page after confirming)."""
    browser = Client()
    with run_on_commit():
        browser.post(
            "/accounts/signup/", {"email": email, "password": PASSWORD, "password_confirm": PASSWORD}
        )
    page = browser.post(link_path(mailoutbox[-1]), {"password": PASSWORD}, follow=True).content.decode()
    return User.objects.get(email=email.strip().lower()), browser, page


def test_it_scrubs_the_account_ends_every_session_and_keeps_the_ledger(run_on_commit, mailoutbox):
    alice, browser, _ = sign_up_and_verify(run_on_commit, mailoutbox, "alice@example.com")
    User.objects.filter(pk=alice.pk).update(first_name="Alice", last_name="Liddell")
    browser.post("/accounts/settings/ssh-keys/", {"name": "laptop", "public_key": ED25519})
    UserSocialAuth.objects.create(user=alice, provider="github", uid="4242", extra_data={"login": "alice-gh"})
    phone = Client()
    phone.force_login(alice)
    Client().post("/accounts/login/", {"username": "alice@example.com", "password": "typo"})
    assert AccessAttempt.objects.filter(username="alice@example.com").exists()
    assert AccessLog.objects.filter(username="alice@example.com").exists()

    response = browser.post(DELETE, {"confirm_email": "Alice@Example.com", "password": PASSWORD}, follow=True)

    assert response.redirect_chain == [("/accounts/login/", 302)]
    assert "Your account was deleted." in response.content.decode()
    alice.refresh_from_db()
    assert alice.email == f"deleted-{alice.pk}@deleted.invalid"
    assert (alice.first_name, alice.last_name, alice.pending_email) == ("", "", "")
    assert not alice.has_usable_password() and not alice.is_active and alice.deleted_at is not None
    assert not SshKey.objects.filter(user=alice).exists()
    assert not UserSocialAuth.objects.filter(user=alice).exists()
    assert SESSION_KEY not in browser.session
    assert phone.get("/accounts/settings/")["Location"].startswith("/accounts/login/")
    assert not AccessAttempt.objects.filter(username="alice@example.com").exists()
    assert not AccessLog.objects.filter(username="alice@example.com").exists()
    # The ledger is append-only: the grant stays, attached to the scrubbed account.
    assert LedgerEntry.objects.filter(account__user=alice).count() == 1


@pytest.mark.parametrize("again", ["alice@example.com", "ALICE@example.com", "alice+gpu@Example.com"])
def test_signing_up_again_with_the_same_address_gives_no_second_grant(run_on_commit, mailoutbox, again):
    first, browser, page = sign_up_and_verify(run_on_commit, mailoutbox, "alice@example.com")
    assert "25.00 GPU-hours were added" in page and balance_for(first) == 25 * 3600
    browser.post(DELETE, {"confirm_email": "alice@example.com", "password": PASSWORD})

    second, _, page = sign_up_and_verify(run_on_commit, mailoutbox, again)

    assert second.pk != first.pk and second.email_verified
    assert balance_for(second) == 0
    assert "GPU-hours were added" not in page
    assert not LedgerEntry.objects.filter(account__user=second).exists()


def test_a_never_verified_address_can_still_get_the_grant_after_deletion(run_on_commit, mailoutbox):
    browser = Client()
    with run_on_commit():
        browser.post(
            "/accounts/signup/",
            {"email": "dana@example.com", "password": PASSWORD, "password_confirm": PASSWORD},
        )
    browser.force_login(User.objects.get(email="dana@example.com"))
    browser.post(DELETE, {"confirm_email": "dana@example.com", "password": PASSWORD})

    dana, _, _ = sign_up_and_verify(run_on_commit, mailoutbox, "dana@example.com")

    assert balance_for(dana) == 25 * 3600


@pytest.mark.parametrize(
    "data, error",
    [
        ({}, "This field is required."),
        (
            {"confirm_email": "bob@example.com", "password": PASSWORD},
            "Type alice@example.com exactly to confirm.",
        ),
        ({"confirm_email": "alice@example.com", "password": "wrong"}, "That is not your current password."),
        ({"confirm_email": "alice@example.com"}, "This field is required."),
    ],
    ids=["empty", "other-email", "wrong-password", "no-password"],
)
def test_it_refuses_without_the_right_confirmation(alice_client, alice, data, error):
    response = alice_client.post(DELETE, data)

    assert response.status_code == 200
    assert error in response.content.decode()
    alice.refresh_from_db()
    assert alice.is_active and alice.email == "alice@example.com"
    assert SESSION_KEY in alice_client.session


def test_an_account_without_a_password_confirms_with_the_email_alone(client):
    github_user = User.objects.create_user("gh@example.com", None)
    client.force_login(github_user)

    assert "Current password" not in client.get(DELETE).content.decode()
    client.post(DELETE, {"confirm_email": "gh@example.com"})

    github_user.refresh_from_db()
    assert not github_user.is_active
