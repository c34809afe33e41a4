"""The settings page shows the exact ssh command and a ~/.ssh/config block, and both work as shown."""

import html
import re
import shlex
import subprocess

import pytest
from django.test import Client

from .conftest import add_key

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300, func_only=True)]


def shown(page: str, testid: str) -> str:
    match = re.search(rf'data-testid="{testid}"[^>]*><code>(.*?)</code>', page, re.S)
    assert match, f"no {testid} on the page"
    return html.unescape(match.group(1))


@pytest.fixture
def page_of(settings, gateway):
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "127.0.0.1", gateway.port

    def fetch(user) -> str:
        browser = Client()
        browser.force_login(user)
        response = browser.get("/accounts/settings/")
        assert response.status_code == 200
        return response.content.decode()

    return fetch


def test_the_command_on_the_settings_page_works_as_shown(alice, keygen, ssh_as, launch, page_of):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)

    command = shown(page_of(alice), "ssh-command")
    argv = shlex.split(command)
    result = subprocess.run(
        [argv[0], "-F", str(ssh_as(key).config), *argv[1:], "echo", "connected"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )

    assert command == f"ssh -J 127.0.0.1:{ssh_as(key).gateway.port} developer@{instance.short_id}"
    assert result.stdout.strip() == "connected", result.stderr


def test_the_config_block_on_the_settings_page_works_as_shown(alice, keygen, ssh_as, launch, page_of, tmp_path):
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    block = shown(page_of(alice), "ssh-config")
    config = tmp_path / "config"
    # The person's own identity settings come after the block, as in a real ~/.ssh/config.
    config.write_text(block + "\n" + ssh_as(key).config.read_text())

    result = subprocess.run(
        ["ssh", "-F", str(config), f"devcloud-{instance.short_id}", "echo", "connected"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )

    assert result.stdout.strip() == "connected", result.stderr


def test_the_page_says_when_the_local_driver_has_no_ssh(alice, page_of, settings):
    settings.DEVCLOUD_DRIVER = "local"

    page = page_of(alice)

    assert "which has no SSH" in page
