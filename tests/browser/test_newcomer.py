"""A newcomer's first minutes, exactly as the README tells them: a fresh clone, `make run`, and a browser.

Nothing is prepared behind the portal's back: no fixture adds a host, an image or a user. The clone gets
its own empty var/ (SQLite, embedded Redis), the verification link is read from `make run`'s own output,
and Chromium does the rest: sign up, verify, launch the default image at 1x, run `print(6 * 7)` in a
notebook, stop, and find the charge in the ledger. Once with the Docker engine (a simulated MI300X host
and the CPU image), once with no engine answering (the `local` driver's fallback).

The clone shares this checkout's .venv (a symlink), so `make run` finds its dependencies installed and
goes straight to scripts/run.py; PYTHONPATH makes the clone's own code the code that runs.
"""

import hashlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import PASSWORD
from tests.support.docker_instances import remove_portal_objects
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)
from tests.support.smtp import free_port

from .test_journey import (
    CHROMIUM,
    CHROMIUM_ARGS,
    SECOND,
    VIEWPORT,
    expect_no_error_page,
    run_print_in_a_new_notebook,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="/usr/bin/chromium is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="make run's simulated GPU host makes device nodes (root)"),
    pytest.mark.timeout(600, func_only=True),
]
EMAIL = "newcomer@example.com"
# Long enough at 1x (over 18 s, half a hundredth of a GPU-hour) for the balance to show the charge.
MINIMUM_USE_SECONDS = 24


def fresh_clone(destination: Path) -> Path:
    """The files a `git clone` of this checkout would have, as they are now (tracked and new, not ignored),
    with .venv linked to this checkout's. Returns the clone's root."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in listed)):
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the work tree but not yet in git
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode & 0o777)
    (destination / ".venv").symlink_to(REPO / ".venv")
    return destination


class MakeRun:
    """`make run` in a clone, its output collected line by line."""

    def __init__(self, clone: Path, *, port: int, extra_env: dict[str, str], install: bool = False):
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        self.lines: list[str] = []
        self.started = time.monotonic()
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL", "DEVCLOUD_DRIVER")
        }
        env.update(
            PORT=str(port),
            PYTHONPATH=str(clone),
            # Nothing listens on port 1: make run falls back to its embedded Redis, as on a bare machine.
            REDIS_URL="redis://127.0.0.1:1/0",
            NO_COLOR="1",
            **extra_env,
        )
        # The clone's .venv is this checkout's; `-o <stamp>` keeps make from reinstalling into it from the
        # clone (an editable install would then point at the clone, which the test deletes).
        stamp = hashlib.sha256((clone / "pyproject.toml").read_bytes() + (clone / "constraints.txt").read_bytes())
        keep_venv = [] if install else ["-o", f".venv/.installed-{stamp.hexdigest()[:12]}"]
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", *keep_venv, "run"],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 180) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} did not appear; make run printed:\n{self.output[-6000:]}")

    def wait_until_serving(self, timeout: float = 180) -> float:
        """Seconds from start until the front page answers 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url, timeout=2).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.url} did not answer; make run printed:\n{self.output[-6000:]}")

    def stop(self) -> None:
        """Ctrl-C, as a person stops it; kill whatever is left if it hangs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def portal_id():
    """Containers and volumes the clone's portal makes carry this id, and are removed afterwards."""
    portal_id = f"test-newcomer-{uuid.uuid4().hex[:10]}"
    yield portal_id
    remove_portal_objects(portal_id)


@pytest.fixture
def make_run(tmp_path, portal_id):
    clone = fresh_clone(tmp_path / "devcloud")
    started: list[MakeRun] = []

    def start(**extra_env) -> MakeRun:
        run = MakeRun(clone, port=free_port(), extra_env={"DEVCLOUD_PORTAL_ID": portal_id, **extra_env})
        started.append(run)
        return run

    yield start
    for run in started:
        run.stop()
    artifacts = REPO / "tests" / "artifacts" / "newcomer"
    artifacts.mkdir(parents=True, exist_ok=True)
    for number, run in enumerate(started, start=1):
        (artifacts / f"make-run-{number}.log").write_text(run.output)


