"""The tenant runs code as uid 1000 inside the instance, and so does sshd; yet sshd's configuration and
the keys it trusts are the portal's to set. A tenant (or whoever got a shell in the instance) who tries
to add a key of their own, or to loosen sshd's configuration, is refused by the filesystem, and a key the
owner did not register cannot log in. Real container of the CPU image on the local engine."""

import docker
import pytest

from provisioning.drivers.docker import container_name

from .conftest import add_key

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300, func_only=True)]

DENIED = "Permission denied (publickey)"


def as_tenant(instance, command: str):
    """Run `command` with sh as uid 1000 inside the instance, the way a tenant's terminal would."""
    container = docker.from_env().containers.get(container_name(instance.id))
    result = container.exec_run(["sh", "-c", command], user="1000:1000")
    return result.exit_code, result.output.decode(errors="replace")


def sshd_files(instance) -> tuple[str, str]:
    """(the sshd_config sshd runs with, its AuthorizedKeysFile), read from sshd's own command line."""
    _, lines = as_tenant(instance, "for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline 2>/dev/null; echo; done")
    # sshd retitles itself "sshd: /usr/sbin/sshd -D -e -f <config> ... [listener] ...".
    [command] = [line.split() for line in lines.splitlines() if "/usr/sbin/sshd" in line and " -f " in line]
    config_path = command[command.index("-f") + 1]
    _, keys_line = as_tenant(instance, f"grep -i '^AuthorizedKeysFile' {config_path}")
    keys_path = keys_line.split()[1]
    return config_path, keys_path if keys_path.startswith("/") else f"/home/developer/{keys_path}"


def test_the_tenant_cannot_add_a_key_or_edit_sshds_config(alice, keygen, ssh_as, launch):
    add_key(alice, keygen("alice-laptop"), "laptop")
    intruder = keygen("intruder")
    instance = launch(alice)
    config_path, keys_path = sshd_files(instance)
    assert config_path and keys_path

    appended, append_out = as_tenant(instance, f"echo '{intruder.public_line}' >> {keys_path}")
    edited, edit_out = as_tenant(instance, f"echo 'AuthorizedKeysFile /tmp/mine' >> {config_path}")
    replaced, replace_out = as_tenant(
        instance, f"cp {keys_path} /tmp/k && echo '{intruder.public_line}' >> /tmp/k && mv -f /tmp/k {keys_path}"
    )
    # The old place, in the tenant's own home, is not what sshd reads any more.
    as_tenant(instance, f"mkdir -p ~/.ssh && echo '{intruder.public_line}' >> ~/.ssh/authorized_keys")

    assert appended != 0 and "Permission denied" in append_out
    assert edited != 0 and "Permission denied" in edit_out
    assert replaced != 0 and ("Permission denied" in replace_out or "Operation not permitted" in replace_out)
    straight = ssh_as(intruder).direct(instance.driver_state["ssh_port"], "echo in")
    assert straight.returncode == 255 and DENIED in straight.stderr
    through_gateway = ssh_as(intruder).run(instance.short_id, "echo in")
    assert through_gateway.returncode == 255
