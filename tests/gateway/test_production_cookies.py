"""Production's cookies carry the `__Host-` prefix: a browser accepts such a cookie only with Secure,
Path=/ and no Domain, so code on a lab subdomain cannot toss a cookie of that name at the portal (or at
another lab) to plant a session, a CSRF token or a lab sign-in.

The names come from portal.settings.production, read in a fresh interpreter; the Set-Cookie headers are
what the portal and the gateway send with those settings.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PASSWORD

from .helpers import make_instance, open_until_ticket, redeem_ticket

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("SESSION_COOKIE_NAME", "CSRF_COOKIE_NAME", "GATEWAY_LAB_COOKIE_NAME")
FLAGS = ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_PATH", "CSRF_COOKIE_PATH")
DOMAINS = ("SESSION_COOKIE_DOMAIN", "CSRF_COOKIE_DOMAIN")


@pytest.fixture(scope="module")
def production():
    """The cookie settings portal.settings.production ends up with."""
    script = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        f"print(json.dumps({{n: getattr(s, n, None) for n in {NAMES + FLAGS + DOMAINS!r}}}))"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "DJANGO_SETTINGS_MODULE": "portal.settings.production",
        "SECRET_KEY": "p" * 64,
        "DATABASE_URL": "postgres://devcloud@db.internal:5432/devcloud",
        # What production refuses to start without (portal/settings/production.py, unsafe_settings).
        "SITE_URL": "https://portal.example.com",
        "ALLOWED_HOSTS": "portal.example.com",
        "GATEWAY_LAB_URL": "https://{instance_id}.lab.example.com",
        "GATEWAY_AUTH_SECRET": "g" * 40,
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_production_names_every_host_only_cookie_with_the_host_prefix(production):
    for name in NAMES:
        assert (production[name] or "").startswith("__Host-"), name
    assert production["SESSION_COOKIE_SECURE"] and production["CSRF_COOKIE_SECURE"]
    assert production["SESSION_COOKIE_PATH"] == production["CSRF_COOKIE_PATH"] == "/"
    assert production["SESSION_COOKIE_DOMAIN"] is None and production["CSRF_COOKIE_DOMAIN"] is None


@pytest.fixture
def production_cookies(settings, production):
    for name in NAMES + FLAGS + DOMAINS:
        setattr(settings, name, production[name])
    settings.GATEWAY_LAB_URL = "https://{instance_id}.lab.example.com"


def host_cookie_rules_hold(set_cookie: str) -> bool:
    """What a browser requires of a `__Host-` cookie before it stores it."""
    attributes = [part.strip().lower() for part in set_cookie.split(";")[1:]]
    return "secure" in attributes and "path=/" in attributes and not any(
        a.startswith("domain=") for a in attributes
    )


def test_the_portal_sets_prefixed_session_and_csrf_cookies_a_browser_accepts(
    client, alice, production_cookies, production
):
    page = client.get("/accounts/login/", secure=True)
    csrf = page.cookies[production["CSRF_COOKIE_NAME"]]
    signed_in = client.post(
        "/accounts/login/",
        {"username": alice.email, "password": PASSWORD, "csrfmiddlewaretoken": csrf.value},
        secure=True,
    )

    session = signed_in.cookies[production["SESSION_COOKIE_NAME"]]
    for cookie in (csrf, session):
        assert cookie.key.startswith("__Host-")
        assert host_cookie_rules_hold(cookie.OutputString())


def test_the_lab_host_sets_only_prefixed_cookies_a_browser_accepts(
    client, alice, image, jupyterlab, portal_server, production_cookies, production
):
    endpoint, token = jupyterlab
    lab = make_instance(alice, image, endpoint=endpoint, token=token)
    client.force_login(alice)
    session_key = client.cookies[production["SESSION_COOKIE_NAME"]].value

    ticket_url, handshake_cookies = open_until_ticket(portal_server, session_key, lab.id)
    redeemed = redeem_ticket(portal_server, ticket_url, dict(handshake_cookies))

    assert redeemed.status_code == 302
    assert all(name.startswith("__Host-") for name in handshake_cookies)
    set_cookies = redeemed.headers.get_list("set-cookie")
    assert set_cookies and all(c.startswith("__Host-") and host_cookie_rules_hold(c) for c in set_cookies)
    (lab_cookie,) = [c for c in set_cookies if c.startswith(production["GATEWAY_LAB_COOKIE_NAME"] + "=")]
    assert "httponly" in lab_cookie.lower()
