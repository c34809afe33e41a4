"""A password change takes the account back from someone who stole a session: every other session ends,
and the API tokens and SSH keys added from another session since the previous password change are
revoked, while the owner's own, added from the session that changes the password, stay. Every test
drives the real pages and API through test clients, as the owner and the attacker would."""

import pytest
from django.test import Client

from portal.accounts.models import SshKey
from portal.api.models import ApiToken
from portal.sshgateway import access
from portal.sshgateway.services import authorized_keys_text
from tests.conftest import PASSWORD

from ..api.conftest import TokenClient
from .test_takeover_ssh_keys import MALLORY_FINGERPRINT, MALLORY_KEY, OWNER_KEY, add_key_through_settings

pytestmark = pytest.mark.django_db

CHANGE = "/accounts/settings/password/"
TOKENS = "/accounts/settings/api-tokens/"
NEW = "another long passphrase"


def log_in(browser, email="alice@example.com", password=PASSWORD):
    return browser.post("/accounts/login/", {"username": email, "password": password})


def create_token(browser, name):
    return browser.post(TOKENS, {"name": name, "scope": "launch", "days": "30"}).context["new_token"]


def change_password(browser, run_on_commit):
    with run_on_commit():
        return browser.post(
            CHANGE, {"old_password": PASSWORD, "new_password1": NEW, "new_password2": NEW}, follow=True
        )


def test_a_password_change_locks_out_the_session_token_and_key_an_attacker_added(
    alice, run_on_commit, mailoutbox
):
    owner, attacker = Client(), Client()
    assert log_in(owner).status_code == 302
    # The attacker rides a session of alice's (stolen cookie, or her password learnt and used).
    assert log_in(attacker).status_code == 302
    attacker_token = create_token(attacker, "backup")
    with run_on_commit():
        assert add_key_through_settings(attacker, MALLORY_KEY, "backup").status_code == 302
    owner_token = create_token(owner, "laptop CI")
    with run_on_commit():
        assert add_key_through_settings(owner, OWNER_KEY, "laptop").status_code == 302
    assert TokenClient(attacker_token).get("/api/v1/me").status_code == 200

    page = change_password(owner, run_on_commit).content.decode()

    # The attacker's session, token and key no longer work.
    assert attacker.get("/accounts/settings/").status_code == 302
    assert TokenClient(attacker_token).get("/api/v1/me").status_code == 401
    assert not SshKey.objects.filter(fingerprint=MALLORY_FINGERPRINT).exists()
    assert not access.key_is_known(MALLORY_FINGERPRINT)
    assert MALLORY_KEY.split()[1] not in authorized_keys_text(alice.pk)
    # The owner's own stay.
    assert TokenClient(owner_token).get("/api/v1/me").status_code == 200
    assert OWNER_KEY.split()[1] in authorized_keys_text(alice.pk)
    assert owner.get("/accounts/settings/").status_code == 200
    # The page and an email say what was revoked.
    assert "revoked 1 API token (backup)" in page
    assert "removed 1 SSH key (backup)" in page
    [notice] = [m for m in mailoutbox if m.to == ["alice@example.com"] and "password" in m.subject.lower()]
    assert "backup" in notice.body and "API token" in notice.body and "SSH key" in notice.body


def test_a_key_added_through_a_stolen_token_is_removed_too(alice, run_on_commit):
    owner, attacker = Client(), Client()
    log_in(owner)
    log_in(attacker)
    token = create_token(attacker, "backup")
    with run_on_commit():
        added = TokenClient(token).post(
            "/api/v1/ssh-keys", {"name": "via api", "public_key": MALLORY_KEY}
        )
    assert added.status_code == 201

    change_password(owner, run_on_commit)

    assert not SshKey.objects.filter(fingerprint=MALLORY_FINGERPRINT).exists()


def test_items_from_before_the_previous_password_change_stay(alice, run_on_commit):
    # Added in another session, then the owner changed the password once: that change revoked them,
    # or they were the owner's; a second change does not touch what the first left standing.
    owner = Client()
    log_in(owner)
    token = create_token(owner, "laptop CI")
    change_password(owner, run_on_commit)
    other = Client()
    assert log_in(other, password=NEW).status_code == 302
    with run_on_commit():
        other.post(CHANGE, {"old_password": NEW, "new_password1": PASSWORD, "new_password2": PASSWORD})

    assert TokenClient(token).get("/api/v1/me").status_code == 200
    assert ApiToken.objects.get(name="laptop CI").revoked_at is None
