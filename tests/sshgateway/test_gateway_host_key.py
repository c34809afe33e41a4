"""The gateway writes the public half of its host key beside it, and the settings page shows that key
(fingerprint and known_hosts line) or says plainly that the gateway was never started."""

import html
import re
import subprocess

import pytest
from django.test import Client

from portal.sshgateway.server import load_host_key

pytestmark = pytest.mark.django_db


def _ssh_keygen_fingerprint(path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_it_writes_the_public_key_beside_the_host_key_it_makes(tmp_path):
    path = tmp_path / "gateway_host_key"
    key = load_host_key(str(path))
    public = tmp_path / "gateway_host_key.pub"
    assert public.read_text().split()[0] == "ssh-ed25519"
    assert _ssh_keygen_fingerprint(public) == _ssh_keygen_fingerprint(path) == key.get_fingerprint("sha256")
    assert public.stat().st_mode & 0o777 == 0o644 and path.stat().st_mode & 0o777 == 0o600


def test_it_rewrites_a_stale_public_key_when_it_loads_its_host_key(tmp_path):
    path = tmp_path / "gateway_host_key"
    load_host_key(str(path))
    public = tmp_path / "gateway_host_key.pub"
    public.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl old\n")
    load_host_key(str(path))
    assert _ssh_keygen_fingerprint(public) == _ssh_keygen_fingerprint(path)


def _settings_page(user) -> str:
    browser = Client()
    browser.force_login(user)
    response = browser.get("/accounts/settings/")
    assert response.status_code == 200
    return response.content.decode()


def _shown(page: str, testid: str) -> str:
    match = re.search(rf'data-testid="{testid}"[^>]*>(?:<code>)?(.*?)(?:</code>)?</(?:pre|code|p)>', page, re.DOTALL)
    assert match, f"no {testid} on the page"
    return html.unescape(match.group(1)).strip()


def test_the_settings_page_shows_the_gateway_host_key_to_copy_into_known_hosts(alice, settings, tmp_path):
    path = tmp_path / "gateway_host_key"
    load_host_key(str(path))
    settings.SSH_GATEWAY_HOST_KEY = str(path)
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "ssh.devcloud.example", 2200
    page = _settings_page(alice)
    blob = " ".join((tmp_path / "gateway_host_key.pub").read_text().split()[:2])
    assert _shown(page, "ssh-known-hosts") == f"[ssh.devcloud.example]:2200 {blob}"
    assert _shown(page, "ssh-host-key-fingerprint") == _ssh_keygen_fingerprint(path)


def test_the_settings_page_says_when_the_gateway_was_never_started(alice, settings, tmp_path):
    settings.SSH_GATEWAY_HOST_KEY = str(tmp_path / "never-made")
    page = _settings_page(alice)
    assert "the operator has not started it" in _shown(page, "ssh-host-key-missing")
    assert 'data-testid="ssh-known-hosts"' not in page
