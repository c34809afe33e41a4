"""Production's subdomain mode, end to end: the nginx config in docs/gateway.md, run by a real nginx in
front of the gateway and a real JupyterLab. Skipped where nginx is not installed (`apt-get install
nginx-core`)."""

import json
import re
import shutil
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websocket
from django.conf import settings as django_settings
from django.contrib.sessions.models import Session
from django.test import Client

from portal.gateway import tickets
from portal.gateway.app import Gateway
from portal.gateway.headers import decoded_headers
from tests.deploy.kit import nginx_conf
from tests.support.certs import self_signed

from .helpers import (
    HTML,
    RecordingUpstream,
    free_port,
    make_instance,
    remember_cookies,
    session_cookie_for,
    wait_until,
)
from .test_lab_kernel import execute_request, stream_output

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed"),
]

SECRET = "nginx-shared-secret-for-tests"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def documented_config() -> str:
    text = DOCS.read_text()
    match = re.search(r"<!-- nginx-config -->\s*```nginx\n(.*?)```", text, re.DOTALL)
    assert match, "docs/gateway.md lost its nginx config block"
    return match.group(1)


@pytest.fixture(scope="module")
def nginx(portal_server, tmp_path_factory):
    """The documented config in a real nginx on a free loopback port; yields its port."""
    root = tmp_path_factory.mktemp("nginx")
    cert, key = self_signed(root)
    port = free_port()
    block = documented_config()
    block = block.replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
    block = block.replace("server 127.0.0.1:8000;", f"server 127.0.0.1:{portal_server.port};")
    block = block.replace("CHANGE-ME-GATEWAY-SECRET", SECRET)
    block = re.sub(r"ssl_certificate\s+\S+;", f"ssl_certificate {cert};", block)
    block = re.sub(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {key};", block)
    (root / "nginx.conf").write_text(nginx_conf(block, root))
    check = subprocess.run(
        ["nginx", "-t", "-p", str(root), "-c", str(root / "nginx.conf")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    process = subprocess.Popen(
        ["nginx", "-p", str(root), "-c", str(root / "nginx.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(
        lambda: httpx.get(f"https://127.0.0.1:{port}/", verify=False).status_code > 0,
        timeout=10,
        what="nginx to listen",
    )
    yield port
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def subdomain_mode(settings):
    settings.GATEWAY_LAB_URL = "https://{instance_id}.lab.example.com"
    settings.GATEWAY_AUTH_SECRET = SECRET


@pytest.fixture
def auth_asked(monkeypatch):
    """The headers of every auth_request that reached the gateway (not answered by nginx's cache)."""
    asked: list[dict[str, str]] = []
    answer = Gateway._auth_request

    async def counted(self, scope, send, instance_id):
        asked.append(decoded_headers(scope))
        await answer(self, scope, send, instance_id)

    monkeypatch.setattr(Gateway, "_auth_request", counted)
    return asked


def via_nginx(
    nginx,
    host: str,
    path: str,
    *,
    cookies: dict | None = None,
    headers: dict | None = None,
    method: str = "GET",
    **kwargs,
) -> httpx.Response:
    cookie_header = "; ".join(f"{k}={v}" for k, v in (cookies or {}).items())
    all_headers = {"Host": host, **({"Cookie": cookie_header} if cookie_header else {}), **(headers or {})}
    return httpx.request(
        method, f"https://127.0.0.1:{nginx}{path}", headers=all_headers, verify=False, timeout=30, **kwargs
    )


def enter_lab(nginx, client, user, instance) -> str:
    """Clicks "Open JupyterLab" on the portal host and follows the handshake between the portal and the
    lab host, as a browser with a cookie jar per host would; returns the lab cookie."""
    session_key = session_cookie_for(client, user)
    portal_cookies = {django_settings.SESSION_COOKIE_NAME: session_key}
    lab_cookies: dict[str, str] = {}
    url = f"https://portal.example.com/instances/{instance.id}/open"
    for _ in range(6):
        location = urlsplit(url)
        on_lab_host = location.netloc == lab_host(instance)
        # SITE_URL in tests is not portal.example.com; anything but the lab host is the portal here.
        response = via_nginx(
            nginx,
            location.netloc if on_lab_host else "portal.example.com",
            f"{location.path}?{location.query}" if location.query else location.path,
            cookies=lab_cookies if on_lab_host else portal_cookies,
            headers=HTML,
        )
        assert response.status_code == 302, response.text
        if on_lab_host:
            remember_cookies(lab_cookies, response)
        url = response.headers["location"]
        if url == f"/instances/{instance.id}/lab/":
            return lab_cookies[tickets.lab_cookie_name()]
    raise AssertionError(f"the handshake did not end in the lab (last: {url})")


def lab_host(instance) -> str:
    return f"{instance.id}.lab.example.com"


def test_it_opens_jupyterlab_on_its_subdomain_without_the_token(
    client, alice, alice_lab, nginx, subdomain_mode
):
    lab_cookie = enter_lab(nginx, client, alice, alice_lab)
    cookies = {tickets.lab_cookie_name(): lab_cookie}

    status = via_nginx(
        nginx, lab_host(alice_lab), f"/instances/{alice_lab.id}/lab/api/status", cookies=cookies
    )
    page = via_nginx(
        nginx, lab_host(alice_lab), f"/instances/{alice_lab.id}/lab/lab", cookies=cookies, headers=HTML
    )

    assert status.status_code == 200 and "started" in status.json()
    assert page.status_code == 200 and "jupyter-config-data" in page.text
    assert alice_lab.jupyter_token not in page.text
    assert "access-control-allow-origin" not in page.headers


def test_it_runs_a_kernel_over_the_subdomain_websocket(client, alice, alice_lab, nginx, subdomain_mode):
    lab_cookie = enter_lab(nginx, client, alice, alice_lab)
    cookies = {tickets.lab_cookie_name(): lab_cookie}
    origin = f"https://{lab_host(alice_lab)}:{nginx}"
    created = via_nginx(
        nginx,
        f"{lab_host(alice_lab)}:{nginx}",
        f"/instances/{alice_lab.id}/lab/api/kernels",
        cookies=cookies,
        method="POST",
        json={"name": "python3"},
        headers={"Origin": origin},
    )
    assert created.status_code == 201, created.text
    kernel_id = created.json()["id"]

    ws = websocket.create_connection(
        f"wss://127.0.0.1:{nginx}/instances/{alice_lab.id}/lab/api/kernels/{kernel_id}/channels",
        host=f"{lab_host(alice_lab)}:{nginx}",
        origin=origin,
        cookie=f"{tickets.lab_cookie_name()}={lab_cookie}",
        sslopt={"cert_reqs": ssl.CERT_NONE},
        timeout=30,
    )
    try:
        request = execute_request("print(6*7)")
        ws.send(json.dumps(request))
        output = stream_output(ws, request["header"]["msg_id"], decode=lambda w: json.loads(w.recv()))
    finally:
        ws.close()
        via_nginx(
            nginx,
            lab_host(alice_lab),
            f"/instances/{alice_lab.id}/lab/api/kernels/{kernel_id}",
            cookies=cookies,
            method="DELETE",
        )

    assert output == "42\n"


def test_it_refuses_a_websocket_from_another_lab_origin(client, alice, alice_lab, nginx, subdomain_mode):
    lab_cookie = enter_lab(nginx, client, alice, alice_lab)
    handshake = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }

    response = via_nginx(
        nginx,
        f"{lab_host(alice_lab)}:{nginx}",
        f"/instances/{alice_lab.id}/lab/api/events/subscribe",
        cookies={tickets.lab_cookie_name(): lab_cookie},
        headers={**handshake, "Origin": f"https://{uuid.uuid4()}.lab.example.com"},
    )

    # nginx sends every refusal to the portal's /open; a websocket cannot follow it.
    assert response.status_code == 302
    assert response.headers["location"].endswith(f"/instances/{alice_lab.id}/open")


def test_it_sends_a_browser_without_the_lab_cookie_to_the_portal(alice_lab, nginx, subdomain_mode):
    response = via_nginx(nginx, lab_host(alice_lab), f"/instances/{alice_lab.id}/lab/lab", headers=HTML)

    assert response.status_code == 302
    assert response.headers["location"] == f"https://portal.example.com/instances/{alice_lab.id}/open"


def test_it_keeps_one_lab_cookie_out_of_another_lab(
    client, alice, bob, image, alice_lab, nginx, subdomain_mode
):
    bob_lab = make_instance(bob, image, endpoint=alice_lab.driver_state["endpoint"], token="bob-token")
    bob_cookie = enter_lab(nginx, client, bob, bob_lab)

    response = via_nginx(
        nginx,
        lab_host(alice_lab),
        f"/instances/{alice_lab.id}/lab/api/status",
        cookies={tickets.lab_cookie_name(): bob_cookie},
    )

    assert response.status_code == 302


def test_it_never_passes_the_lab_cookie_to_the_instance(client, alice, image, nginx, subdomain_mode):
    instance_id = uuid.uuid4()
    with RecordingUpstream(instance_id) as upstream:
        instance = make_instance(
            alice, image, endpoint=upstream.endpoint, token="t0ken-for-recording", instance_id=instance_id
        )
        lab_cookie = enter_lab(nginx, client, alice, instance)
        name = tickets.lab_cookie_name()
        response = via_nginx(
            nginx,
            lab_host(instance),
            f"/instances/{instance_id}/lab/api/status",
            cookies={"_xsrf": "lab-own", name: lab_cookie, "theme": "dark"},
        )
        # The instance's own code can set a second cookie of that name with a longer path; the browser
        # then sends both, and the real one must not ride upstream behind the planted one.
        twice = via_nginx(
            nginx,
            lab_host(instance),
            f"/instances/{instance_id}/lab/api/status",
            headers={"Cookie": f"{name}=planted; _xsrf=lab-own; {name}={lab_cookie}"},
        )

    assert response.status_code == twice.status_code == 200
    first, second = upstream.requests
    assert lab_cookie not in repr(first) + repr(second)
    assert first["cookies"] == ["_xsrf=lab-own; theme=dark"]
    assert second["cookies"] == ["_xsrf=lab-own"]
    assert second["headers"]["authorization"] == "token t0ken-for-recording"


def test_it_serves_no_lab_routes_on_the_portal_host(client, alice, alice_lab, nginx, subdomain_mode):
    session_key = session_cookie_for(client, alice)
    for path in ("lab/api/status", "auth", "redeem"):
        response = via_nginx(
            nginx,
            "portal.example.com",
            f"/instances/{alice_lab.id}/{path}",
            cookies={django_settings.SESSION_COOKIE_NAME: session_key},
            headers={"X-DevCloud-Gateway-Secret": SECRET},
        )
        assert response.status_code == 404, path


def lab_status(nginx, instance, cookies: dict | None = None, **kwargs) -> httpx.Response:
    path = f"/instances/{instance.id}/lab/api/status"
    return via_nginx(nginx, lab_host(instance), path, cookies=cookies, **kwargs)


def sent_to_open(response: httpx.Response, instance) -> bool:
    return (
        response.status_code == 302
        and response.headers["location"] == f"https://portal.example.com/instances/{instance.id}/open"
    )


def test_nginx_never_hands_the_owners_remembered_yes_to_another_session_no_session_or_another_origin(
    client, alice, bob, image, alice_lab, nginx, subdomain_mode, auth_asked
):
    alice_cookie = enter_lab(nginx, client, alice, alice_lab)
    # Bob signs in in his own browser (one client would sign Alice out), and holds a lab cookie of his own.
    bob_client = Client()
    bob_lab = make_instance(bob, image, endpoint=alice_lab.driver_state["endpoint"], token="bob-token")
    bob_lab_cookie = enter_lab(nginx, bob_client, bob, bob_lab)
    bob_session = bob_client.cookies[django_settings.SESSION_COOKIE_NAME].value
    name = tickets.lab_cookie_name()
    owner = {name: alice_cookie}
    assert lab_status(nginx, alice_lab, owner).status_code == 200
    assert lab_status(nginx, alice_lab, owner).status_code == 200

    # While nginx remembers Alice's answer, on her lab's host:
    session_name = django_settings.SESSION_COOKIE_NAME
    attempts = {
        "bob's lab cookie": lab_status(nginx, alice_lab, {name: bob_lab_cookie}),
        "bob's portal session": lab_status(nginx, alice_lab, {session_name: bob_session}),
        "no cookie": lab_status(nginx, alice_lab),
        # Another site riding Alice's own cookie (a GET, so nothing runs in the shared JupyterLab should
        # it get through; the answer for /auth does not depend on the method).
        "another origin": lab_status(
            nginx, alice_lab, owner, headers={"Origin": f"https://{uuid.uuid4()}.lab.example.com"}
        ),
    }
    still_owner = lab_status(nginx, alice_lab, owner)

    for attempt, response in attempts.items():
        assert sent_to_open(response, alice_lab), (attempt, response.status_code, response.text[:200])
    # Each refusal was the gateway's own: nginx asked it every time.
    assert len(auth_asked) == 1 + len(attempts), auth_asked
    # And the attempts came while Alice's answer was remembered: her own requests asked once.
    assert still_owner.status_code == 200
    assert sum(alice_cookie in asked.get("cookie", "") and "origin" not in asked for asked in auth_asked) == 1


def test_a_session_ended_in_another_process_loses_the_lab_within_three_seconds_though_nginx_remembered_it(
    client, alice, alice_lab, nginx, subdomain_mode
):
    lab_cookie = enter_lab(nginx, client, alice, alice_lab)
    session_key = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    owner = {tickets.lab_cookie_name(): lab_cookie}
    assert lab_status(nginx, alice_lab, owner).status_code == 200
    remembered_at = time.monotonic()

    # A logout served by another web process: the session is gone, and no signal evicts anything, neither
    # in this gateway's decision cache nor in nginx, which no logout can reach.
    Session.objects.filter(session_key=session_key).delete()
    # An open JupyterLab keeps polling its server; so does this browser, until it is turned away.
    while (response := lab_status(nginx, alice_lab, owner)).status_code == 200:
        assert time.monotonic() - remembered_at < 6, "still let in 6 seconds after the logout"
        time.sleep(0.1)
    refused_after = time.monotonic() - remembered_at

    assert sent_to_open(response, alice_lab), response.status_code
    # nginx keeps the answer 2 to 3 seconds and the gateway answers its next question afresh, so no cache
    # renews another: refused within 3 seconds, plus one poll.
    assert refused_after < 3.75, refused_after


def test_a_burst_of_lab_requests_from_one_session_asks_the_gateway_once(
    client, alice, alice_lab, nginx, subdomain_mode, auth_asked
):
    lab_cookie = enter_lab(nginx, client, alice, alice_lab)
    burst = 20
    with httpx.Client(
        base_url=f"https://127.0.0.1:{nginx}",
        headers={"Host": lab_host(alice_lab), "Cookie": f"{tickets.lab_cookie_name()}={lab_cookie}"},
        verify=False,
        timeout=30,
    ) as browser:
        started = time.monotonic()
        path = f"/instances/{alice_lab.id}/lab/api/status"
        statuses = [browser.get(path).status_code for _ in range(burst)]
        elapsed = time.monotonic() - started

    assert statuses == [200] * burst
    asked = [headers for headers in auth_asked if lab_cookie in headers.get("cookie", "")]
    # nginx keeps an answer at least 2 seconds: once in all, unless the burst itself took that long.
    assert 1 <= len(asked) <= 1 + int(elapsed // 2), (len(asked), elapsed)


def test_an_answer_from_nginxs_memory_sends_the_token_and_only_the_allowed_cookies_upstream(
    client, alice, image, nginx, subdomain_mode, auth_asked
):
    instance_id = uuid.uuid4()
    with RecordingUpstream(instance_id) as upstream:
        instance = make_instance(
            alice, image, endpoint=upstream.endpoint, token="t0ken-remembered", instance_id=instance_id
        )
        lab_cookie = enter_lab(nginx, client, alice, instance)
        cookies = {"_xsrf": "lab-own", tickets.lab_cookie_name(): lab_cookie, "theme": "dark"}
        statuses = [lab_status(nginx, instance, cookies).status_code for _ in range(3)]

    assert statuses == [200] * 3
    assert len(auth_asked) == 1
    assert [request["cookies"] for request in upstream.requests] == [["_xsrf=lab-own; theme=dark"]] * 3
    tokens = {request["headers"]["authorization"] for request in upstream.requests}
    assert tokens == {"token t0ken-remembered"}
