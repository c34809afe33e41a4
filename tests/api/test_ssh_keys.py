"""/api/v1/ssh-keys: list, add and delete with the Settings page's checks and messages."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from portal.accounts import services as accounts
from portal.accounts.models import SshKey
from portal.sshgateway import access
from portal.sshgateway.services import authorized_keys_text

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db
URL = "/api/v1/ssh-keys"
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def test_it_adds_lists_and_deletes_a_key(alice):
    _, api = token_for(alice)
    added = api.post(URL, {"name": "laptop", "public_key": ED25519})
    assert added.status_code == 201, added.content
    key = added.json()
    assert (
        key["name"] == "laptop"
        and key["key_type"] == "ssh-ed25519"
        and key["fingerprint"].startswith("SHA256:")
    )
    assert [row["id"] for row in api.get(URL).json()] == [key["id"]]
    assert api.delete(f"{URL}/{key['id']}").status_code == 204
    assert not SshKey.objects.exists()


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        (
            {"name": "x", "public_key": "-----BEGIN OPENSSH PRIVATE KEY-----"},
            "public_key",
            "This is a private key.",
        ),
        ({"name": "x", "public_key": "hello"}, "public_key", "This is not a valid SSH public key."),
        ({"name": "", "public_key": ED25519}, "name", "Give the key a name"),
        ({"name": "n" * 101, "public_key": ED25519}, "name", "at most 100 characters"),
    ],
)
def test_it_refuses_bad_keys_with_the_pages_messages(alice, payload, field, message):
    _, api = token_for(alice)
    body = assert_problem(api.post(URL, payload), 400, kind="validation")
    assert any(message in text for text in body["errors"][field]), body
    assert not SshKey.objects.exists()


def test_it_refuses_a_duplicate_key(alice):
    _, api = token_for(alice)
    api.post(URL, {"name": "laptop", "public_key": ED25519})
    body = assert_problem(api.post(URL, {"name": "again", "public_key": ED25519}), 400)
    assert body["errors"]["public_key"] == ["You already added this key, as “laptop”."]


def test_a_read_scoped_token_cannot_add_keys(alice):
    _, api = token_for(alice, scope="read")
    assert_problem(api.post(URL, {"name": "laptop", "public_key": ED25519}), 403, kind="insufficient-scope")
    assert not SshKey.objects.exists()


def test_a_key_for_one_job_expires_and_is_then_neither_trusted_nor_kept(alice):
    _, api = token_for(alice)
    before = timezone.now()

    added = api.post(URL, {"name": "ci run", "public_key": ED25519, "expires_in_minutes": 30})

    assert added.status_code == 201, added.content
    expires_at = datetime.fromisoformat(added.json()["expires_at"])
    assert timedelta(minutes=30) <= expires_at - before < timedelta(minutes=31)
    key = SshKey.objects.get(pk=added.json()["id"])
    assert access.key_is_known(key.fingerprint)
    assert ED25519.split()[1] in authorized_keys_text(alice.pk)

    SshKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))  # time passes

    assert not access.key_is_known(key.fingerprint)
    assert access.keys_with(key.fingerprint) == []
    assert authorized_keys_text(alice.pk) == ""
    assert accounts.sshkeys_prune_expired() == 1
    assert api.get(URL).json() == []


def test_a_key_without_an_expiry_is_kept_by_the_prune(alice):
    _, api = token_for(alice)
    api.post(URL, {"name": "laptop", "public_key": ED25519})

    assert accounts.sshkeys_prune_expired(now=timezone.now() + timedelta(days=3650)) == 0
    assert [row["expires_at"] for row in api.get(URL).json()] == [None]


@pytest.mark.parametrize("minutes", [0, -5, 7 * 24 * 60 + 1, "soon"])
def test_an_expiry_out_of_range_is_refused_and_adds_nothing(alice, minutes):
    _, api = token_for(alice)

    answer = api.post(URL, {"name": "ci run", "public_key": ED25519, "expires_in_minutes": minutes})

    assert "expires_in_minutes" in assert_problem(answer, 400).get("errors", {})
    assert not SshKey.objects.exists()