def newcomer_journey(run: MakeRun, browser, *, email: str = EMAIL, marks: dict | None = None) -> None:
    """Sign up, verify with the link make run printed, launch the default image at 1x, print(6 * 7) in a
    notebook, stop, and see the charge in the ledger: clicks only, as the README says. `marks`, when
    given, gets the time.monotonic() of the moment the cell printed 42 ("cell")."""
    from playwright.sync_api import expect

    base = run.url.rstrip("/")
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30 * SECOND)
    page = context.new_page()

    page.goto(run.url)
    expect(page.get_by_test_id("front-page")).to_be_visible()
    expect_no_error_page(page)
    page.get_by_test_id("front-signup").click()
    page.fill("#id_email", email)
    page.fill("#id_password", PASSWORD)
    page.fill("#id_password_confirm", PASSWORD)
    page.get_by_role("button", name="Sign up", exact=True).click()
    # The same answer as for an address that has an account: read the email; no session yet.
    expect(page.get_by_role("heading", name="Check your email")).to_be_visible()

    link = run.wait_for(rf"(http://127\.0\.0\.1:{run.port}/accounts/verify/\S+)", timeout=90).group(1)
    page.goto(link)
    # Only the person who set the password confirms: type it on the link's page and press its button (a
    # GET changes nothing: mail scanners fetch links); that also logs in.
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name=re.compile(r"^Confirm")).click()
    page.wait_for_url(f"{base}/")
    page.goto(run.url)
    expect(page.get_by_test_id("balance").first).to_have_text("25.00 GPU-hours")

    page.get_by_role("link", name="Instances", exact=True).first.click()
    expect_no_error_page(page)
    expect(page.get_by_test_id("simulated-note")).to_be_visible()
    # The default image is preselected once it is ready; while it is being built the page says how far
    # it got and reloads itself.
    launch = page.get_by_test_id("launch")
    expect(launch).to_be_enabled(timeout=300 * SECOND)
    page.get_by_test_id("size-1x").locator("input").check()
    launch.click()
    page.wait_for_url(re.compile(rf"^{re.escape(base)}/instances/[0-9a-f-]{{36}}/$"))
    instance_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    expect(page.get_by_test_id("simulated-note")).to_be_visible()
    open_lab = page.locator("#open-lab")
    try:
        expect(open_lab).to_be_visible(timeout=180 * SECOND)
    except AssertionError:
        raise AssertionError(f"never ready; the page says: {page.inner_text('main')}") from None
    ready = time.monotonic()

    with context.expect_page() as opened:
        open_lab.click()
    lab = opened.value
    run_print_in_a_new_notebook(lab, instance_id)
    if marks is not None:
        marks["cell"] = time.monotonic()
    lab.close()
    page.wait_for_timeout(max(0.0, MINIMUM_USE_SECONDS - (time.monotonic() - ready)) * SECOND)

    page.bring_to_front()
    page.locator("#stop-form button").click()
    expect(page.locator("#state-pill")).to_have_text("Stopped", timeout=90 * SECOND)

    page.goto(run.url)
    short_id = instance_id[:8]
    # The meter tick charges a running instance as it goes and the stop charges the rest: a run that
    # spans a tick has a row of each, every one of them Usage.
    usage_rows = page.get_by_test_id("ledger").locator("tr", has_text=f"instance {short_id}")
    expect(usage_rows.first).to_contain_text("Usage")
    for row in usage_rows.all():
        expect(row).to_contain_text("Usage")
    balance = page.get_by_test_id("balance").first.inner_text()
    assert float(balance.split()[0]) < 25, f"the balance is still {balance!r} after the run"
    context.close()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def test_it_takes_a_newcomer_from_make_run_to_a_notebook_cell_on_docker_and_starts_again_quickly(
    make_run, browser, cpu_image
):
    first = make_run()
    first.wait_until_serving()
    first.wait_for(r"Docker engine found")
    first.wait_for(r"GPU host simulated-mi300x: SIMULATED 8x MI300X")
    newcomer_journey(first, browser)
    first.stop()
    assert first.lines[-1].endswith("| stopped"), first.output[-3000:]

    second = make_run()
    seconds_to_url = second.wait_until_serving()
    assert seconds_to_url < 20, f"the second make run took {seconds_to_url:.1f} s to serve its URL"
    second.wait_for(r"DevCloud is running at")
    assert "building it in the background" not in second.output
    assert "Registered this machine" not in second.output, "the second run registered the host again"


def test_it_takes_a_newcomer_from_make_run_to_a_notebook_cell_without_a_docker_engine(make_run, browser):
    run = make_run(DOCKER_HOST="unix:///nonexistent/docker.sock")
    run.wait_until_serving()
    run.wait_for(r"No Docker engine answered: instances will run with the `local` driver")
    run.wait_for(r"GPU host simulated-mi300x: SIMULATED 8x MI300X")
    newcomer_journey(run, browser)

