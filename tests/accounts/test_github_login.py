"""Sign up and log in with GitHub, against a local stand-in for GitHub on 127.0.0.1.

Every test drives the real redirect dance: the portal's begin view, the stand-in's authorize endpoint
over real HTTP, then the callback through the Django test client, during which the portal's backend
calls the stand-in's token, /user and /user/emails endpoints over real HTTP.
"""

import pytest
from django.utils import timezone
from social_django.models import UserSocialAuth

from portal.accounts.models import User
from portal.credits.models import CreditAccount, LedgerEntry
from tests.conftest import PASSWORD
from tests.support.github_standin import GithubScenario, github_fixture  # noqa: F401 (the `github` fixture)

pytestmark = pytest.mark.django_db

SIGNUP_GRANT_GPU_SECONDS = 25 * 3600


def logged_in_user_id(client):
    raw = client.session.get("_auth_user_id")
    return int(raw) if raw is not None else None


def balance(user) -> int:
    account = CreditAccount.objects.filter(user=user).first()
    return account.balance_gpu_seconds if account else 0


def grants_for(user):
    return LedgerEntry.objects.filter(account__user=user, kind=LedgerEntry.Kind.GRANT)


def assert_friendly_page(response, status, *phrases):
    assert response.status_code == status
    assert "accounts/github_error.html" in [t.name for t in response.templates]
    body = response.content.decode()
    for phrase in phrases:
        assert phrase in body
    assert 'href="/accounts/login/"' in body
    assert "Traceback" not in body


def test_it_signs_up_a_new_developer_with_github_and_grants_25_gpu_hours(client, github):
    github.scenario = GithubScenario.person(
        github_id=1001, login="ada", name="Ada Lovelace", email="Ada@Example.org"
    )

    response = github.login_with(client)

    assert response.status_code == 302
    assert response["Location"] == "/"
    user = User.objects.get(email="ada@example.org")
    assert logged_in_user_id(client) == user.pk
    assert user.email_verified_at is not None
    assert not user.has_usable_password()
    assert (user.first_name, user.last_name) == ("Ada", "Lovelace")
    social = UserSocialAuth.objects.get(user=user)
    assert (social.provider, social.uid) == ("github", "1001")
    assert social.extra_data.get("login") == "ada"
    # The portal never calls GitHub after login, so it keeps no token.
    assert "access_token" not in social.extra_data
    assert balance(user) == SIGNUP_GRANT_GPU_SECONDS
    assert [entry.gpu_seconds for entry in grants_for(user)] == [SIGNUP_GRANT_GPU_SECONDS]
    assert CreditAccount.objects.get(user=user).balance_hours == "25.00"
    assert github.paths_seen() == [
        "/login/oauth/authorize",
        "/login/oauth/access_token",
        "/user",
        "/user/emails",
    ]


def test_it_logs_the_same_github_id_into_the_same_account_without_a_second_grant(client, github):
    github.scenario = GithubScenario.person(
        github_id=1001, login="ada", name="Ada Lovelace", email="ada@example.org"
    )
    github.login_with(client)
    first = User.objects.get(email="ada@example.org")
    client.logout()
    # GitHub profiles change; the GitHub id is what identifies the person.
    github.scenario = GithubScenario.person(
        github_id=1001, login="ada-l", name="Ada King", email="ada@example.org", public_email=None
    )

    response = github.login_with(client)

    assert response.status_code == 302
    assert logged_in_user_id(client) == first.pk
    assert User.objects.count() == 1
    assert UserSocialAuth.objects.filter(provider="github", uid="1001").count() == 1
    assert grants_for(first).count() == 1
    assert balance(first) == SIGNUP_GRANT_GPU_SECONDS


def test_it_shows_a_friendly_page_when_the_person_denies_access_on_github(client, github):
    github.scenario.deny = True

    response = github.login_with(client)

    assert_friendly_page(response, 400, "GitHub sign-in was cancelled", "Try GitHub again")
    assert logged_in_user_id(client) is None
    assert not User.objects.exists()
    assert not UserSocialAuth.objects.exists()
    assert "/login/oauth/access_token" not in github.paths_seen()


