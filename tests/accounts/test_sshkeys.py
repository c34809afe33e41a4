import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from portal.accounts.models import SshKey

ADD = "/accounts/settings/ssh-keys/"
# Made with ssh-keygen; the fingerprints are what `ssh-keygen -lf` prints for them.
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICjVi7sNvJ3FsJF3XUvby/FJkQP0ARDQL7TMzD4jEMdy alice@laptop"
ED25519_FINGERPRINT = "SHA256:rEE/12Jh1tZsUZnYvme6oIiPdMYDEKRSYCZ90Z54D4w"
ECDSA = (
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBJj3p/Q5t9f4lSZ+PMwGNDw5"
    "5rtp4Vg1z2DTGPJ89FUrfiCWZWLKFcsg+WaiSdtkIi6QYFBNg601O9saG4JE8F0= alice@ci"
)
ECDSA_FINGERPRINT = "SHA256:uQ+NjdRLEpToekuem0K3rGd6PEh0GjCg13BineBwJu8"
DSA = (
    "ssh-dss AAAAB3NzaC1kc3MAAACBAKJDqK1SE71M+N8rDl1aF2zwF6MZV5vAUSR4ZsEuqMXJf9T/xYrFePjb/DvcamE7KXnt"
    "lYV+pcfAeHLTZnaj1FsKTqQCFUlXgzof/mvn05XD2rTZO7BTT1pQVgYIbWq/CysyJCKVjD5ULNRhUhN6vYuRPy3ZUl0XMDQA"
    "9xeUuh+FAAAAFQDj0w+UBdNZ40QUJSQ/G1V+SnCgUwAAAIArLaRqL7yr9L0Wn7fhGAcmywkyoj/TDjelVOMxsjfHFfQryyTs"
    "rlmgH9opU0BT4RBmn+aZIrU2MBOuDUQwrvHP5y3hVF/s7dE/RAJ8QKyJHJCfCEea9Cana0RZ/3sYkQ35eFZrYBeyhDpvX/39"
    "xlypL4fI4AFuK2fp/l5fMeh6AgAAAIBub0llRygsFZY1EZQdtFaKWZKbFFbXl/uNUAla/36UJ6cOlOeFmwSbqJx00ci48P5q"
    "38l+r/tjqpwIvuOwLH1yv8jTqcCLEP0wkyBijz37AN3kb3l3qHKemCx92f+X7pPw15WMbnJ7aPDYhFim/AgK5JEhhT4oeoCi"
    "IzHu7hM4Rg=="
)


def openssh_public(private_key) -> str:
    return (
        private_key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def add(client, public_key, name="laptop"):
    return client.post(ADD, {"name": name, "public_key": public_key})


@pytest.mark.parametrize(
    "public_key, key_type, fingerprint",
    [(ED25519, "ssh-ed25519", ED25519_FINGERPRINT), (ECDSA, "ecdsa-sha2-nistp256", ECDSA_FINGERPRINT)],
)
def test_it_adds_a_key_with_its_type_and_ssh_keygen_fingerprint(
    alice_client, alice, public_key, key_type, fingerprint
):
    response = add(alice_client, f"\n  {public_key}  \n")

    assert response.status_code == 302 and response["Location"] == "/accounts/settings/"
    key = SshKey.objects.get(user=alice)
    assert (key.name, key.key_type, key.fingerprint, key.public_key) == (
        "laptop",
        key_type,
        fingerprint,
        public_key,
    )
    page = alice_client.get("/accounts/settings/").content.decode()
    assert fingerprint in page and key_type in page


def test_it_accepts_a_2048_bit_rsa_key_without_a_comment(alice_client, alice):
    public_key = openssh_public(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    add(alice_client, public_key)

    assert SshKey.objects.get(user=alice).key_type == "ssh-rsa"


def assert_refused(response, alice, message):
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not SshKey.objects.filter(user=alice).exists()


def test_it_refuses_a_short_rsa_key_saying_so(alice_client, alice):
    public_key = openssh_public(rsa.generate_private_key(public_exponent=65537, key_size=1024))

    assert_refused(
        add(alice_client, public_key), alice, "This RSA key has only 1024 bits; at least 2048 are required."
    )


def test_it_refuses_a_dsa_key(alice_client, alice):
    assert_refused(add(alice_client, DSA), alice, "DSA keys are no longer accepted.")


def test_it_refuses_a_private_key_pasted_by_mistake(alice_client, alice):
    private = (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        .decode()
    )

    assert_refused(add(alice_client, private), alice, "This is a private key. Never share it")


@pytest.mark.parametrize(
    "public_key",
    [
        "hello world",
        "ssh-ed25519",
        "ssh-ed25519 not-base64!!",
        ED25519.replace("AAAAC3NzaC1lZDI1NTE5AAAAICjV", "AAAAC3NzaC1lZDI1NTE5AAAAICj"),
        ED25519[:60],
        "ssh-rsa " + ED25519.split()[1],
    ],
    ids=["words", "type-only", "bad-base64", "corrupt-blob", "truncated", "type-mismatch"],
)
def test_it_refuses_a_malformed_key(alice_client, alice, public_key):
    assert_refused(add(alice_client, public_key), alice, "This is not a valid SSH public key.")


def test_it_says_security_keys_are_not_supported(alice_client, alice):
    security_key = "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIA== yubikey"

    assert_refused(
        add(alice_client, security_key), alice, "Security-key (FIDO) SSH keys are not supported yet."
    )


def test_it_refuses_two_keys_at_once(alice_client, alice):
    assert_refused(add(alice_client, f"{ED25519}\n{ECDSA}"), alice, "Paste one key, on a single line.")


def test_it_refuses_an_empty_form_naming_both_fields(alice_client, alice):
    response = alice_client.post(ADD, {"name": "", "public_key": ""})

    assert_refused(response, alice, "Give the key a name")
    assert "Paste your public key" in response.content.decode()


def test_it_refuses_a_duplicate_even_with_another_comment(alice_client, alice):
    add(alice_client, ED25519, name="laptop")

    response = add(alice_client, ED25519.replace("alice@laptop", "other comment"), name="again")

    assert response.status_code == 400
    assert "You already added this key, as “laptop”." in response.content.decode()
    assert SshKey.objects.filter(user=alice).count() == 1


def test_two_people_may_add_the_same_public_key(alice_client, alice, bob_client):
    add(alice_client, ED25519)

    add(bob_client, ED25519)

    assert SshKey.objects.filter(fingerprint=ED25519_FINGERPRINT).count() == 2


def test_it_deletes_an_own_key(alice_client, alice):
    add(alice_client, ED25519)
    key = SshKey.objects.get(user=alice)

    response = alice_client.post(f"/accounts/settings/ssh-keys/{key.pk}/delete/")

    assert response.status_code == 302
    assert not SshKey.objects.filter(pk=key.pk).exists()


def test_it_answers_404_for_someone_elses_key_and_keeps_it(alice_client, alice, bob_client):
    add(alice_client, ED25519)
    key = SshKey.objects.get(user=alice)

    response = bob_client.post(f"/accounts/settings/ssh-keys/{key.pk}/delete/")

    assert response.status_code == 404
    assert SshKey.objects.filter(pk=key.pk).exists()
    assert ED25519_FINGERPRINT not in bob_client.get("/accounts/settings/").content.decode()


def test_deleting_needs_a_post(alice_client, alice):
    add(alice_client, ED25519)
    key = SshKey.objects.get(user=alice)

    assert alice_client.get(f"/accounts/settings/ssh-keys/{key.pk}/delete/").status_code == 405
    assert SshKey.objects.filter(pk=key.pk).exists()
