"""What a newcomer does, in a real browser against the real portal: sign up by email, confirm through the
emailed link, see the 25 free GPU-hours, apply for ROCm Star; an operator approves in the console; the
newcomer sees 75 GPU-hours, launches the CPU image, runs a notebook cell in JupyterLab, stops, and finds
the charge in the ledger.

Headless /usr/bin/chromium driven by Playwright (which never downloads a browser here). Each page is
photographed into tests/artifacts/journey/; with UPDATE_README_SCREENSHOTS=1 (scripts/screenshots.py
--journey) the README's pictures in docs/screenshots/ are replaced by this run's.
"""

import os
import re
import shutil
from pathlib import Path

import pytest
from django.utils import timezone

from portal.console.services import sample_record
from portal.credits.models import LedgerEntry, hours
from portal.instances.models import Instance
from tests.conftest import PASSWORD

from .stack import off_the_event_loop

pytestmark = [
    pytest.mark.slow,
    # Committed rows: the web process and the worker read and write the same test database.
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="/usr/bin/chromium is not installed"),
    # A run takes about a minute here; each step's wait is bounded. Setup (a cold image build) is not counted.
    pytest.mark.timeout(330, func_only=True),
]

CHROMIUM = "/usr/bin/chromium"
# No sandbox because tests run as root; the rest keep Chromium from dialling out of a closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
# Artifact name -> the README picture it becomes.
README_PICTURES = {
    "dashboard-charged": "dashboard.png",
    "bonus-applied": "bonus.png",
    "operator-review": "operator-console-review.png",
    "instances": "instances.png",
    "launch-progress": "launch-progress.png",
    "jupyterlab": "jupyterlab.png",
    "console-dashboard": "console-dashboard.png",
}
EMAIL = "alice@example.com"
CERTIFICATE_ID = "ROCM-STAR-2026-004217"
SECOND = 1000  # Playwright counts milliseconds.
MINIMUM_USE_SECONDS = 24


class Camera:
    """Saves numbered screenshots of pages into the artifacts directory."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.taken: dict[str, Path] = {}

    def shoot(self, page, name: str, *, full_page: bool = False) -> Path:
        path = self.directory / f"{len(self.taken) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        self.taken[name] = path
        return path


def balance_of(page) -> str:
    return page.get_by_test_id("balance").first.inner_text()


def expect_no_error_page(page) -> None:
    """Fails on a server error page or a page whose stylesheet did not load (an unstyled page)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
    from playwright.sync_api import expect

    # Through expect, which waits: a page that reloads itself (the launch page while an image builds) has
    # no title for a moment.
    expect(page).to_have_title(re.compile(r"\S"))
    assert "Server Error" not in page.title(), page.content()[:2000]
    # Chromium refuses to read the rules of a sheet that is still loading (SecurityError), so a sheet
    # counts once it has loaded rules; the page has a few seconds to get there.
    try:
        page.wait_for_function(
            "() => Array.from(document.styleSheets).some(sheet => {"
            " try { return sheet.cssRules.length > 0 } catch (loading) { return false } })",
            timeout=10_000,
        )
    except PlaywrightTimeoutError:
        raise AssertionError(f"{page.url} rendered without its stylesheet") from None


class LabTraffic:
    """Records, for every page of a browser context, the requests that failed or were answered with an
    error, and websockets that closed or broke: what to look at when JupyterLab misbehaves."""

    def __init__(self, context):
        self.lines: list[str] = []
        context.on(
            "requestfailed",
            lambda request: self.lines.append(f"{request.method} {request.url} failed: {request.failure}"),
        )
        context.on("response", self._response)
        context.on("page", lambda page: page.on("websocket", self._websocket))
        context.on(
            "console",
            lambda message: message.type == "error" and self.lines.append(f"console error: {message.text}"),
        )

    def _response(self, response):
        if response.status >= 400:
            self.lines.append(f"{response.request.method} {response.url} answered {response.status}")

    def _websocket(self, ws):
        ws.on("close", lambda closed: self.lines.append(f"websocket {closed.url} closed"))
        ws.on("socketerror", lambda error: self.lines.append(f"websocket {ws.url} error: {error}"))

    def __str__(self):
        return "\n".join(self.lines) or "(nothing)"


