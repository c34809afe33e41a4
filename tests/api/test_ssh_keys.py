"""/api/v1/ssh-keys: list, add and delete with the Settings page's checks and messages."""

import pytest

from portal.accounts.models import SshKey

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
