"""Proving the address ends every way in, API tokens included: someone who was inside the account (a
stolen password, a squatter) keeps no token after the owner resets the password through the emailed link."""

import pytest

from tests.accounts.conftest import link_path
from tests.conftest import PASSWORD

from .conftest import token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_it_revokes_the_intruders_token_when_the_owner_resets_the_password(
    client, alice, mailoutbox, run_on_commit
):
    # The intruder logged in with alice's password and made a token through the Settings page.
    intruder = client
    intruder.post("/accounts/login/", {"username": alice.email, "password": PASSWORD})
    page = intruder.post(
        "/accounts/settings/api-tokens/", {"name": "mine now", "scope": "launch", "days": "365"}
    )
    token_text = page.context["new_token"]
    assert intruder.get("/api/v1/me", headers={"Authorization": f"Bearer {token_text}"}).status_code == 200

    # The owner resets the password through the emailed link, in their own browser.
    from django.test import Client

    owner = Client()
    with run_on_commit():
        owner.post("/accounts/password/reset/", {"email": alice.email})
    form_url = owner.get(link_path(mailoutbox[-1]))["Location"]
    with run_on_commit():
        done = owner.post(
            form_url, {"new_password1": "a brand new passphrase", "new_password2": "a brand new passphrase"}
        )
    assert done.status_code == 302

    answer = Client().get("/api/v1/me", headers={"Authorization": f"Bearer {token_text}"})
    assert answer.status_code == 401


def test_it_keeps_no_token_of_an_account_when_the_address_is_confirmed_through_a_change(alice):
    # A token made before is revoked by access_reset whatever proof triggered it.
    from portal.accounts import services as account_services

    token, api = token_for(alice)
    account_services.access_reset(user=alice, keep_session_key=None)
    assert api.get("/api/v1/me").status_code == 401
