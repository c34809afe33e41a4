"""Personal access tokens: made in Settings, shown once, stored hashed, named, scoped, expiring, revocable."""

import hashlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from portal.api.models import ApiToken
from tests.conftest import PASSWORD

from .conftest import TokenClient, assert_problem, token_for

pytestmark = pytest.mark.django_db
SETTINGS = "/accounts/settings/"
CREATE = "/accounts/settings/api-tokens/"


def test_it_creates_a_token_in_settings_and_shows_it_once(alice_client):
    page = alice_client.post(CREATE, {"name": "CI on GitHub", "scope": "launch", "days": "30"})
    assert page.status_code == 200
    text = page.context["new_token"]
    assert text.startswith("dcp_") and text in page.content.decode()
    assert "no-store" in page["Cache-Control"]
    # The next visit to the page lists the token by name and prefix, never the whole of it.
    again = alice_client.get(SETTINGS).content.decode()
    assert "CI on GitHub" in again and "Read and launch" in again and "never used" in again
    assert text not in again
    assert TokenClient(text).get("/api/v1/me").status_code == 200


def test_it_stores_no_token_in_plain_text(alice_client):
    text = alice_client.post(CREATE, {"name": "laptop", "scope": "read", "days": "7"}).context["new_token"]
    _, prefix, secret = text.split("_", 2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM api_apitoken")
        row = " ".join(str(value) for value in cursor.fetchone())
    assert secret not in row and text not in row
    assert prefix in row and hashlib.sha256(secret.encode()).hexdigest() in row


def test_it_refuses_a_token_without_a_name_with_the_forms_message(alice_client):
    page = alice_client.post(CREATE, {"name": " ", "scope": "read", "days": "30"})
    assert page.status_code == 400
    assert "Give the token a name" in page.content.decode()
    assert not ApiToken.objects.exists()


def test_an_unconfirmed_account_cannot_create_tokens(client, charlie):
    client.force_login(charlie)
    assert "Confirm your email address before creating API tokens" in client.get(SETTINGS).content.decode()
    page = client.post(CREATE, {"name": "squatter", "scope": "launch", "days": "365"})
    assert page.status_code == 400
    assert not ApiToken.objects.exists()


def test_a_revoked_token_gets_401(alice_client, alice):
    token, api = token_for(alice)
    assert api.get("/api/v1/me").status_code == 200
    assert alice_client.post(f"/accounts/settings/api-tokens/{token.pk}/revoke/").status_code == 302
    body = assert_problem(api.get("/api/v1/me"), 401, kind="unauthenticated")
    assert "invalid, expired or revoked" in body["detail"]


def test_an_expired_token_gets_401(alice):
    token, api = token_for(alice)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    answer = api.get("/api/v1/me")
    assert_problem(answer, 401)
    assert answer["WWW-Authenticate"].startswith("Bearer")


def test_a_token_with_a_wrong_secret_gets_401(alice):
    _, api = token_for(alice)
    forged = api.token_text[:-4] + ("aaaa" if not api.token_text.endswith("aaaa") else "bbbb")
    assert_problem(TokenClient(forged).get("/api/v1/me"), 401)
    assert_problem(TokenClient("not-a-token").get("/api/v1/me"), 401)


def test_no_credentials_get_401(client, db):
    assert_problem(client.get("/api/v1/me"), 401, kind="unauthenticated")


def test_a_deleted_accounts_token_gets_401(alice_client, alice):
    _, api = token_for(alice)
    alice_client.post("/accounts/settings/delete/", {"confirm_email": alice.email, "password": PASSWORD})
    assert_problem(api.get("/api/v1/me"), 401)


def test_nobody_revokes_another_persons_token(alice, bob):
    token, api = token_for(alice)
    bob_browser = Client()
    bob_browser.force_login(bob)
    assert bob_browser.post(f"/accounts/settings/api-tokens/{token.pk}/revoke/").status_code == 404
    assert api.get("/api/v1/me").status_code == 200


def test_it_records_when_a_token_was_last_used(alice):
    token, api = token_for(alice)
    assert token.last_used_at is None
    api.get("/api/v1/me")
    token.refresh_from_db()
    assert token.last_used_at is not None and timezone.now() - token.last_used_at < timedelta(minutes=1)


def test_me_says_which_token_is_used(alice):
    _, api = token_for(alice, scope="read", name="dashboards")
    me = api.get("/api/v1/me").json()
    assert me["token"]["name"] == "dashboards" and me["token"]["scope"] == "read"


def test_the_settings_page_marks_revoked_and_expired_tokens_and_offers_no_revoke_for_them(
    alice_client, alice
):
    revoked, _ = token_for(alice, name="old laptop")
    expired, _ = token_for(alice, name="last year's CI")
    live, _ = token_for(alice, name="CI")
    ApiToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(days=1))
    page = alice_client.get(SETTINGS).content.decode()
    assert "Revoked" in page and "Expired" in page and "Expires" in page
    assert f"/accounts/settings/api-tokens/{live.pk}/revoke/" in page
    assert f"/accounts/settings/api-tokens/{revoked.pk}/revoke/" not in page
    assert f"/accounts/settings/api-tokens/{expired.pk}/revoke/" not in page
