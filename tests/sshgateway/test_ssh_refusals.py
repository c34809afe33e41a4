"""Everything the gateway refuses, tried with the real OpenSSH client the way an attacker or a confused
user would, and the sentence each one reads."""

import subprocess
import uuid

import pytest
from django.utils import timezone

from portal.accounts import services as accounts
from portal.instances.models import Instance
from portal.sshgateway.models import SshSession
from provisioning.drivers import driver_for
from tests.support.drivers import instance_ref

from .conftest import add_key

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300, func_only=True)]

DENIED = "Permission denied (publickey)"


# A short id of digits only reaches the gateway as an IPv4 address (OpenSSH reads it as inet_aton
# does); the gateway reads it back, and that reading must not open someone else's instance either.
@pytest.mark.parametrize("fields", [{}, {"id": uuid.UUID("63082398-0000-4000-8000-000000000001")}], ids=["hex", "digits"])
def test_another_persons_key_reaches_neither_the_instance_nor_its_sshd(alice, bob, keygen, ssh_as, launch, fields):
    alice_key, bob_key = keygen("alice-laptop"), keygen("bob-laptop")
    add_key(alice, alice_key, "laptop")
    add_key(bob, bob_key, "laptop")
    instance = launch(alice, **fields)
    bob_ssh = ssh_as(bob_key)

    through_gateway = bob_ssh.run(instance.short_id, "id")
    # Bob on the host's private network, straight at the published port: the instance trusts alice only.
    straight = bob_ssh.direct(instance.driver_state["ssh_port"], "id")

    assert through_gateway.returncode != 0 and "uid=" not in through_gateway.stdout
    assert f"You have no instance named '{instance.short_id}'" in through_gateway.stderr
    assert straight.returncode != 0 and DENIED in straight.stderr
    assert not SshSession.objects.exists()


def test_a_key_on_no_account_is_refused_at_the_gateway(alice, keygen, ssh_as, launch):
    add_key(alice, keygen("alice-laptop"), "laptop")
    instance = launch(alice)

    result = ssh_as(keygen("stranger")).run(instance.short_id, "id")

    assert result.returncode == 255 and DENIED in result.stderr


def test_a_stopped_instance_is_refused(alice, keygen, ssh_as, launch, host):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    driver_for(host, "docker").stop(instance_ref(instance))
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED, stopped_at=timezone.now())

    result = ssh_as(key).run(instance.short_id, "id")

    assert result.returncode == 255
    assert f"Instance {instance.short_id} is stopped, not running" in result.stderr


def test_a_suspended_account_is_refused_with_the_reason(alice, olivia, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    # Suspension also stops her instances; the gateway must refuse even while one still shows as running.
    accounts.user_suspend(user=alice, actor=olivia, reason="Crypto mining on the free tier")
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING)

    result = ssh_as(key).run(instance.short_id, "id")

    assert result.returncode == 255 and "uid=" not in result.stdout
    assert "Your account is suspended: Crypto mining on the free tier" in result.stderr


def test_password_authentication_is_not_offered(alice, keygen, ssh_as, gateway, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    launch(alice)

    result = subprocess.run(
        ["ssh", "-F", str(ssh_as(key).config), "-p", str(gateway.port),
         "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive",
         "alice@127.0.0.1", "id"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )

    # The methods in parentheses are all the gateway offers.
    assert result.returncode == 255 and DENIED in result.stderr


def test_an_unknown_name_is_refused_with_the_running_instances(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)

    result = ssh_as(key).run("no-such-box", "id")

    assert result.returncode == 255
    assert "You have no instance named 'no-such-box'" in result.stderr
    assert instance.short_id in result.stderr


def test_only_port_22_of_an_instance_is_reachable(alice, keygen, ssh_as, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)

    # -W asks the gateway itself for a raw TCP stream, here to JupyterLab's port.
    result = subprocess.run(
        ["ssh", "-F", str(ssh_as(key).config), "-p", str(ssh_as(key).gateway.port),
         "-W", f"{instance.short_id}:8888", "alice@127.0.0.1"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )

    assert result.returncode == 255
    assert "only the SSH server of your instances (port 22), not port 8888" in result.stderr


def test_a_shell_on_the_gateway_prints_help_and_closes(alice, keygen, ssh_as, gateway, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)

    result = subprocess.run(
        ["ssh", "-F", str(ssh_as(key).config), "-p", str(gateway.port), "alice@127.0.0.1", "id"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )

    assert result.returncode == 1 and "uid=" not in result.stdout
    assert "It has no shell" in result.stdout
    assert "ssh -J 127.0.0.1:2222 developer@<instance>" in result.stdout
    assert f"Your running instances: {instance.short_id}" in result.stdout


def test_the_gateway_forwards_to_nothing_but_instances(alice, keygen, ssh_as, gateway, launch):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    launch(alice)
    ssh = ssh_as(key)

    # The portal's own database and sshd, by address and by name: what an attacker would try.
    attempts = [
        subprocess.run(
            ["ssh", "-F", str(ssh.config), "-p", str(gateway.port), "-W", target, "alice@127.0.0.1"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )
        for target in ("127.0.0.1:5432", "localhost:22", "[::1]:22", "postgres:5432")
    ]

    for result in attempts:
        assert result.returncode == 255
        assert "administratively prohibited" in result.stderr, result.stderr


def test_a_key_pasted_into_another_account_does_not_divert_its_owner(alice, bob, keygen, ssh_as, launch):
    # Bob pastes alice's public key (public keys are public) into his own account, hoping her
    # connections land in his instance, where he could watch what she types.
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    accounts.sshkey_add(user=bob, name="not mine", public_key=key.public_line)
    alices, bobs = launch(alice, minor=128), launch(bob, minor=136)

    result = ssh_as(key).run(alices.short_id, "hostname")

    assert result.stdout.strip() == f"devcloud-{alices.short_id}", result.stderr
    session = SshSession.objects.get()
    assert (session.user, session.instance) == (alice, alices)
    assert bobs.short_id != alices.short_id


def test_offering_someone_elses_public_key_without_its_private_key_gains_nothing(
    alice, bob, keygen, ssh_as, launch, tmp_path
):
    alice_key, bob_key = keygen("alice-laptop"), keygen("bob-laptop")
    add_key(alice, alice_key, "laptop")
    add_key(bob, bob_key, "laptop")
    instance = launch(alice)
    # Bob has alice's public key (anyone can), offers it first, then signs in with his own.
    stolen = tmp_path / "stolen" / "alice.pub"
    stolen.parent.mkdir()
    stolen.write_text(alice_key.public_line + "\n")
    config = tmp_path / "bob-config"
    config.write_text(
        ssh_as(bob_key).config.read_text().replace(
            f"  IdentityFile {bob_key.private}\n", f"  IdentityFile {stolen}\n  IdentityFile {bob_key.private}\n"
        )
    )

    result = subprocess.run(
        ["ssh", "-F", str(config), "-J", ssh_as(bob_key).gateway.jump, f"developer@{instance.short_id}", "id"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )

    # The gateway said yes to alice's key when it was offered, but only bob signed: he is bob.
    assert "uid=" not in result.stdout
    assert f"You have no instance named '{instance.short_id}'" in result.stderr, result.stderr
    assert not SshSession.objects.exists()
