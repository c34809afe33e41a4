"""Helpers for the gateway tests: a real JupyterLab subprocess, uvicorn in a thread, browser stand-ins."""

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import uvicorn
from django.conf import settings

from portal.instances.models import Instance

# One JupyterLab serves every test; each test makes the Instance row that points at it.
LAB_INSTANCE_ID = uuid.uuid4()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (httpx.TransportError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def start_jupyterlab(*, instance_id, token: str, root_dir: Path, home: Path) -> tuple[subprocess.Popen, str]:
    """Starts JupyterLab with the base URL and token a driver would give it; returns (process, endpoint)."""
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(home),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
    }
    # The child holds its own copy of the log file; ours closes when the block ends.
    with open(home / "jupyterlab.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                f"--ServerApp.token={token}",
                f"--ServerApp.base_url=/instances/{instance_id}/lab/",
                f"--port={port}",
                "--ip=127.0.0.1",
                "--no-browser",
                f"--ServerApp.root_dir={root_dir}",
                "--ServerApp.port_retries=0",
                # Test machines and containers often run as root; the driver's image does not.
                "--allow-root",
                # As in a container listening on 0.0.0.0: the Host may be a lab subdomain (nginx tests).
                "--ServerApp.allow_remote_access=True",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    endpoint = f"http://127.0.0.1:{port}"
    status_url = f"{endpoint}/instances/{instance_id}/lab/api/status"

    def answering():
        if process.poll() is not None:
            raise AssertionError(
                f"JupyterLab exited with {process.returncode}; see {home / 'jupyterlab.log'}"
            )
        return httpx.get(status_url, headers={"Authorization": f"token {token}"}).status_code == 200

    try:
        wait_until(
            answering,
            timeout=60,
            what="JupyterLab to answer",
        )
    except AssertionError:
        process.kill()
        raise
    return process, endpoint


class ServerThread:
    """uvicorn serving portal.asgi:application on a free port of `host` (loopback unless told), in a
    background thread.

    With the HTTP protocol the deploy kit and make run give it, so lab GETs from a session the gateway
    has just allowed take the fast path (portal/gateway/fast_path.py), as they do in production.
    """

    def __init__(self, host: str = "127.0.0.1"):
        from portal.asgi import application
        from portal.gateway.fast_path import LabHttpProtocol

        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(
            application,
            host=host,
            port=self.port,
            log_level="warning",
            lifespan="on",
            http=LabHttpProtocol,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="gateway-uvicorn", daemon=True)

    def start(self):
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=15, what="uvicorn to start")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=15)


def make_instance(user, image, *, endpoint: str, token: str, state=Instance.State.RUNNING, instance_id=None):
    return Instance.objects.create(
        id=instance_id or uuid.uuid4(),
        user=user,
        size="1x",
        image=image,
        state=state,
        driver="local",
        driver_state={"endpoint": endpoint},
        jupyter_token=token,
    )


def session_cookie_for(client, user) -> str:
    """Signs `user` in to the portal and returns the session cookie value a browser would hold."""
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def browser(portal_server, session_key: str | None = None, **kwargs) -> httpx.Client:
    """An httpx client standing in for a browser that holds `session_key` (or no session)."""
    cookies = {settings.SESSION_COOKIE_NAME: session_key} if session_key else {}
    return httpx.Client(
        base_url=portal_server.url, cookies=cookies, follow_redirects=False, timeout=30, **kwargs
    )


def lab_url(instance_id, path: str = "") -> str:
    return f"/instances/{instance_id}/lab/{path}"


HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


class RecordingUpstream:
    """A stand-in JupyterLab (http.server) that records each request and answers as a test tells it.

    `responses` maps a path suffix (after the lab prefix) to (status, headers, body); other paths get
    200 {"ok": true}.
    """

    def __init__(self, instance_id):
        import http.server
        import json

        self.prefix = f"/instances/{instance_id}/lab/"
        self.requests: list[dict] = []
        self.responses: dict[str, tuple[int, list[tuple[str, str]], bytes]] = {}
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                recorder.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "cookies": self.headers.get_all("cookie") or [],
                        "body": self.rfile.read(length),
                    }
                )
                suffix = self.path.split("?")[0].removeprefix(recorder.prefix)
                status, headers, body = recorder.responses.get(
                    suffix, (200, [("Content-Type", "application/json")], json.dumps({"ok": True}).encode())
                )
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def ws_connect(portal_server, path: str, session_key: str | None, **kwargs):
    """Opens a websocket through the gateway as a browser on the portal's origin would."""
    import websocket

    if session_key:
        kwargs.setdefault("cookie", f"{settings.SESSION_COOKIE_NAME}={session_key}")
    kwargs.setdefault("origin", portal_server.url)
    return websocket.create_connection(
        portal_server.url.replace("http://", "ws://") + path, timeout=30, **kwargs
    )


class EchoWebsocketUpstream:
    """A stand-in JupyterLab websocket endpoint that echoes frames and records how each socket ended.

    Sending the text "close <code>" makes it close with that code; `closed_with` collects the close
    codes it received from the gateway, `handshakes` the request headers and subprotocol of each.
    """

    def __init__(self):
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.server import serve

        self.closed_with: list[int | None] = []
        self.handshakes: list[dict] = []

        def handler(ws):
            self.handshakes.append(
                {
                    "path": ws.request.path,
                    "headers": {k.lower(): v for k, v in ws.request.headers.raw_items()},
                    "subprotocol": ws.subprotocol,
                }
            )
            try:
                for message in ws:
                    if isinstance(message, str) and message.startswith("close "):
                        ws.close(int(message.split()[1]), "closed by the lab")
                        break
                    ws.send(message)
            except ConnectionClosed:
                # The gateway closed with a code other than 1000; `closed_with` records which.
                pass
            finally:
                self.closed_with.append(ws.close_code)

        def select_subprotocol(connection, offered):
            # As Jupyter Server does: the v1 kernel protocol when offered, none otherwise.
            return "v1.kernel.websocket.jupyter.org" if "v1.kernel.websocket.jupyter.org" in offered else None

        self.server = serve(handler, "127.0.0.1", 0, select_subprotocol=select_subprotocol)
        self.endpoint = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