# How often a lab that loaded only in part is loaded again before the test gives up.
LAB_RELOADS = 2


def open_the_launcher(lab) -> None:
    """Wait for JupyterLab's launcher, and load the lab again, as a person would, when it came up in part.

    Chromium fails the requests it has in flight with ERR_NETWORK_CHANGED whenever the machine's network
    interfaces change, which they do each time Docker makes or removes an instance's network (other
    tests do so all along); a theme stylesheet lost that way leaves JupyterLab's "Error Loading Theme"
    dialog over the page. Nothing of the portal is at fault then, and loading the page again mends it."""
    card = lab.locator(".jp-LauncherCard[data-category='Notebook']").first
    broken = lab.locator(".jp-Dialog[aria-label^='Error Loading']")
    for _ in range(LAB_RELOADS):
        card.wait_for(state="visible", timeout=90 * SECOND)
        lab.wait_for_timeout(1000)  # the theme's error dialog, if any, comes with the launcher
        if broken.count() == 0:
            return
        lab.reload()


def run_print_in_a_new_notebook(lab, instance_id) -> None:
    """In a freshly opened JupyterLab: a new Python 3 notebook from the launcher, `print(6 * 7)` typed
    into its cell and run with Shift+Enter. Returns once the output reads 42; raises AssertionError or
    Playwright's TimeoutError otherwise. JupyterLab is slow to start on a small machine, hence the waits."""
    from playwright.sync_api import expect

    lab.wait_for_url(re.compile(rf"/instances/{instance_id}/lab/"), timeout=90 * SECOND)
    open_the_launcher(lab)
    lab.locator(".jp-LauncherCard[data-category='Notebook']").first.click(timeout=90 * SECOND)
    # The kernel is connected (over the gateway's websocket) once the status bar names it and says Idle.
    # A cell run before that is skipped: the notebook's session has no kernel yet.
    kernel_status = lab.get_by_role("contentinfo").get_by_role(
        "button", name=re.compile(r"^Python 3 \(ipykernel\) \| Idle$")
    )
    expect(kernel_status).to_be_visible(timeout=90 * SECOND)
    # Focus the cell only now: while the kernel starts, the lab moves the focus around.
    editor = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.click()
    lab.keyboard.type("print(6 * 7)")
    expect(editor).to_have_text("print(6 * 7)")
    lab.keyboard.press("Shift+Enter")
    expect(lab.locator(".jp-OutputArea-output").first).to_have_text("42", timeout=60 * SECOND)
    # JupyterLab asks once whether to fetch Jupyter news; answer as a person would, so the picture shows
    # the notebook rather than the question.
    no_news = lab.get_by_role("button", name="No", exact=True)
    if no_news.is_visible():
        no_news.click()
        expect(no_news).to_be_hidden()


