"""SSH keys are a way into a person's instances, so proving the address removes the ones added before
the proof, as it removes GitHub links: an attacker who signed up first with someone's address, or who
learnt their password, must not keep an SSH key on the account once its owner takes it back. Every
test drives the real pages through the test client and checks the gateway's own lookup."""

import pytest
from django.test import Client

from portal.accounts.models import SshKey, User
from portal.sshgateway import access
from tests.conftest import PASSWORD

from .conftest import link_path
from .test_takeover import VICTIM, log_in, mails_to, reset_password, sign_up

pytestmark = pytest.mark.django_db

SETTINGS_URL = "/accounts/settings/"
# The attacker's own key pair (made with ssh-keygen); only its public half matters here.
MALLORY_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICjVi7sNvJ3FsJF3XUvby/FJkQP0ARDQL7TMzD4jEMdy mallory@evil"
MALLORY_FINGERPRINT = "SHA256:rEE/12Jh1tZsUZnYvme6oIiPdMYDEKRSYCZ90Z54D4w"
OWNER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAqmjVi1hTAfmt1YEfwOulspSR54p+68KGIvIUFxc5oB owner@laptop"


def add_key_through_settings(browser, public_key, name):
    return browser.post("/accounts/settings/ssh-keys/", {"name": name, "public_key": public_key})


def test_the_squatters_ssh_key_is_gone_once_the_owner_resets_the_password(run_on_commit, mailoutbox):
    squatter = Client()
    sign_up(squatter, run_on_commit)
    assert add_key_through_settings(squatter, MALLORY_KEY, "mallory").status_code == 302
    assert access.key_is_known(MALLORY_FINGERPRINT)

    page = reset_password(Client(), run_on_commit, mailoutbox).content.decode()

    squatted = User.objects.get(email=VICTIM)
    assert not squatted.ssh_keys.exists()
    assert not access.key_is_known(MALLORY_FINGERPRINT)
    assert "removed 1 SSH key (mallory)" in page
    [notice] = mails_to(mailoutbox, VICTIM, "removed")
    assert "SSH key" in notice.body


def test_a_password_reset_removes_an_intruders_ssh_key(alice, run_on_commit, mailoutbox):
    # Someone who learnt alice's password logs in and adds their own key, to reach her instances later.
    intruder = Client()
    assert log_in(intruder, "alice@example.com", PASSWORD).status_code == 302
    assert add_key_through_settings(intruder, MALLORY_KEY, "backup").status_code == 302

    reset_password(Client(), run_on_commit, mailoutbox, email="alice@example.com")

    assert not SshKey.objects.filter(fingerprint=MALLORY_FINGERPRINT).exists()
    assert not access.key_is_known(MALLORY_FINGERPRINT)


def test_confirming_the_address_removes_keys_added_before_and_keeps_those_added_after(
    charlie, run_on_commit, mailoutbox, client
):
    client.force_login(charlie)
    assert add_key_through_settings(client, MALLORY_KEY, "mallory").status_code == 302
    with run_on_commit():
        client.post("/accounts/verify/resend/")

    with run_on_commit():
        page = client.post(link_path(mails_to(mailoutbox, "charlie@example.com", "Confirm")[-1]), follow=True)
    added_after = add_key_through_settings(client, OWNER_KEY, "laptop")

    assert "removed 1 SSH key (mallory)" in page.content.decode()
    assert added_after.status_code == 302
    assert list(charlie.ssh_keys.values_list("name", flat=True)) == ["laptop"]


def test_confirming_a_new_address_removes_ssh_keys_added_before(alice, run_on_commit, mailoutbox):
    here = Client()
    here.force_login(alice)
    add_key_through_settings(here, MALLORY_KEY, "mallory")
    with run_on_commit():
        here.post("/accounts/settings/email/", {"new_email": "alice@new.example", "password": PASSWORD})

    with run_on_commit():
        page = here.post(link_path(mailoutbox[-1]), follow=True).content.decode()

    assert not alice.ssh_keys.exists()
    assert not access.key_is_known(MALLORY_FINGERPRINT)
    assert "removed 1 SSH key (mallory)" in page
