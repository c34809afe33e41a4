"""A developer opens JupyterLab through the portal in a real browser and runs a cell.

This proves the lab works with the token removed from its page config: its own scripts authenticate
with cookies through the gateway, over HTTP and the kernel websocket. Headless /usr/bin/chromium,
driven by Playwright (which never downloads a browser here).
"""

import os

import pytest
from django.conf import settings

from .helpers import browser as lab_browser
from .helpers import lab_url, session_cookie_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="/usr/bin/chromium is not installed"),
]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def test_it_runs_a_notebook_cell_in_the_browser(client, alice, alice_lab, portal_server):
    from playwright.sync_api import sync_playwright

    session_key = session_cookie_for(client, alice)
    seen_urls: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            context.add_cookies(
                [{"name": settings.SESSION_COOKIE_NAME, "value": session_key, "url": portal_server.url}]
            )
            page = context.new_page()
            page.on("request", lambda request: seen_urls.append(request.url))
            page.on("websocket", lambda ws: seen_urls.append(ws.url))
            page.goto(portal_server.url + lab_url(alice_lab.id, "lab"), timeout=60_000)

            page.locator(".jp-LauncherCard[data-category='Notebook']").first.click(timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell .cm-content").first.click(timeout=60_000)
            # The kernel is connected (over the gateway's websocket) once the notebook reports it idle.
            page.wait_for_selector(
                ".jp-Notebook-ExecutionIndicator[data-status='idle']", state="attached", timeout=60_000
            )
            page.keyboard.type("print(6*7)")
            page.keyboard.press("Shift+Enter")
            output = page.locator(".jp-OutputArea-output").first
            output.wait_for(timeout=60_000)
            text = output.inner_text()
            cookies = context.cookies()
        finally:
            browser.close()
            # The session's JupyterLab serves the other tests: leave no kernel running.
            with lab_browser(portal_server, session_key) as api:
                for kernel in api.get(lab_url(alice_lab.id, "api/kernels")).json():
                    api.delete(lab_url(alice_lab.id, f"api/kernels/{kernel['id']}"))

    assert text.strip() == "42"
    assert any("/api/kernels/" in url and url.startswith("ws://") for url in seen_urls)
    assert not any(alice_lab.jupyter_token in url for url in seen_urls)
    assert not any(alice_lab.jupyter_token in cookie["value"] for cookie in cookies)
