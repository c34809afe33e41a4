"""A logged-in developer connects GitHub to their account (the "Connect GitHub" button in Settings).

Same real redirect dance as test_github_login.py, against the local GitHub stand-in.
"""

import pytest
from social_django.models import UserSocialAuth

from portal.accounts.models import User
from tests.support.github_standin import GithubScenario, github_fixture  # noqa: F401 (the `github` fixture)

pytestmark = pytest.mark.django_db

SETTINGS_URL = "/accounts/settings/"


def test_it_connects_github_to_the_logged_in_account(alice_client, github, alice):
    # The GitHub address differs from the account's: connecting links the person logged in, by design.
    github.scenario = GithubScenario.person(
        github_id=8008, login="alice-gh", name="A. Liddell", email="al@example.net"
    )

    response = github.login_with(alice_client, next_url=SETTINGS_URL)

    assert response.status_code == 302
    assert response["Location"] == SETTINGS_URL
    assert UserSocialAuth.objects.get(provider="github", uid="8008").user == alice
    assert User.objects.count() == 1
    assert int(alice_client.session["_auth_user_id"]) == alice.pk
    alice.refresh_from_db()
    assert (alice.email, alice.first_name) == ("alice@example.com", "Alice")


def test_it_refuses_to_connect_a_github_account_that_belongs_to_someone_else(client, github, alice, bob):
    UserSocialAuth.objects.create(user=alice, provider="github", uid="8008", extra_data={"id": 8008})
    github.scenario = GithubScenario.person(github_id=8008, login="alice-gh", email="al@example.net")
    client.force_login(bob)

    response = github.login_with(client, next_url=SETTINGS_URL)

    assert response.status_code == 400
    body = response.content.decode()
    assert "belongs to another DevCloud account" in body
    assert f'href="{SETTINGS_URL}"' in body
    assert int(client.session["_auth_user_id"]) == bob.pk
    assert not UserSocialAuth.objects.filter(user=bob).exists()
    assert UserSocialAuth.objects.get(provider="github", uid="8008").user == alice


def test_it_refuses_to_connect_a_github_account_without_a_verified_primary_email(alice_client, github, alice):
    github.scenario = GithubScenario.person(
        github_id=8009, login="alice-gh", email="al@example.net", verified=False
    )

    response = github.login_with(alice_client, next_url=SETTINGS_URL)

    assert response.status_code == 400
    assert "no verified primary email" in response.content.decode()
    assert not UserSocialAuth.objects.exists()
