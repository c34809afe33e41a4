"""`devcloud ssh` and `ssh-config` build the OpenSSH command line through the gateway. A stand-in `ssh` on
PATH records its arguments; the real OpenSSH path is tested with the gateway itself."""

import json
import textwrap

import pytest

from portal.instances import services
from portal.instances.models import Instance

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


@pytest.fixture
def running(alice, alice_token, portal, devcloud, settings):
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "gw.devcloud.test", 2200
    devcloud("login", "--url", portal, "--token", alice_token)
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    return instance


def test_ssh_execs_openssh_through_the_gateway_with_extra_args(devcloud, running, recording_ssh):
    result = devcloud("ssh", running.short_id, "-L", "8000:localhost:8000", "--", "nvidia-smi")
    assert result.returncode == OK, result.stderr
    argv = json.loads(recording_ssh.read_text())
    assert argv[1:] == [
        "-J",
        "gw.devcloud.test:2200",
        "-o",
        "StrictHostKeyChecking=accept-new",
        f"developer@{running.short_id}",
        "-L",
        "8000:localhost:8000",
        "--",
        "nvidia-smi",
    ]


def test_ssh_refuses_an_instance_that_is_not_running(devcloud, running, recording_ssh):
    services.instance_stop(user=running.user, instance_id=running.id)
    result = devcloud("ssh", running.short_id)
    assert result.returncode == REFUSED and "not running" in result.stderr
    assert not recording_ssh.exists()


def test_ssh_refuses_an_unknown_instance(devcloud, running, recording_ssh):
    result = devcloud("ssh", "ffffffff")
    assert result.returncode == REFUSED and "You have no instance 'ffffffff'" in result.stderr


def test_ssh_config_prints_a_block_with_the_gateway_as_proxy_jump(devcloud, running):
    block = devcloud("ssh-config").stdout
    assert "Host devcloud-gateway\n    HostName gw.devcloud.test\n    Port 2200" in block
    assert "Host devcloud-* !devcloud-gateway\n    User developer\n    ProxyJump devcloud-gateway" in block
