"""The portal as it runs for real, on loopback, for the browser journey.

uvicorn serves portal.asgi (the pages and the JupyterLab gateway) in a subprocess, with collected static
files (whitenoise serves them as in production, so pages are styled), against the test database. Its
environment, shared with the Celery worker, points both at one broker queue of the test's own and at a
local SMTP server: the worker sends the emails, so an in-memory mail backend could not be read here.
"""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from django.db import connections

REPO = Path(__file__).resolve().parents[2]


def collect_static(static_root: Path) -> Path:
    """Runs `manage.py collectstatic` into `static_root` (as a deployment does); returns it.

    Raises AssertionError with the command's output when it fails.
    """
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        check=False,
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings.test", "STATIC_ROOT": str(static_root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"collectstatic failed:\n{result.stdout}\n{result.stderr}"
    return static_root


def stack_env(
    *,
    portal_id: str,
    database_url: str,
    broker_url: str,
    queue: str,
    site_url: str,
    smtp_port: int,
    static_root: Path,
) -> dict[str, str]:
    """The environment of the web process and the worker: same database, queue, portal id and mail server."""
    return {
        "DJANGO_SETTINGS_MODULE": "portal.settings.test",
        "DATABASE_URL": database_url,
        "DEVCLOUD_PORTAL_ID": portal_id,
        "DEVCLOUD_DRIVER": "docker",
        # Generous: JupyterLab starts slowly in a container on a busy two-core machine.
        "READY_TIMEOUT_SECONDS": "150",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "CELERY_BROKER_URL": broker_url,
        "REDIS_URL": broker_url,
        "CELERY_QUEUE": queue,
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(smtp_port),
        # The verification link in the email must lead to this web process.
        "SITE_URL": site_url,
        # Serve the files collected for this run, never a stale var/static from `make run`.
        "STATIC_ROOT": str(static_root),
        "PYTHONUNBUFFERED": "1",
    }


class PortalProcess:
    """`uvicorn portal.asgi:application` on 127.0.0.1:`port`, its output in `log_path`."""

    def __init__(self, *, port: int, env: dict[str, str], log_path: Path):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "PortalProcess":
        """Starts uvicorn and returns once the login page answers 200.

        Raises AssertionError (with the server's output) when it exits or does not answer in time.
        """
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "portal.asgi:application",
                    # As the deploy kit and make run serve it: with the gateway's fast path.
                    "--http",
                    "portal.gateway.fast_path:LabHttpProtocol",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                ],
                cwd=REPO,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"uvicorn exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/accounts/login/", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"uvicorn did not answer within {timeout:.0f}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM (uvicorn closes its connections), then SIGKILL the process group if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def off_the_event_loop(function, *args, **kwargs):
    """Calls `function` in another thread and returns what it returns (or raises what it raises).

    Playwright's sync API keeps an asyncio loop in the test's thread, where Django refuses ORM calls
    (SynchronousOnlyOperation); a short-lived thread has no loop. Its connection is closed afterwards so
    nothing holds the test database open.
    """

    def call():
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()