def lab_host(instance_id) -> str:
    """The lab's own host in subdomain mode, as the tests configure GATEWAY_LAB_URL."""
    return f"{instance_id}.lab.example.com"


def _hop(portal_server, url: str, cookies: dict[str, str], headers: dict | None = None) -> httpx.Response:
    """One GET as a browser sends it to `url`'s host, delivered to the gateway with that Host header."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    sent = {**HTML, **(headers or {})}
    if parts.netloc:
        sent["Host"] = parts.netloc
    if cookies:
        sent["Cookie"] = "; ".join(f"{name}={value}" for name, value in cookies.items())
    with httpx.Client(base_url=portal_server.url, follow_redirects=False, timeout=30) as hop:
        return hop.get(urlunsplit(("", "", parts.path, parts.query, "")), headers=sent)


def remember_cookies(jar: dict[str, str], response: httpx.Response) -> None:
    """Updates `jar` with the response's Set-Cookie headers as a browser would (Max-Age=0 deletes)."""
    from http.cookies import SimpleCookie

    for header in response.headers.get_list("set-cookie"):
        parsed = SimpleCookie()
        parsed.load(header)
        for name, morsel in parsed.items():
            if morsel["max-age"] in ("0", 0) or (morsel["expires"] and "1970" in morsel["expires"]):
                jar.pop(name, None)
            else:
                jar[name] = morsel.value


def open_until_ticket(portal_server, session_key: str | None, instance_id, lab_cookies=None):
    """Clicks "Open JupyterLab" as a browser holding `session_key` on the portal and `lab_cookies` on the
    lab host, following redirects between the two hosts until one carries a ticket.

    Returns (the redeem URL with the ticket, the cookies this browser now holds on the lab host).
    """
    from urllib.parse import urljoin, urlsplit

    lab_cookies = dict(lab_cookies or {})
    portal_cookies = {settings.SESSION_COOKIE_NAME: session_key} if session_key else {}
    url = f"{portal_server.url}/instances/{instance_id}/open"
    for _ in range(6):
        on_lab_host = urlsplit(url).netloc == lab_host(instance_id)
        response = _hop(portal_server, url, lab_cookies if on_lab_host else portal_cookies)
        if on_lab_host:
            remember_cookies(lab_cookies, response)
        assert response.status_code == 302, (url, response.status_code, response.text[:300])
        url = urljoin(url, response.headers["location"])
        if "ticket=" in url:
            return url, lab_cookies
    raise AssertionError(f"no ticket after six redirects (last: {url})")


def redeem_ticket(portal_server, url: str, lab_cookies: dict[str, str]) -> httpx.Response:
    """The browser holding `lab_cookies` on the lab host follows a redeem URL; its jar is updated."""
    response = _hop(portal_server, url, lab_cookies)
    remember_cookies(lab_cookies, response)
    return response


def enter_lab(portal_server, session_key: str, instance_id) -> dict[str, str]:
    """The whole "Open JupyterLab" handshake in subdomain mode; returns the browser's lab-host cookies."""
    url, lab_cookies = open_until_ticket(portal_server, session_key, instance_id)
    response = redeem_ticket(portal_server, url, lab_cookies)
    assert response.status_code == 302, response.text[:300]
    assert response.headers["location"] == lab_url(instance_id)
    return lab_cookies


def port_host(portal_server, label: str) -> str:
    """An exposed port's own host in path mode, on the test server's port (SITE_URL is the server's)."""
    return f"{label}.localhost:{portal_server.port}"


def port_get(portal_server, label: str, path: str, port_cookies: dict[str, str], **kwargs) -> httpx.Response:
    """A GET on the exposed port's host, from a browser holding `port_cookies` there."""
    return _hop(portal_server, f"http://{port_host(portal_server, label)}{path}", port_cookies, **kwargs)


def enter_port(
    portal_server, label: str, *, session_key: str | None = None, share: str = "", path: str = "/"
):
    """Opens the exposed port `label` as a browser holding `session_key` on the portal would: asks the
    port's host for `path` (or follows the share link when `share` is given) and follows the redirects
    between the portal and the port's host.

    Returns (the last response, the cookies the browser holds on the port's host). The last response is
    the first one that is not a redirect between the two hosts: the app's answer, or a refusal.
    """
    from urllib.parse import urlencode, urljoin, urlsplit

    portal_cookies = {settings.SESSION_COOKIE_NAME: session_key} if session_key else {}
    port_cookies: dict[str, str] = {}
    host = port_host(portal_server, label)
    if share:
        url = f"{portal_server.url}/ports/{label}/open?{urlencode({'share': share})}"
    else:
        url = f"http://{host}{path}"
    for _ in range(8):
        on_port_host = urlsplit(url).netloc == host
        response = _hop(portal_server, url, port_cookies if on_port_host else portal_cookies)
        if on_port_host:
            remember_cookies(port_cookies, response)
        location = response.headers.get("location")
        if response.status_code != 302 or location is None:
            return response, port_cookies
        url = urljoin(url, location)
        if urlsplit(url).netloc not in (host, urlsplit(portal_server.url).netloc):
            return response, port_cookies
        if urlsplit(url).path.startswith("/accounts/login"):
            return response, port_cookies
    raise AssertionError(f"still redirected after eight hops (last: {url})")
