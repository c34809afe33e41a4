"""`devcloud ssh` for real: the CLI asks the live portal where the gateway is and which instance the short
id names, then becomes the real OpenSSH client, which runs a command in a real container through the real
gateway process."""

import pytest

from portal.api import services
from tests.sshgateway.conftest import add_key

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300, func_only=True),
]


def test_devcloud_ssh_runs_a_command_in_the_instance(
    alice, keygen, ssh_as, launch, gateway, live_server, settings, devcloud
):
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "127.0.0.1", gateway.port
    settings.ALLOWED_HOSTS = ["*"]
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    token = services.token_create(user=alice, name="laptop", scope="read", days=1)[1]
    assert devcloud("login", "--url", live_server.url, "--token", token).returncode == 0

    # -F: the identity file and batch mode, as a person's ~/.ssh/config would give them.
    result = devcloud(
        "ssh",
        instance.short_id,
        "-F",
        str(ssh_as(key).config),
        "--",
        "python3 -c 'print(6*7)'; id -un",
        input="",
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["42", "developer"]
