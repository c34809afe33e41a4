"""Keys changed in Settings while an instance runs: a new key works on the next connection, a removed
key is refused on the next one, at the gateway and by the instance's own sshd."""

import pytest
from django.test import Client

from portal.accounts.models import SshKey
from portal.sshgateway import services

from .conftest import add_key

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300, func_only=True)]

DENIED = "Permission denied (publickey)"


@pytest.fixture
def alice_browser(alice):
    browser = Client()
    browser.force_login(alice)
    return browser


def test_a_removed_key_is_refused_on_the_next_connection(alice, alice_browser, keygen, ssh_as, launch):
    laptop, old_desktop = keygen("alice-laptop"), keygen("alice-old-desktop")
    add_key(alice, laptop, "laptop")
    add_key(alice, old_desktop, "old desktop")
    instance = launch(alice)
    assert ssh_as(old_desktop).run(instance.short_id, "echo in").stdout.strip() == "in"

    key = SshKey.objects.get(user=alice, name="old desktop")
    removed = alice_browser.post(f"/accounts/settings/ssh-keys/{key.pk}/delete/")
    again = ssh_as(old_desktop).run(instance.short_id, "echo in")
    straight = ssh_as(old_desktop).direct(instance.driver_state["ssh_port"], "echo in")

    assert removed.status_code == 302
    assert again.returncode == 255 and DENIED in again.stderr
    # The instance itself no longer trusts it either (someone on the host's network, past the gateway).
    assert straight.returncode == 255 and DENIED in straight.stderr
    assert ssh_as(laptop).run(instance.short_id, "echo in").stdout.strip() == "in"


def test_a_key_added_while_the_instance_runs_works_at_once(alice, alice_browser, keygen, ssh_as, launch):
    add_key(alice, keygen("alice-laptop"), "laptop")
    instance = launch(alice)
    new = keygen("alice-new-laptop")
    assert ssh_as(new).run(instance.short_id, "echo in").returncode == 255

    added = alice_browser.post("/accounts/settings/ssh-keys/", {"name": "new laptop", "public_key": new.public_line})
    result = ssh_as(new).run(instance.short_id, "echo in")

    assert added.status_code == 302
    assert result.returncode == 0 and result.stdout.strip() == "in", result.stderr


def test_the_periodic_sync_puts_back_the_owners_keys(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    # Whatever the file holds now (a push that failed or was lost; the tenant cannot write it)...
    from portal.instances.start_spec import instance_ref
    from provisioning.drivers import driver_for

    assert driver_for(instance.host, "docker").authorized_keys_set(instance_ref(instance), "")
    assert ssh_as(key).direct(instance.driver_state["ssh_port"], "true").returncode == 255

    updated = services.push_all_keys()

    assert updated == 1
    assert ssh_as(key).direct(instance.driver_state["ssh_port"], "echo in").stdout.strip() == "in"
