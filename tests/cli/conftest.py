"""The CLI against a live portal: Django's live_server (a real HTTP server on 127.0.0.1) with the fake
driver, and `python -m portal.cli` run as a separate process with its own config directory."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.core.cache import caches

from portal.api import services
from provisioning.drivers import fake
from tests.conftest import give

# The SSH tests' real gateway process, containers and OpenSSH client, for `devcloud ssh` run for real.
from tests.sshgateway.conftest import (  # noqa: F401  (fixtures, used by name)
    dev_root,
    gateway,
    host,
    image,
    keygen,
    launch,
    ssh_as,
)
from tests.support.docker_instances import docker_portal_fixture  # noqa: F401  (registers docker_portal)
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def portal(live_server, settings, transactional_db):
    """The live portal, launching on the fake driver: with tasks run inline (the test settings), the
    provisioning task runs when the launch commits, so a launch is running by the time it answers."""
    settings.DEVCLOUD_DRIVER = "fake"
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15
    settings.ALLOWED_HOSTS = ["*"]
    fake.install()
    fake.make_host()
    fake.make_image("cpu", sizes=["1x", "8x"], name="CPU")
    caches["ratelimit"].clear()
    return live_server.url


@pytest.fixture
def alice_token(alice, portal):
    give(alice, 25)
    return services.token_create(user=alice, name="cli", scope="launch", days=30)[1]


class Cli:
    """Runs `devcloud` (python -m portal.cli) in a fresh process with XDG_CONFIG_HOME=`home`."""

    def __init__(self, home: Path, path_prefix: str = ""):
        self.home = home
        self.path_prefix = path_prefix

    def __call__(
        self, *args: str, input: str | None = None, env: dict | None = None, detached: bool = False
    ) -> subprocess.CompletedProcess:
        """Run it; `detached` runs it in a session of its own, without a controlling terminal (as in CI)."""
        environment = {
            key: value for key, value in os.environ.items() if key not in ("DEVCLOUD_URL", "DEVCLOUD_TOKEN")
        }
        environment["XDG_CONFIG_HOME"] = str(self.home)
        if self.path_prefix:
            environment["PATH"] = f"{self.path_prefix}:{environment.get('PATH', '')}"
        environment.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "portal.cli", *args],
            check=False,
            cwd=REPO,
            env=environment,
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=detached,
        )


@pytest.fixture
def devcloud(tmp_path):
    return Cli(tmp_path / "config")


@pytest.fixture
def portal_with_gateway(gateway, live_server, settings):  # noqa: F811  (the gateway fixture)
    """The live portal, pointing people at the session's real gateway and publishing its host key."""
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "127.0.0.1", gateway.port
    settings.SSH_GATEWAY_HOST_KEY = str(gateway.host_key)
    settings.ALLOWED_HOSTS = ["*"]
    return live_server.url


@pytest.fixture
def ssh_agent():
    """ssh_agent(key) -> SSH_AUTH_SOCK of a fresh ssh-agent holding `key`, as a CI job's agent step."""
    directory = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp"))
    socket_path = directory / "sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)

    def holding(key) -> str:
        deadline = time.monotonic() + 10
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(
            ["ssh-add", "-q", str(key.private)],
            env={"PATH": os.environ["PATH"], "SSH_AUTH_SOCK": str(socket_path)},
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        return str(socket_path)

    yield holding
    agent.terminate()
    agent.wait(timeout=10)
    shutil.rmtree(directory, ignore_errors=True)