def test_it_walks_a_newcomer_from_sign_up_to_a_notebook_cell_and_the_charge_in_the_ledger(
    portal_stack, gpu_host, cpu_catalog, olivia, artifacts
):
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    base = portal_stack.url
    camera = Camera(artifacts)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            developer = browser.new_context(viewport=VIEWPORT)
            developer.set_default_timeout(30 * SECOND)
            page = developer.new_page()

            # 1. Sign up by email.
            page.goto(f"{base}/accounts/signup/")
            expect_no_error_page(page)
            page.fill("#id_email", EMAIL)
            page.fill("#id_password", PASSWORD)
            page.fill("#id_password_confirm", PASSWORD)
            camera.shoot(page, "signup")
            page.get_by_role("button", name="Sign up", exact=True).click()
            # The same answer as for an address that has an account: read the email; no session yet.
            expect(page.get_by_role("heading", name="Check your email")).to_be_visible()
            camera.shoot(page, "signup-check-email")

            # 2. The worker emails the confirmation link over SMTP; open it, type the password, confirm
            # (which logs in).
            email = portal_stack.mailbox.wait_for(lambda message: EMAIL in message.rcpt_tos, timeout=60)
            [link] = [link for link in email.links() if "/accounts/verify/" in link]
            assert link.startswith(f"{base}/accounts/verify/"), link
            page.goto(link)
            page.fill("#id_password", PASSWORD)
            page.get_by_role("button", name="Confirm my email address").click()
            page.wait_for_url(f"{base}/")

            # 3. Confirmed: the early-registrant grant.
            expect(page.get_by_test_id("balance").first).to_have_text("25.00 GPU-hours")
            expect(page.get_by_test_id("unverified-note")).to_have_count(0)
            expect_no_error_page(page)
            camera.shoot(page, "dashboard-25")

            # 4. Apply for ROCm Star with a certificate ID.
            page.get_by_role("link", name="Apply for bonus GPU-hours").click()
            page.wait_for_url(f"{base}/bonus/")
            page.select_option("#id_program", label="ROCm Star developer certificate")
            page.fill("#id_evidence", CERTIFICATE_ID)
            page.get_by_role("button", name="Apply", exact=True).click()
            application_row = page.get_by_test_id("applications").locator("tr", has_text=CERTIFICATE_ID)
            expect(application_row).to_contain_text("Pending")
            expect_no_error_page(page)
            camera.shoot(page, "bonus-applied", full_page=True)

            # 5. An operator, in a browser of their own, approves it in the console.
            operator = browser.new_context(viewport=VIEWPORT)
            operator.set_default_timeout(30 * SECOND)
            console = operator.new_page()
            console.goto(f"{base}/admin/login/")
            console.fill("#id_username", olivia.email)
            console.fill("#id_password", PASSWORD)
            console.get_by_role("button", name="Log in").click()
            console.wait_for_url(f"{base}/admin/")
            console.get_by_role("link", name="Bonus applications").first.click()
            console.get_by_role("link", name=EMAIL).click()
            expect(console.get_by_test_id("evidence")).to_have_text(CERTIFICATE_ID)
            expect(console.locator("#id_approve-hours")).to_have_value("50.00")
            expect_no_error_page(console)
            camera.shoot(console, "operator-review")
            console.locator("input[name=_approve]").click()
            expect(console.locator(".messagelist")).to_contain_text(
                f"Approved 50.00 GPU-hours of ROCm Star developer certificate for {EMAIL}."
            )
            camera.shoot(console, "operator-approved")

            # 6. The newcomer reloads: 25 + 50. The decision was emailed too.
            page.goto(f"{base}/")
            expect(page.get_by_test_id("balance").first).to_have_text("75.00 GPU-hours")
            camera.shoot(page, "dashboard-75")
            decision = portal_stack.mailbox.wait_for(
                lambda message: EMAIL in message.rcpt_tos and "approved" in message.subject, timeout=60
            )
            assert "50.00 GPU-hours added" in decision.subject

            # 7. Launch the CPU image at 1x and watch it come up without reloading.
            page.get_by_role("link", name="Instances", exact=True).first.click()
            page.wait_for_url(f"{base}/instances/")
            expect_no_error_page(page)
            page.get_by_test_id("size-1x").locator("input").check()
            page.get_by_test_id("image-cpu").locator("input").check()
            camera.shoot(page, "instances")
            page.get_by_test_id("launch").click()
            page.wait_for_url(re.compile(rf"^{re.escape(base)}/instances/[0-9a-f-]{{36}}/$"))
            instance_id = page.url.rstrip("/").rsplit("/", 1)[-1]
            # Photograph it mid-way (starting the container or waiting for JupyterLab) if the poll shows that.
            open_lab = page.locator("#open-lab")
            page.wait_for_selector(
                "#steps li.current[data-step=starting], #steps li.current[data-step=waiting], #open-lab:not([hidden])",
                timeout=150 * SECOND,
            )
            camera.shoot(page, "launch-progress")
            # Read in one go, so a poll landing in between cannot mix two states: while a step is still
            # under way, there is no "Open JupyterLab" to click.
            under_way, link_display = page.evaluate(
                "() => [document.querySelector('#steps li.current') !== null,"
                " getComputedStyle(document.getElementById('open-lab')).display]"
            )
            assert not under_way or link_display == "none", "Open JupyterLab shows before the lab is ready"
            # Only the page's own polling can reveal the link: nothing here reloads it.
            try:
                expect(open_lab).to_be_visible(timeout=150 * SECOND)
            except AssertionError:
                raise AssertionError(f"never ready; the page says: {page.inner_text('main')}") from None
            expect(page.locator("#state-pill")).to_have_text("Running")
            off_the_event_loop(sample_record)  # A beat sample while it runs, for the console's charts.
            camera.shoot(page, "instance-running")

            # 8. Open JupyterLab through the gateway, make a notebook and run a cell.
            traffic = LabTraffic(developer)
            try:
                with developer.expect_page() as opened:
                    open_lab.click()
                lab = opened.value
                run_print_in_a_new_notebook(lab, instance_id)
            except (AssertionError, PlaywrightError) as error:
                for open_page in developer.pages:
                    if f"/instances/{instance_id}/lab/" in open_page.url:
                        camera.shoot(open_page, "jupyterlab-failed")
                raise AssertionError(f"{error}\nWhat the lab's page saw go wrong:\n{traffic}") from None
            camera.shoot(lab, "jupyterlab")
            lab.close()
            # Use it long enough to cost a hundredth of a GPU-hour (18 s), so the charge reads as one.
            ready_at = off_the_event_loop(lambda: Instance.objects.get(pk=instance_id).ready_at)
            used = (timezone.now() - ready_at).total_seconds()
            page.wait_for_timeout(max(0.0, MINIMUM_USE_SECONDS - used) * SECOND)

            # 9. Back on the instance page: stop, and watch it reach stopped.
            page.bring_to_front()
            page.locator("#stop-form button").click()
            page.wait_for_url(f"{base}/instances/{instance_id}/")
            expect(page.locator("#state-pill")).to_have_text("Stopped", timeout=90 * SECOND)
            expect(open_lab).to_be_hidden()
            expect(page.locator("#stop-form")).to_be_hidden()
            camera.shoot(page, "instance-stopped")

            # 10. The charge is in the ledger on the dashboard.
            usage = off_the_event_loop(
                lambda: LedgerEntry.objects.get(
                    kind=LedgerEntry.Kind.USAGE, idempotency_key__startswith=f"usage:{instance_id}:"
                )
            )
            stopped = off_the_event_loop(Instance.objects.get, pk=instance_id)
            assert usage.gpu_seconds < 0 and -usage.gpu_seconds == stopped.charged_gpu_seconds
            page.goto(f"{base}/")
            usage_row = page.get_by_test_id("ledger").locator("tr", has_text=f"instance {stopped.short_id}")
            expect(usage_row).to_contain_text("Usage")
            charged_hours = usage_row.locator("td").nth(3).inner_text()
            assert charged_hours == hours(usage.gpu_seconds)
            assert float(charged_hours) < 0, charged_hours
            expect(page.get_by_test_id("balance").first).to_have_text(
                f"{hours(75 * 3600 + usage.gpu_seconds)} GPU-hours"
            )
            camera.shoot(page, "dashboard-charged", full_page=True)

            # The operator's dashboard with its charts, after a second beat sample.
            off_the_event_loop(sample_record)
            console.goto(f"{base}/console/")
            expect_no_error_page(console)
            expect(console.locator("svg").first).to_be_visible()
            camera.shoot(console, "console-dashboard", full_page=True)
        finally:
            browser.close()

    if os.environ.get("UPDATE_README_SCREENSHOTS") == "1":
        for name, picture in README_PICTURES.items():
            shutil.copyfile(camera.taken[name], DOCS_SCREENSHOTS / picture)
