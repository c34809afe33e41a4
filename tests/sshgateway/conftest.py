"""Fixtures for the SSH tests: a real gateway process (manage.py ssh_gateway) on the test database, real
instances of the CPU image on the local Docker engine, key pairs made by ssh-keygen, and the real
OpenSSH client.

The gateway is a separate process reading the test database, so these tests commit what they write
(`transaction=True`). The OpenSSH options go in a config file (-F) because options on the command line
do not reach the jump host's connection; a person's ~/.ssh/config does the same.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.utils import timezone

from portal.accounts import services as accounts
from portal.instances.models import Instance
from provisioning.drivers import driver_for
from tests.conftest import make_kfd_dev_root
from tests.support.docker_instances import (
    docker_portal_fixture,  # noqa: F401  (registers docker_portal)
    make_host,
    make_image,
    make_instance,
)
from tests.support.drivers import start_on
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)
from tests.support.worker import REPO, current_database_url

RENDER_MINORS = [128, 136]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float, process=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode} before listening on {port}")
        time.sleep(0.1)
    raise AssertionError(f"nothing listened on 127.0.0.1:{port} within {timeout}s")


def wait_for_sshd(port: int, timeout: float = 30) -> None:
    """Wait until something on 127.0.0.1:port greets like an SSH server (the engine's proxy accepts
    connections before sshd inside listens)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                if sock.recv(8).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no SSH server answered on 127.0.0.1:{port} within {timeout}s")


@dataclass
class GatewayProcess:
    port: int
    host_key: Path
    log_path: Path
    process: subprocess.Popen

    @property
    def jump(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_gateway(
    tmp: Path, *, port: int | None = None, host_key: Path | None = None, database_url: str | None = None
) -> GatewayProcess:
    """Start `manage.py ssh_gateway` on a free loopback port against the test database (or `database_url`);
    returns once it listens."""
    port = port or free_port()
    host_key = host_key or tmp / "gateway_host_key"
    log_path = tmp / f"gateway-{port}-{time.monotonic_ns()}.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.test",
        "DATABASE_URL": database_url or current_database_url(),
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "ssh_gateway", "--bind", "127.0.0.1", "--port", str(port),
             "--host-key", str(host_key)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    gateway = GatewayProcess(port=port, host_key=host_key, log_path=log_path, process=process)
    try:
        wait_for_port(port, 30, process)
    except AssertionError as error:
        stop_gateway(gateway)
        raise AssertionError(f"{error}\n{gateway.log()}") from None
    return gateway


def stop_gateway(gateway: GatewayProcess) -> None:
    if gateway.process.poll() is None:
        gateway.process.send_signal(signal.SIGTERM)
        try:
            gateway.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait()


@pytest.fixture(scope="session")
def gateway(django_db_setup, tmp_path_factory):
    """The SSH gateway, as `make run` starts it, for the whole session."""
    process = start_gateway(tmp_path_factory.mktemp("ssh-gateway"))
    yield process
    stop_gateway(process)


@dataclass
class KeyPair:
    private: Path
    public_line: str

    @property
    def fingerprint(self) -> str:
        out = subprocess.run(["ssh-keygen", "-lf", str(self.private)], capture_output=True, text=True, check=True)
        return out.stdout.split()[1]


@pytest.fixture
def keygen(tmp_path):
    """keygen("alice-laptop") -> a fresh Ed25519 KeyPair made by ssh-keygen."""

    def make(name: str) -> KeyPair:
        path = tmp_path / "keys" / name
        path.parent.mkdir(exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
        return KeyPair(private=path, public_line=path.with_suffix(".pub").read_text().strip())

    return make


@dataclass
class Ssh:
    """The OpenSSH client with one identity, as a person with that key in ~/.ssh/config would run it."""

    gateway: GatewayProcess
    key: KeyPair
    config: Path

    def args(self, program: str = "ssh") -> list[str]:
        return [program, "-F", str(self.config), "-J", self.gateway.jump]

    def run(self, target: str, *command: str, timeout: float = 60, extra=()) -> subprocess.CompletedProcess:
        """`ssh -J <gateway> developer@<target> command...`; returns the completed process (text)."""
        return subprocess.run(
            [*self.args(), *extra, f"developer@{target}", *command],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def scp(self, source: str, destination: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.args("scp"), source, destination], capture_output=True, text=True, timeout=timeout
        )

    def direct(self, port: int, *command: str) -> subprocess.CompletedProcess:
        """ssh straight to an instance's published sshd, bypassing the gateway (what the instance itself
        accepts)."""
        return subprocess.run(
            ["ssh", "-F", str(self.config), "-p", str(port), "developer@127.0.0.1", *command],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )


@pytest.fixture
def ssh_as(gateway, tmp_path):
    """ssh_as(keypair) -> an Ssh client using only that key, trusting any host key (fresh containers)."""

    def make(key: KeyPair) -> Ssh:
        config = tmp_path / f"ssh_config-{key.private.name}"
        config.write_text(
            "Host *\n"
            f"  IdentityFile {key.private}\n"
            "  IdentitiesOnly yes\n"
            "  IdentityAgent none\n"
            "  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n"
            "  BatchMode yes\n"
            "  LogLevel INFO\n"
            "  ConnectTimeout 20\n"
        )
        return Ssh(gateway=gateway, key=key, config=config)

    return make


def add_key(user, key: KeyPair, name: str):
    return accounts.sshkey_add(user=user, name=name, public_key=key.public_line)


@pytest.fixture
def dev_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("creating device nodes (mknod) needs root")
    return make_kfd_dev_root(tmp_path / "host-dev", RENDER_MINORS)


@pytest.fixture
def host(transactional_db, dev_root):
    return make_host("gpu-ssh-01", dev_root.path, dev_root.render_minors)


@pytest.fixture
def image(transactional_db, cpu_image):
    return make_image(cpu_image)


@pytest.fixture
def launch(docker_portal, host, image):
    """launch(user) -> a RUNNING instance of the CPU image on the real engine, started by the docker
    driver as a launch does, with the owner's keys in it."""

    def make(user, *, minor=128, **fields) -> Instance:
        instance = make_instance(user, image, host, **fields)
        result = start_on(driver_for(host, "docker"), instance, list(host.gpus.filter(render_minor=minor)))
        now = timezone.now()
        Instance.objects.filter(pk=instance.pk).update(
            state=Instance.State.RUNNING,
            step=Instance.Step.READY,
            driver_state={**result.state, "endpoint": result.endpoint},
            ready_at=now,
            metered_until=now,
        )
        instance.refresh_from_db()
        wait_for_sshd(result.state["ssh_port"])
        return instance

    return make
