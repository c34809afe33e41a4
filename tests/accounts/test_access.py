"""Who may do what: anonymous visitors are sent to log in, nobody reaches another user's data, and
every state-changing form needs a CSRF token."""

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import Client
from social_django.models import UserSocialAuth

from portal.accounts import services
from portal.accounts.models import SshKey, User
from tests.conftest import PASSWORD

from .test_sshkeys import ED25519, ED25519_FINGERPRINT

LOGIN_REQUIRED = [
    ("get", "/accounts/settings/"),
    ("get", "/accounts/settings/email/"),
    ("post", "/accounts/settings/email/"),
    ("post", "/accounts/settings/email/cancel/"),
    ("get", "/accounts/settings/password/"),
    ("post", "/accounts/settings/password/"),
    ("post", "/accounts/settings/ssh-keys/"),
    ("post", "/accounts/settings/ssh-keys/{key}/delete/"),
    ("get", "/accounts/settings/delete/"),
    ("post", "/accounts/settings/delete/"),
    ("post", "/accounts/verify/resend/"),
]


@pytest.fixture
def alice_key(alice):
    return services.sshkey_add(user=alice, name="alice-workstation", public_key=ED25519)


@pytest.mark.parametrize("method, url", LOGIN_REQUIRED)
def test_anonymous_visitors_are_sent_to_log_in(client, alice_key, method, url):
    url = url.format(key=alice_key.pk)

    response = getattr(client, method)(url)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={url}"
    assert SshKey.objects.filter(pk=alice_key.pk).exists()


def test_settings_show_only_the_own_account(alice, alice_key, bob_client):
    UserSocialAuth.objects.create(user=alice, provider="github", uid="4242", extra_data={"login": "alice-gh"})

    page = bob_client.get("/accounts/settings/").content.decode()

    assert "bob@example.com" in page
    for secret in ["alice@example.com", "alice-gh", ED25519_FINGERPRINT, "alice-workstation"]:
        assert secret not in page
    assert 'action="/auth/login/github/"' in page


def test_settings_show_the_own_github_login_and_keys(alice_client, alice, alice_key):
    UserSocialAuth.objects.create(user=alice, provider="github", uid="4242", extra_data={"login": "alice-gh"})

    page = alice_client.get("/accounts/settings/").content.decode()

    assert "Connected as <strong>alice-gh</strong>" in page
    assert ED25519_FINGERPRINT in page
    assert f'action="/accounts/settings/ssh-keys/{alice_key.pk}/delete/"' in page


def test_bob_cannot_delete_alices_key(alice_key, bob_client):
    response = bob_client.post(f"/accounts/settings/ssh-keys/{alice_key.pk}/delete/")

    assert response.status_code == 404
    assert SshKey.objects.filter(pk=alice_key.pk).exists()


def test_bobs_own_forms_only_touch_bobs_account(alice, bob, bob_client, run_on_commit):
    with run_on_commit():
        bob_client.post(
            "/accounts/settings/email/", {"new_email": "robert@example.com", "password": PASSWORD}
        )
    bob_client.post("/accounts/settings/delete/", {"confirm_email": "bob@example.com", "password": PASSWORD})

    alice.refresh_from_db()
    assert alice.is_active and alice.email == "alice@example.com" and alice.pending_email == ""
    assert not User.objects.get(pk=bob.pk).is_active


def test_following_someone_elses_link_changes_nothing_for_either_account(
    bob, bob_client, charlie, mailoutbox
):
    # Only the account's own browser confirms: someone logged in as another account is asked to log out.
    services.email_send(kind=services.EmailKind.VERIFY, user_id=charlie.pk)
    from .conftest import link_path

    link = link_path(mailoutbox[-1])
    assert "This link is for another account" in bob_client.get(link).content.decode()
    response = bob_client.post(link)

    assert response.status_code == 403
    assert bob_client.session[SESSION_KEY] == str(bob.pk)
    charlie.refresh_from_db()
    assert not charlie.email_verified


# --- CSRF ---------------------------------------------------------------------------------------


def csrf_client(user=None):
    browser = Client(enforce_csrf_checks=True)
    if user is not None:
        browser.force_login(user)
    return browser


CSRF_PROTECTED = [
    (
        "/accounts/signup/",
        {"email": "dana@example.com", "password": PASSWORD, "password_confirm": PASSWORD},
        None,
    ),
    ("/accounts/login/", {"username": "alice@example.com", "password": PASSWORD}, None),
    ("/accounts/password/reset/", {"email": "alice@example.com"}, None),
    ("/accounts/logout/", {}, "alice"),
    ("/accounts/verify/resend/", {}, "charlie"),
    ("/accounts/settings/email/", {"new_email": "alice@new.example", "password": PASSWORD}, "alice"),
    (
        "/accounts/settings/password/",
        {
            "old_password": PASSWORD,
            "new_password1": "another long passphrase",
            "new_password2": "another long passphrase",
        },
        "alice",
    ),
    ("/accounts/settings/ssh-keys/", {"name": "laptop", "public_key": ED25519}, "alice"),
    ("/accounts/settings/delete/", {"confirm_email": "alice@example.com", "password": PASSWORD}, "alice"),
]


@pytest.mark.parametrize("url, data, who", CSRF_PROTECTED, ids=[url for url, _, _ in CSRF_PROTECTED])
def test_a_post_without_a_csrf_token_is_refused(
    request, alice, charlie, mailoutbox, url, data, who, run_on_commit
):
    user = request.getfixturevalue(who) if who else None
    browser = csrf_client(user)

    with run_on_commit():
        response = browser.post(url, data)

    assert response.status_code == 403
    assert mailoutbox == []
    assert not User.objects.filter(email__in=["dana@example.com", "alice@new.example"]).exists()
    alice.refresh_from_db()
    assert alice.is_active and alice.check_password(PASSWORD) and alice.pending_email == ""
    assert not SshKey.objects.exists()
    if user is not None:
        assert browser.session[SESSION_KEY] == str(user.pk)
    else:
        assert SESSION_KEY not in browser.session


def test_a_post_with_the_csrf_token_from_the_form_is_accepted(run_on_commit):
    browser = csrf_client()
    browser.get("/accounts/signup/")
    token = browser.cookies["csrftoken"].value

    with run_on_commit():
        response = browser.post(
            "/accounts/signup/",
            {
                "email": "dana@example.com",
                "password": PASSWORD,
                "password_confirm": PASSWORD,
                "csrfmiddlewaretoken": token,
            },
        )

    assert response.status_code == 200
    assert User.objects.filter(email="dana@example.com").exists()


def test_deleting_a_key_without_a_csrf_token_is_refused(alice, alice_key):
    response = csrf_client(alice).post(f"/accounts/settings/ssh-keys/{alice_key.pk}/delete/")

    assert response.status_code == 403
    assert SshKey.objects.filter(pk=alice_key.pk).exists()
