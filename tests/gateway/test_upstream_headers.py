"""What the instance sees of the browser's request, and what the browser sees of the instance's answer.

The instance is untrusted (its owner controls the container), so it is a stand-in server here that
records what reaches it and answers with whatever a hostile or buggy JupyterLab might send.
"""

import gzip
import secrets
import uuid

import pytest
from django.conf import settings

from .helpers import HTML, RecordingUpstream, browser, lab_url, make_instance, session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def upstream():
    with RecordingUpstream(instance_id=UPSTREAM_ID) as server:
        yield server


UPSTREAM_ID = uuid.uuid4()


@pytest.fixture
def alice_fake_lab(alice, image, upstream):
    return make_instance(
        alice, image, endpoint=upstream.endpoint, token=secrets.token_hex(24), instance_id=UPSTREAM_ID
    )


def test_it_never_sends_the_portal_session_upstream(client, alice, alice_fake_lab, upstream, portal_server):
    session_key = session_cookie_for(client, alice)
    csrf = "c" * 32
    with browser(portal_server, session_key) as alice_browser:
        alice_browser.cookies.set(settings.CSRF_COOKIE_NAME, csrf)
        alice_browser.cookies.set("_xsrf", "jupyter-own-cookie")
        response = alice_browser.get(lab_url(alice_fake_lab.id, "api/status"))

    assert response.status_code == 200
    (seen,) = upstream.requests
    everything = repr(seen)
    assert session_key not in everything
    assert csrf not in everything
    assert f"{settings.SESSION_COOKIE_NAME}=" not in everything
    # Jupyter's own cookie still gets there.
    assert seen["cookies"] == ["_xsrf=jupyter-own-cookie"]


def test_it_authenticates_upstream_with_the_instance_token(
    client, alice, alice_fake_lab, upstream, portal_server
):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        alice_browser.get(
            lab_url(alice_fake_lab.id, "api/status"), headers={"Authorization": "token guessed"}
        )

    (seen,) = upstream.requests
    assert seen["headers"]["authorization"] == f"token {alice_fake_lab.jupyter_token}"


def test_it_forwards_the_path_query_and_body_unchanged(
    client, alice, alice_fake_lab, upstream, portal_server
):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        alice_browser.put(
            lab_url(alice_fake_lab.id, "api/contents/a%20b%2Fc.txt") + "?type=file&x=%2F",
            content=b"payload bytes",
            headers={"Content-Type": "application/octet-stream"},
        )

    (seen,) = upstream.requests
    assert seen["method"] == "PUT"
    assert seen["path"] == f"/instances/{alice_fake_lab.id}/lab/api/contents/a%20b%2Fc.txt?type=file&x=%2F"
    assert seen["body"] == b"payload bytes"


def test_it_rewrites_the_origin_to_the_instance_own(client, alice, alice_fake_lab, upstream, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        alice_browser.post(
            lab_url(alice_fake_lab.id, "api/kernels"), json={}, headers={"Origin": portal_server.url}
        )

    (seen,) = upstream.requests
    assert seen["headers"]["origin"] == upstream.endpoint
    assert seen["headers"]["host"] == upstream.endpoint.removeprefix("http://")


def test_it_keeps_no_cookies_between_users(
    client, alice, bob, image, alice_fake_lab, upstream, portal_server
):
    # The gateway's one shared HTTP client must not remember a cookie from Alice's answer for Bob.
    upstream.responses["api/me"] = (200, [("Set-Cookie", f"_xsrf=alice-only; Path={upstream.prefix}")], b"{}")
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        assert alice_browser.get(lab_url(alice_fake_lab.id, "api/me")).status_code == 200
        alice_browser.cookies.clear()
        alice_browser.cookies.set(settings.SESSION_COOKIE_NAME, session_cookie_for(client, alice))
        assert alice_browser.get(lab_url(alice_fake_lab.id, "api/status")).status_code == 200

    assert upstream.requests[1]["cookies"] == []


def test_it_keeps_an_instance_from_setting_portal_or_site_wide_cookies(
    client, alice, alice_fake_lab, upstream, portal_server
):
    prefix = upstream.prefix
    upstream.responses["api/status"] = (
        200,
        [
            ("Set-Cookie", f"{settings.SESSION_COOKIE_NAME}=planted; Path=/"),
            ("Set-Cookie", f"{settings.CSRF_COOKIE_NAME}=planted; Path={prefix}"),
            ("Set-Cookie", "everywhere=1; Path=/"),
            ("Set-Cookie", "elsewhere=1; Path=/instances/"),
            ("Set-Cookie", f"parent=1; Domain=127.0.0.1; Path={prefix}"),
            ("Set-Cookie", f"_xsrf=fine; Path={prefix}"),
            ("Set-Cookie", "relative=fine"),
            ("Access-Control-Allow-Origin", "https://evil.example"),
            ("Access-Control-Allow-Credentials", "true"),
        ],
        b"{}",
    )
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_fake_lab.id, "api/status"))

    names = sorted(c.split("=")[0] for c in response.headers.get_list("set-cookie"))
    assert names == ["_xsrf", "relative"]
    assert "access-control-allow-origin" not in response.headers
    assert "access-control-allow-credentials" not in response.headers


def test_it_strips_the_token_and_the_upstream_host_from_redirects(
    client, alice, alice_fake_lab, upstream, portal_server
):
    token = alice_fake_lab.jupyter_token
    upstream.responses["tree"] = (
        302,
        [("Location", f"{upstream.endpoint}{upstream.prefix}lab?token={token}&x=1")],
        b"",
    )
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_fake_lab.id, "tree"), headers=HTML)

    assert response.status_code == 302
    assert response.headers["location"] == f"{upstream.prefix}lab?x=1"


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_it_removes_the_token_from_any_html_page(
    client, alice, alice_fake_lab, upstream, portal_server, encoding
):
    token = alice_fake_lab.jupyter_token
    # Long enough to arrive in several chunks, with the token straddling chunk boundaries.
    page = (f'<script id="jupyter-config-data">{{"token": "{token}"}}</script>' + "x" * 70_001) * 40 + token
    body = page.encode()
    headers = [("Content-Type", "text/html; charset=UTF-8")]
    if encoding == "gzip":
        body = gzip.compress(body)
        headers.append(("Content-Encoding", "gzip"))
    upstream.responses["lab"] = (200, headers, body)
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(
            lab_url(alice_fake_lab.id, "lab"), headers={**HTML, "Accept-Encoding": "gzip"}
        )

    assert response.status_code == 200
    assert token not in response.text
    assert response.text == page.replace(token, "")
