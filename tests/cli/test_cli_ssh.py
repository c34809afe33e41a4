"""`devcloud ssh` and `ssh-config` build the OpenSSH command line through the gateway, with the gateway's
host key pinned from the API and checked strictly. A stand-in `ssh` on PATH records its arguments; the
real OpenSSH path is tested with the gateway itself (test_cli_ssh_real.py)."""

import json
import shlex
import textwrap

import pytest

from portal.instances import services
from portal.instances.models import Instance
from portal.sshgateway.server import load_host_key

OK, REFUSED = 0, 1


@pytest.fixture
def recording_ssh(tmp_path, devcloud):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.json"
    script = bin_dir / "ssh"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/usr/bin/env python3
            import json, sys
            json.dump(sys.argv, open({str(record)!r}, "w"))
            """
        )
    )
    script.chmod(0o755)
    devcloud.path_prefix = str(bin_dir)
    return record


def _make_gateway_key(tmp_path, settings, name="gateway_host_key"):
    """A gateway host key as the gateway makes it, published by the portal; returns its .pub line."""
    path = tmp_path / name
    load_host_key(str(path))
    settings.SSH_GATEWAY_HOST_KEY = str(path)
    return " ".join(path.with_name(f"{name}.pub").read_text().split()[:2])


@pytest.fixture
def gateway_key(tmp_path, settings):
    return _make_gateway_key(tmp_path, settings)


@pytest.fixture
def running(alice, alice_token, portal, devcloud, settings, gateway_key):
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "gw.devcloud.test", 2200
    devcloud("login", "--url", portal, "--token", alice_token)
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    return instance


def _options(argv: list[str]) -> dict:
    """The -o options of an ssh command line, by name."""
    return dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-o")


def test_ssh_checks_the_gateway_key_strictly_against_the_one_pinned_from_the_api(
    devcloud, running, recording_ssh, gateway_key
):
    result = devcloud("ssh", running.short_id, "-L", "8000:localhost:8000", "--", "amd-smi", detached=True)

    assert result.returncode == OK, result.stderr
    known_hosts = devcloud.home / "devcloud" / "known_hosts"
    assert known_hosts.read_text() == f"[gw.devcloud.test]:2200 {gateway_key}\n"
    assert "Pinned the SSH gateway's host key SHA256:" in result.stderr
    argv = json.loads(recording_ssh.read_text())
    assert argv[-5:] == [f"developer@{running.short_id}", "-L", "8000:localhost:8000", "--", "amd-smi"]
    options = _options(argv)
    hop = shlex.split(options["ProxyCommand"])
    assert hop[-6:] == ["-p", "2200", "-W", "[%h]:%p", "--", "gw.devcloud.test"]
    assert _options(hop) == {
        "UserKnownHostsFile": f'"{known_hosts}"',
        "StrictHostKeyChecking": "yes",
        "BatchMode": "yes",
    }
    # The instance's own key: taken on first use, kept under its full id in a file of the CLI's.
    assert options["StrictHostKeyChecking"] == "accept-new" and options["BatchMode"] == "yes"
    assert options["HostKeyAlias"] == f"devcloud-{running.id}"
    assert options["UserKnownHostsFile"] == f'"{devcloud.home / "devcloud" / "instances_known_hosts"}"'


def test_ssh_keeps_each_argument_of_a_several_word_command_whole_for_the_remote_shell(
    devcloud, running, recording_ssh
):
    assert devcloud("ssh", running.short_id, "--", "python3", "-c", "print(6 * 7)").returncode == OK
    assert json.loads(recording_ssh.read_text())[-2:] == ["--", "python3 -c 'print(6 * 7)'"]

    assert devcloud("ssh", running.short_id, "--", "cd /workspace && make").returncode == OK
    assert json.loads(recording_ssh.read_text())[-2:] == ["--", "cd /workspace && make"]


def test_ssh_refuses_when_the_portal_publishes_another_gateway_key_than_the_pinned_one(
    devcloud, running, recording_ssh, tmp_path, settings
):
    assert devcloud("ssh", running.short_id).returncode == OK
    recording_ssh.unlink()
    _make_gateway_key(tmp_path, settings, name="another_gateway_key")

    result = devcloud("ssh", running.short_id)

    assert result.returncode == REFUSED
    assert "The SSH gateway's host key has changed" in result.stderr
    assert "devcloud ssh-config --accept-new-gateway-key" in result.stderr
    assert not recording_ssh.exists()


def test_ssh_config_accept_new_gateway_key_pins_the_key_the_portal_now_publishes(
    devcloud, running, recording_ssh, tmp_path, settings
):
    assert devcloud("ssh-config").returncode == OK
    new_key = _make_gateway_key(tmp_path, settings, name="another_gateway_key")
    assert devcloud("ssh-config").returncode == REFUSED

    accepted = devcloud("ssh-config", "--accept-new-gateway-key")

    assert accepted.returncode == OK, accepted.stderr
    assert "Replaced the pinned key with the SSH gateway's host key" in accepted.stderr
    known_hosts = devcloud.home / "devcloud" / "known_hosts"
    assert known_hosts.read_text() == f"[gw.devcloud.test]:2200 {new_key}\n"
    assert devcloud("ssh", running.short_id).returncode == OK


def test_ssh_refuses_while_the_portal_publishes_no_gateway_key(devcloud, running, recording_ssh, settings, tmp_path):
    settings.SSH_GATEWAY_HOST_KEY = str(tmp_path / "never-made")
    result = devcloud("ssh", running.short_id)
    assert result.returncode == REFUSED and "the operator has not started it" in result.stderr
    assert not recording_ssh.exists()


def test_ssh_drops_the_kept_host_keys_of_instances_that_ended(devcloud, running, recording_ssh, alice):
    ended = services.instance_launch(user=alice, size="1x", image_key="cpu")
    services.instance_stop(user=alice, instance_id=ended.id)
    kept = devcloud.home / "devcloud" / "instances_known_hosts"
    kept.parent.mkdir(parents=True, exist_ok=True)
    lines = {
        "live": f"devcloud-{running.id} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
        "live-short": f"devcloud-{running.short_id} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
        "ended": f"devcloud-{ended.id} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
        "ended-short": f"devcloud-{ended.short_id} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    }
    kept.write_text("".join(f"{line}\n" for line in lines.values()))

    assert devcloud("ssh", running.short_id).returncode == OK

    assert kept.read_text() == f"{lines['live']}\n{lines['live-short']}\n"


def test_ssh_refuses_an_instance_that_is_not_running(devcloud, running, recording_ssh):
    services.instance_stop(user=running.user, instance_id=running.id)
    result = devcloud("ssh", running.short_id)
    assert result.returncode == REFUSED and "not running" in result.stderr
    assert not recording_ssh.exists()


def test_ssh_refuses_an_unknown_instance(devcloud, running, recording_ssh):
    result = devcloud("ssh", "ffffffff")
    assert result.returncode == REFUSED and "You have no instance 'ffffffff'" in result.stderr


def test_ssh_config_prints_a_block_that_checks_the_gateway_key_strictly(devcloud, running, gateway_key):
    result = devcloud("ssh-config")
    assert result.returncode == OK, result.stderr
    config_dir = devcloud.home / "devcloud"
    assert result.stdout == (
        "Host devcloud-gateway\n"
        "    HostName gw.devcloud.test\n"
        "    Port 2200\n"
        f'    UserKnownHostsFile "{config_dir / "known_hosts"}"\n'
        "    StrictHostKeyChecking yes\n"
        "\n"
        "Host devcloud-* !devcloud-gateway\n"
        "    User developer\n"
        "    ProxyJump devcloud-gateway\n"
        f'    UserKnownHostsFile "{config_dir / "instances_known_hosts"}"\n'
        "    StrictHostKeyChecking accept-new\n"
        "    HashKnownHosts no\n"
        "    CheckHostIP no\n"
    )
    assert (config_dir / "known_hosts").read_text() == f"[gw.devcloud.test]:2200 {gateway_key}\n"


@pytest.fixture
def flaky_ssh(tmp_path, devcloud):
    """An `ssh` whose first connection breaks off in the greeting, as OpenSSH reports it, and whose next
    one runs the command: it counts its calls in a file and prints what the command would."""
    bin_dir = tmp_path / "flaky-bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script = bin_dir / "ssh"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            n=$(cat {calls} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {calls}
            if [ "$n" = 1 ]; then
              echo "kex_exchange_identification: banner line contains invalid characters" >&2
              exit 255
            fi
            echo 42
            exit 3
            """
        )
    )
    script.chmod(0o755)
    devcloud.path_prefix = str(bin_dir)
    return calls


def test_run_tries_again_a_connection_that_broke_off_in_the_greeting_and_runs_the_command_once(
    alice, alice_token, portal, devcloud, settings, gateway_key, flaky_ssh
):
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "gw.devcloud.test", 2200
    devcloud("login", "--url", portal, "--token", alice_token)

    result = devcloud("run", "--size", "1x", "--image", "cpu", "--", "python3 -c 'print(6 * 7)'; exit 3")

    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ["42"]
    assert "broke off before it began; trying again (2 of 3)" in result.stderr
    assert flaky_ssh.read_text().strip() == "2"
    assert Instance.objects.get(user=alice).state in (Instance.State.STOPPING, Instance.State.STOPPED)


def test_ssh_with_a_command_tries_again_a_connection_that_broke_off_in_the_greeting(
    devcloud, running, flaky_ssh
):
    # A CI job's `devcloud ssh <id> -- <command>` under load: the greeting broke off before anything ran.
    result = devcloud("ssh", running.short_id, "--", "python3", "-c", "print(6 * 7)")

    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ["42"]
    assert "broke off before it began; trying again (2 of 3)" in result.stderr
    assert flaky_ssh.read_text().strip() == "2"