def test_it_refuses_a_callback_whose_state_does_not_match_the_browser(client, github):
    response = github.login_with(client, tamper_state=True)

    assert_friendly_page(response, 400, "could not be matched to your browser")
    assert logged_in_user_id(client) is None
    assert not User.objects.exists()
    assert not UserSocialAuth.objects.exists()
    # The forged callback never got as far as spending the code.
    assert "/login/oauth/access_token" not in github.paths_seen()


def test_it_refuses_a_callback_without_state(client, github):
    response = github.login_with(client, drop_state=True)

    assert_friendly_page(response, 400, "could not be matched to your browser")
    assert not User.objects.exists()


def test_it_refuses_a_replayed_callback(client, github):
    callback = github.authorize(client)
    assert client.get(callback).status_code == 302
    client.logout()

    response = client.get(callback)

    assert_friendly_page(response, 400, "could not be matched to your browser")
    assert logged_in_user_id(client) is None
    assert User.objects.count() == 1


def test_it_refuses_an_unverified_primary_email_even_when_the_profile_shows_it(client, github):
    github.scenario = GithubScenario.person(
        github_id=2002,
        login="mallory",
        email="alice@example.com",
        verified=False,
        extra_emails=[
            {"email": "mallory@example.net", "primary": False, "verified": True, "visibility": None}
        ],
    )

    response = github.login_with(client)

    assert_friendly_page(response, 400, "no verified primary email", "Settings → Emails")
    assert logged_in_user_id(client) is None
    assert not User.objects.exists()
    assert not UserSocialAuth.objects.exists()


def test_it_signs_up_with_the_verified_primary_address_when_the_profile_hides_it(client, github):
    github.scenario = GithubScenario.person(
        github_id=3003, login="grace", email="grace@example.org", public_email=None
    )
    assert github.scenario.user["email"] is None

    response = github.login_with(client)

    assert response.status_code == 302
    user = User.objects.get(email="grace@example.org")
    assert logged_in_user_id(client) == user.pk
    assert user.email_verified
    assert balance(user) == SIGNUP_GRANT_GPU_SECONDS


def test_it_never_uses_the_public_profile_address(client, github, alice):
    # A profile can show any address; only the verified primary one from /user/emails counts.
    github.scenario = GithubScenario.person(
        github_id=3004, login="eve", email="eve@example.org", public_email="alice@example.com"
    )

    response = github.login_with(client)

    assert response.status_code == 302
    eve = User.objects.get(email="eve@example.org")
    assert logged_in_user_id(client) == eve.pk
    assert not UserSocialAuth.objects.filter(user=alice).exists()


@pytest.mark.parametrize(
    "emails",
    [
        [],
        [{"email": "hopper@example.org", "primary": True, "verified": False, "visibility": None}],
        [{"email": "hopper@example.org", "primary": False, "verified": True, "visibility": None}],
    ],
    ids=["none", "primary-unverified", "only-secondary-verified"],
)
def test_it_refuses_when_github_lists_no_verified_primary_address(client, github, emails):
    github.scenario = GithubScenario(
        user={"id": 4004, "login": "hopper", "name": None, "email": None}, emails=emails
    )

    response = github.login_with(client)

    assert_friendly_page(response, 400, "no verified primary email")
    assert not User.objects.exists()
    assert not UserSocialAuth.objects.exists()


def test_it_shows_a_github_is_down_page_when_user_emails_fails(client, github):
    github.scenario.emails_status = 500

    response = github.login_with(client)

    assert_friendly_page(response, 502, "GitHub is not answering right now", "Try GitHub again")
    assert logged_in_user_id(client) is None
    assert not User.objects.exists()
    assert not UserSocialAuth.objects.exists()


