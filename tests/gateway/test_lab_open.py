"""The owner opens JupyterLab through the portal, and the Jupyter token never reaches the browser."""

import re

import pytest

from .helpers import HTML, browser, lab_url, session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_lets_the_owner_reach_the_jupyter_api(client, alice, alice_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_lab.id, "api/status"))

    assert response.status_code == 200
    assert "started" in response.json()


def test_it_serves_the_jupyterlab_page_without_the_token(client, alice, alice_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_lab.id, "lab"), headers=HTML)

    assert response.status_code == 200
    assert "jupyter-config-data" in response.text
    # The page config still has a token field, emptied: the lab authenticates through the gateway.
    assert re.search(r'"token":\s*""', response.text)
    assert alice_lab.jupyter_token not in response.text
    assert response.headers.get("content-length") in (None, str(len(response.content)))


def test_it_never_sends_the_token_in_a_redirect(client, alice, alice_lab, portal_server):
    token = alice_lab.jupyter_token
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        # JupyterLab redirects its root to the lab page; follow every hop and check each one.
        response = alice_browser.get(lab_url(alice_lab.id), headers=HTML, follow_redirects=True)

    assert response.status_code == 200
    assert response.history, "JupyterLab's root was expected to redirect"
    for hop in [*response.history, response]:
        assert token not in str(hop.url)
        assert token not in hop.headers.get("location", "")
        assert hop.headers.get("location", "/").startswith("/")
    assert token not in response.text


def test_it_keeps_the_jupyterlab_cookies_on_the_instance_path(client, alice, alice_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        response = alice_browser.get(lab_url(alice_lab.id, "lab"), headers=HTML)

    set_cookies = response.headers.get_list("set-cookie")
    assert any(c.startswith("_xsrf=") for c in set_cookies), set_cookies
    for cookie in set_cookies:
        assert f"Path=/instances/{alice_lab.id}/lab" in cookie, cookie


def test_it_creates_a_kernel_with_a_post(client, alice, alice_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        created = alice_browser.post(lab_url(alice_lab.id, "api/kernels"), json={"name": "python3"})
        kernel_id = created.json()["id"]
        listed = alice_browser.get(lab_url(alice_lab.id, "api/kernels"))
        deleted = alice_browser.delete(lab_url(alice_lab.id, f"api/kernels/{kernel_id}"))

    assert created.status_code == 201
    assert kernel_id in [k["id"] for k in listed.json()]
    assert deleted.status_code == 204


def test_it_refuses_a_post_from_another_site(client, alice, alice_lab, portal_server):
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        before = alice_browser.get(lab_url(alice_lab.id, "api/kernels")).json()
        response = alice_browser.post(
            lab_url(alice_lab.id, "api/kernels"),
            json={"name": "python3"},
            headers={"Origin": "https://evil.example"},
        )
        after = alice_browser.get(lab_url(alice_lab.id, "api/kernels")).json()

    assert response.status_code == 403
    assert after == before


def test_it_streams_a_file_upload_and_download_unchanged(client, alice, alice_lab, portal_server, tmp_path):
    # 3 MB of JSON both ways: bodies are streamed, and non-HTML bodies are passed through byte for byte.
    content = "x" * 3_000_000
    name = "big file é.txt"
    encoded = "big%20file%20%C3%A9.txt"
    with browser(portal_server, session_cookie_for(client, alice)) as alice_browser:
        saved = alice_browser.put(
            lab_url(alice_lab.id, f"api/contents/{encoded}"),
            json={"type": "file", "format": "text", "content": content},
        )
        fetched = alice_browser.get(lab_url(alice_lab.id, f"files/{encoded}"))
        alice_browser.delete(lab_url(alice_lab.id, f"api/contents/{encoded}"))

    assert saved.status_code in (200, 201), saved.text
    assert saved.json()["name"] == name
    assert fetched.status_code == 200
    assert fetched.text == content
