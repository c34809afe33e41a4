"""Screenshots of the portal for the README, in docs/screenshots/.

Two sources, because the pictures need different things:

- By default, a running portal (`make run` in another terminal; `make screenshots` runs this script):
  login.png, signup.png and dashboard-phone.png. It creates or refreshes a verified demo developer with
  the early-registrant grant in the portal's database, logs in through the login form, and photographs
  the pages. Safe to run again: the demo user is reused.
- With --journey, the browser journey test (tests/browser/test_journey.py) against its own real stack
  (web process, Celery worker, Docker engine with the CPU image, SMTP): dashboard.png, bonus.png,
  instances.png, launch-progress.png, jupyterlab.png, operator-console-review.png and
  console-dashboard.png, taken as a newcomer and an operator click through. It needs what `make test`
  needs (PostgreSQL, Redis, dockerd, the built CPU image); no `make run` is involved.

Headless Chromium: Playwright drives the system's /usr/bin/chromium and never downloads a browser.

    .venv/bin/python scripts/screenshots.py [--base-url http://127.0.0.1:8000]
    .venv/bin/python scripts/screenshots.py --journey

Exit status 0 when every page answered 200 and was saved (or the journey passed), 1 otherwise (the
other pictures are still saved).
"""

import argparse
import os
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
# The flags that keep Chromium from dialling out on a machine whose network is closed; --no-sandbox
# because this runs as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DEMO_EMAIL = "ada@devcloud.localhost"
LAPTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def demo_user_with_credits() -> tuple[str, str]:
    """Create or refresh the demo developer in the database `make run` uses. Returns (email, password).

    The password is new on every run (nothing keeps it); the grant is given once, through the same
    service a real sign-up uses, so the dashboard shows a real ledger.
    """
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings.dev"
    var_dir = Path(os.environ.get("DEVCLOUD_VAR_DIR") or ROOT / "var").resolve()
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{var_dir / 'devcloud.sqlite3'}")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError
    from django.db import connections
    from django.utils import timezone

    from portal.credits import services
    from portal.credits.models import BonusProgram

    password = secrets.token_urlsafe(16)
    User = get_user_model()
    user = User.objects.filter(email=DEMO_EMAIL).first()
    if user is None:
        user = User.objects.create_user(
            DEMO_EMAIL, password, first_name="Ada", last_name="Lovelace", email_verified_at=timezone.now()
        )
    else:
        user.set_password(password)
        user.email_verified_at = user.email_verified_at or timezone.now()
        user.save(update_fields=["password", "email_verified_at"])
    services.credits_grant_signup(user=user)
    program = BonusProgram.objects.filter(slug="rocm-star").first()
    if program is not None:
        try:
            services.bonus_apply(user=user, program=program, evidence="ROCM-STAR-2026-004217")
        except ValidationError:
            pass  # Already applied on an earlier run: one application per program is the rule.
    connections.close_all()
    return DEMO_EMAIL, password


def shoot(page, url: str, path: Path, problems: list[str]) -> None:
    response = page.goto(url, wait_until="networkidle")
    status = response.status if response is not None else 0
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshots: {path.relative_to(ROOT)}  ({url} answered {status})")
    if status != 200:
        problems.append(f"{url} answered {status}")


def log_in(page, base_url: str, email: str, password: str) -> None:
    """Log in through the login form. Raises RuntimeError with what the page said when it fails."""
    page.goto(f"{base_url}/accounts/login/")
    page.locator('input[name="username"], input[name="email"]').first.fill(email)
    page.locator('input[name="password"]').first.fill(password)
    page.locator('form[method="post"] button[type="submit"]').first.click()
    page.wait_for_load_state("networkidle")
    if "/accounts/login/" in page.url:
        raise RuntimeError(f"login as {email} failed; the page says: {page.inner_text('main')[:500]}")


def journey() -> int:
    """Runs the browser journey test with UPDATE_README_SCREENSHOTS=1; returns pytest's exit status."""
    import subprocess

    env = {**os.environ, "UPDATE_README_SCREENSHOTS": "1"}
    env.setdefault("TEST_DATABASE_NAME", "test_screenshots")
    command = [sys.executable, "-m", "pytest", "tests/browser/test_journey.py", "-q"]
    status = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
    if status == 0:
        print(f"screenshots: the journey's pictures are in {OUT.relative_to(ROOT)}/")
    else:
        print("screenshots: PROBLEM: the journey failed; docs/screenshots/ was not changed", file=sys.stderr)
    return 1 if status else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("SCREENSHOT_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument(
        "--journey",
        action="store_true",
        help="photograph the browser journey test instead of a running portal",
    )
    arguments = parser.parse_args()
    if arguments.journey:
        return journey()
    base_url = arguments.base_url.rstrip("/")

    import httpx
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    try:
        httpx.get(f"{base_url}/accounts/login/", timeout=5)
    except httpx.HTTPError:
        print(
            f"screenshots: nothing answers at {base_url}; start the portal first with `make run`",
            file=sys.stderr,
        )
        return 1

    email, password = demo_user_with_credits()
    OUT.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            visitor = browser.new_page(viewport=LAPTOP)
            shoot(visitor, f"{base_url}/accounts/login/", OUT / "login.png", problems)
            shoot(visitor, f"{base_url}/accounts/signup/", OUT / "signup.png", problems)

            # dashboard.png on a laptop comes from the journey (--journey), with a real approval and charge.
            developer = browser.new_page(viewport=PHONE)
            log_in(developer, base_url, email, password)
            shoot(developer, f"{base_url}/", OUT / "dashboard-phone.png", problems)
        except (PlaywrightError, RuntimeError) as error:
            problems.append(str(error))
        finally:
            browser.close()
    for problem in problems:
        print(f"screenshots: PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