@pytest.mark.parametrize(
    ("token_error", "token_status", "status", "phrase"),
    [
        ("bad_verification_code", 200, 400, "GitHub did not accept the sign-in"),
        (None, 500, 502, "GitHub is not answering right now"),
        ("incorrect_client_credentials", 200, 502, "GitHub is not answering right now"),
    ],
    ids=["code-rejected", "server-error", "wrong-client-secret"],
)
def test_it_shows_a_friendly_page_when_the_token_exchange_fails(
    client, github, token_error, token_status, status, phrase
):
    github.scenario.token_error = token_error
    github.scenario.token_status = token_status

    response = github.login_with(client)

    assert_friendly_page(response, status, phrase)
    assert not User.objects.exists()
    assert "/user" not in github.paths_seen()


def test_it_shows_a_github_is_down_page_when_github_cannot_be_reached(client, github):
    callback = github.authorize(client)
    github.stop()

    response = client.get(callback)

    assert_friendly_page(response, 502, "GitHub is not answering right now")
    assert not User.objects.exists()


def test_it_links_github_to_an_existing_account_whose_email_is_verified_on_both_sides(client, github, bob):
    github.scenario = GithubScenario.person(
        github_id=5005, login="bobby", name="Robert", email="Bob@Example.com"
    )

    response = github.login_with(client)

    assert response.status_code == 302
    assert logged_in_user_id(client) == bob.pk
    assert User.objects.count() == 1
    assert UserSocialAuth.objects.get(provider="github", uid="5005").user == bob
    bob.refresh_from_db()
    # Linking changes nothing else about the account: the password still works, the name stays.
    assert bob.check_password(PASSWORD)
    assert bob.first_name == "Bob"


def test_it_does_not_link_github_to_an_account_whose_email_is_unverified_here(client, github, charlie):
    github.scenario = GithubScenario.person(github_id=6006, login="charlie", email="charlie@example.com")

    response = github.login_with(client)

    assert_friendly_page(
        response,
        400,
        "An account with this email already exists",
        "charlie@example.com",
        "connect GitHub from Settings",
    )
    assert "Try GitHub again" not in response.content.decode()
    assert logged_in_user_id(client) is None
    assert User.objects.count() == 1
    assert not UserSocialAuth.objects.exists()
    charlie.refresh_from_db()
    assert charlie.email_verified_at is None
    assert balance(charlie) == 0


def test_it_does_not_link_github_to_a_disabled_account(client, github, bob):
    User.objects.filter(pk=bob.pk).update(is_active=False)
    github.scenario = GithubScenario.person(github_id=5006, login="bobby", email="bob@example.com")

    response = github.login_with(client)

    assert_friendly_page(response, 400, "is disabled")
    assert logged_in_user_id(client) is None
    assert User.objects.count() == 1
    assert not UserSocialAuth.objects.exists()


def test_it_never_grants_twice_to_a_github_id_after_the_account_was_deleted(client, github):
    github.scenario = GithubScenario.person(github_id=7007, login="lin", name="Lin", email="lin@example.org")
    github.login_with(client)
    old = User.objects.get(email="lin@example.org")
    assert balance(old) == SIGNUP_GRANT_GPU_SECONDS
    client.logout()
    # Deletion anonymises the account and drops its GitHub link; the ledger and granted identities stay.
    User.objects.filter(pk=old.pk).update(
        email=f"deleted-{old.pk}@deleted.invalid", is_active=False, deleted_at=timezone.now()
    )
    UserSocialAuth.objects.filter(user=old).delete()
    # A new address too, so only the GitHub id can tell it is the same person.
    github.scenario = GithubScenario.person(
        github_id=7007, login="lin", name="Lin", email="lin.again@example.org"
    )

    response = github.login_with(client)

    assert response.status_code == 302
    new = User.objects.get(email="lin.again@example.org")
    assert new.pk != old.pk
    assert logged_in_user_id(client) == new.pk
    assert UserSocialAuth.objects.get(provider="github", uid="7007").user == new
    assert balance(new) == 0
    assert not grants_for(new).exists()
