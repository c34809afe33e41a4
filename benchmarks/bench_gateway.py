"""Latency the gateway adds: JupyterLab's /api/status through the gateway vs straight to JupyterLab.

A real JupyterLab subprocess, and the portal as the deploy kit's web unit runs it (its uvicorn command
line and the production settings: DEBUG off, the database connection pool; benchmarks.start_kit_web),
on a scratch PostgreSQL database. Requests go one at a time, over kept-alive connections, taking the
routes in turn so that all see the same machine load. Two passes:
- the target pair, direct and the cached gateway, alternating with each other and nothing else: what
  the gateway adds to one lab request;
- every route below in turn. Between two samples of one route, every other route's processes run and
  take the CPU caches, so each route is slower here, and a route through two processes pays twice;
  the byte relay shows how much of that is the hop alone.
The routes:
- direct:  GET <endpoint>/instances/<id>/lab/api/status with the token header;
- gateway: the same path on the portal with the owner's session cookie, decision cached (a lab
  page load is a burst of requests from one session), so it takes the fast path
  (portal/gateway/fast_path.py);
- gateway, general path: the same, on a second portal whose uvicorn runs its stock HTTP protocol
  (`--http httptools`) instead of the gateway's, so every request goes through the ASGI gateway and
  its aiohttp client: what the fast path saves, measured in the same run;
- gateway, uncached: each request from a new session (the first request of a session), so every one
  pays the session-and-instance read and the user read, on a pooled connection;
- TCP relay: benchmarks/tcp_relay.py, a process copying bytes to the same JupyterLab and reading none
  of them: the floor of any proxy hop on this machine. What the gateway adds beyond it is its own work;
- minimal proxy: benchmarks/minimal_proxy.py on the same uvicorn command line, forwarding to the same
  JupyterLab with the gateway's aiohttp client settings and nothing else (no session, no decision, no
  header rewriting): what a hop through uvicorn's ASGI layer and aiohttp costs, which the general
  path cannot beat and the fast path goes below (that process has no gateway, so its protocol is
  plain uvicorn's);
- kit's nginx: production's route. nginx runs the deploy kit's site as tests/deploy runs it
  (tests.deploy.kit), in front of this portal; the request goes to the lab's own host with the owner's
  lab cookie, nginx asks the portal's /auth (or remembers its answer, as it does for 2 to 3 seconds)
  and carries the bytes to JupyterLab itself. Over plain HTTP to the lab server block (a listener the
  bench adds, so the transport is direct's), and over TLS as the kit ships it ("kit's nginx, TLS";
  JupyterLab speaks no TLS, so direct has none to compare with). Skipped where nginx is not installed.

Targets: the cached gateway's median within 1.3 times direct's, in the target pair; the first request
of a session under 10 ms (median). The kit's nginx route is reported beside them.
"""

import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import database_url, scratch_database, start_kit_web, summarize_ms

DATABASE = "devcloud_bench_gateway"
REQUESTS = 200
WARMUP = 20
TARGET_RATIO = 1.3
TARGET_FIRST_MS = 10
# The pair the target compares, measured alternately with nothing in between.
PAIR = ("direct", "gateway")
# Production names the session cookie __Host-sessionid, the lab cookie __Host-devcloud_lab
# (portal/settings/deployed.py).
PRODUCTION_SESSION_COOKIE = "__Host-sessionid"
PRODUCTION_LAB_COOKIE = "__Host-devcloud_lab"


def _timed_get(client: httpx.Client, url: str, **kwargs) -> float:
    started = time.perf_counter()
    response = client.get(url, **kwargs)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} answered {response.status_code}: {response.text[:200]}")
    return elapsed


def start_kit_nginx(root: Path, *, portal_port: int, secret: str) -> tuple[subprocess.Popen, int, int]:
    """deploy/nginx/devcloud.conf as tests/deploy runs it, in front of the portal on `portal_port`.

    Its lab server block also listens on a plain-HTTP port. Returns (process, TLS port, plain port).
    """
    from tests.deploy.kit import nginx_conf, nginx_site, self_signed
    from tests.gateway.helpers import free_port

    cert, key = self_signed(root)
    https_port, http_port, plain_port = free_port(), free_port(), free_port()
    site = nginx_site(
        https_port=https_port, http_port=http_port, portal_port=portal_port, cert=cert, key=key, secret=secret
    )
    lab_server = site.index('server_name "~^(?<instance_id>')
    tls_listen = site.rindex(f"listen 127.0.0.1:{https_port} ssl", 0, lab_server)
    site = f"{site[:tls_listen]}listen 127.0.0.1:{plain_port};\n    {site[tls_listen:]}"
    (root / "nginx.conf").write_text(nginx_conf(site, root))
    with open(root / "nginx.out", "wb") as log:
        process = subprocess.Popen(
            ["nginx", "-p", str(root), "-c", str(root / "nginx.conf")], stdout=log, stderr=subprocess.STDOUT
        )
    return process, https_port, plain_port


def main() -> dict:
    # httpx logs every request at INFO; 600 lines would bury the figures.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.conf import settings
    from django.db import connection
    from django.test import Client

    from portal.accounts.models import User
    from portal.gateway import tickets
    from portal.instances.models import Image, Instance
    from tests.gateway.helpers import free_port, start_jupyterlab, wait_until

    with scratch_database(DATABASE), tempfile.TemporaryDirectory(prefix="bench-gateway-") as scratch:
        scratch = Path(scratch)
        (scratch / "root").mkdir()
        (scratch / "home").mkdir()
        user = User.objects.create_user("bench@example.com", "bench-password-0123")
        image = Image.objects.create(key="cpu", name="CPU", sizes=["1x"], reference="devcloud/cpu:bench")
        token = secrets.token_hex(24)
        instance = Instance.objects.create(
            user=user, size="1x", image=image, state=Instance.State.RUNNING, jupyter_token=token
        )
        lab, endpoint = start_jupyterlab(
            instance_id=instance.id, token=token, root_dir=scratch / "root", home=scratch / "home"
        )
        Instance.objects.filter(id=instance.id).update(driver_state={"endpoint": endpoint})
        port = free_port()
        gateway_secret = secrets.token_urlsafe(24)
        portal = start_kit_web(
            port,
            database_url(connection.settings_dict),
            scratch / "portal.log",
            env={"GATEWAY_AUTH_SECRET": gateway_secret},
        )
        general_port = free_port()
        general = start_kit_web(
            general_port,
            database_url(connection.settings_dict),
            scratch / "general.log",
            http="httptools",
            env={"GATEWAY_AUTH_SECRET": gateway_secret},
        )
        proxy_port = free_port()
        proxy = start_kit_web(
            proxy_port,
            database_url(connection.settings_dict),
            scratch / "proxy.log",
            app="benchmarks.minimal_proxy:app",
            env={"BENCH_PROXY_UPSTREAM": endpoint},
        )
        relay_port = free_port()
        relay = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.tcp_relay", str(relay_port)],
            env={**os.environ, "BENCH_RELAY_UPSTREAM": endpoint.split("://", 1)[1]},
        )
        processes = [portal, general, proxy, relay, lab]
        with_nginx = shutil.which("nginx") is not None
        try:
            if with_nginx:
                (scratch / "nginx").mkdir()
                nginx, nginx_tls_port, nginx_port = start_kit_nginx(
                    scratch / "nginx", portal_port=port, secret=gateway_secret
                )
                processes.append(nginx)
            gateway_url = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: httpx.get(f"{gateway_url}/accounts/login/").status_code == 200,
                timeout=60,
                what="the portal to answer",
            )
            general_url = f"http://127.0.0.1:{general_port}"
            wait_until(
                lambda: httpx.get(f"{general_url}/accounts/login/").status_code == 200,
                timeout=60,
                what="the general-path portal to answer",
            )
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            wait_until(
                lambda: httpx.get(proxy_url + "/").status_code, timeout=60, what="the minimal proxy to answer"
            )
            relay_url = f"http://127.0.0.1:{relay_port}"
            path = f"/instances/{instance.id}/lab/api/status"

            def new_session() -> str:
                browser = Client()
                browser.force_login(user)
                return browser.cookies[settings.SESSION_COOKIE_NAME].value

            fresh_sessions = [new_session() for _ in range(REQUESTS)]
            # What a browser holds on the lab's own host after "Open JupyterLab" (portal/gateway/tickets.py).
            lab_cookie = tickets.lab_cookie_value(session_key=new_session(), instance_id=str(instance.id))
            on_lab_host = {
                "Host": f"{instance.id}.lab.example.com",
                "Cookie": f"{PRODUCTION_LAB_COOKIE}={lab_cookie}",
            }
            kit_urls = []
            if with_nginx:
                kit_urls = [
                    f"http://127.0.0.1:{nginx_port}{path}",
                    f"https://127.0.0.1:{nginx_tls_port}{path}",
                ]

                def through_nginx() -> bool:
                    if nginx.poll() is not None:
                        raise RuntimeError(f"nginx exited: {(scratch / 'nginx' / 'nginx.out').read_text()}")
                    return httpx.get(kit_urls[0], headers=on_lab_host).status_code == 200

                wait_until(through_nginx, timeout=30, what="JupyterLab through the kit's nginx")
            wait_until(
                lambda: httpx.get(relay_url + path, headers={"Authorization": f"token {token}"}).status_code
                == 200,
                timeout=30,
                what="JupyterLab through the TCP relay",
            )
            with (
                httpx.Client(headers={"Authorization": f"token {token}"}) as to_lab,
                httpx.Client(cookies={PRODUCTION_SESSION_COOKIE: new_session()}) as to_gateway,
                httpx.Client(cookies={PRODUCTION_SESSION_COOKIE: new_session()}) as to_general,
                httpx.Client() as to_gateway_cold,
                httpx.Client(headers=on_lab_host, verify=False) as to_kit,
            ):
                sessions = iter(fresh_sessions)
                routes = {
                    "direct": lambda: _timed_get(to_lab, endpoint + path),
                    "gateway": lambda: _timed_get(to_gateway, gateway_url + path),
                    "gateway_general": lambda: _timed_get(to_general, general_url + path),
                    "gateway_uncached": lambda: _timed_get(
                        to_gateway_cold,
                        gateway_url + path,
                        headers={"Cookie": f"{PRODUCTION_SESSION_COOKIE}={next(sessions)}"},
                    ),
                    "minimal_proxy": lambda: _timed_get(to_lab, proxy_url + path),
                    "tcp_relay": lambda: _timed_get(to_lab, relay_url + path),
                }
                if with_nginx:
                    routes["kit_nginx"] = lambda: _timed_get(to_kit, kit_urls[0])
                    routes["kit_nginx_tls"] = lambda: _timed_get(to_kit, kit_urls[1])
                warm = {name: timed for name, timed in routes.items() if name != "gateway_uncached"}
                _alternate(warm, WARMUP)
                paired = _alternate({name: routes[name] for name in PAIR}, REQUESTS)
                every = _alternate(routes, REQUESTS)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=15)

    pair = {name: summarize_ms(samples) for name, samples in paired.items()}
    figures = {name: summarize_ms(samples) for name, samples in every.items()}
    base = figures["direct"]["median_ms"]
    print(f"GET /api/status, {REQUESTS} requests each, one at a time (medians; baseline: direct)")
    print("  the target pair, alternating with each other and nothing else:")
    _print_table(pair)
    print(f"  all {len(figures)} routes in turn:")
    _print_table(figures)
    gateway = _ratio(pair["gateway"], pair["direct"]["median_ms"])
    first = figures["gateway_uncached"]["median_ms"]
    hop = figures["tcp_relay"]["median_ms"] - base
    own = figures["gateway"]["median_ms"] - figures["tcp_relay"]["median_ms"]
    print(
        f"  target: gateway within {TARGET_RATIO}x of direct: "
        f"{'meets' if gateway <= TARGET_RATIO else 'MISSES'} "
        f"({gateway:.2f}x); first request of a session under {TARGET_FIRST_MS} ms: "
        f"{'meets' if first < TARGET_FIRST_MS else 'MISSES'} ({first:.2f} ms)"
    )
    print(
        f"  of what the gateway adds in turn, the hop itself (a byte relay) is {hop:.2f} ms "
        f"and the gateway's own work {own:.2f} ms"
    )
    results = {
        "direct_median_ms": pair["direct"]["median_ms"],
        "gateway_median_ms": pair["gateway"]["median_ms"],
        "gateway_ratio": gateway,
        "gateway_uncached_median_ms": first,
        "hop_ms": round(hop, 2),
        "gateway_own_ms": round(own, 2),
    }
    for name in figures:
        if name != "direct":
            results[f"{name}_ratio_in_turn"] = _ratio(figures[name], base)
    if not kit_urls:
        print("  kit's nginx route: skipped (nginx is not installed)")
        return results
    kit = _ratio(figures["kit_nginx"], base)
    print(
        f"  kit's nginx route (in turn), plain HTTP as direct: {kit:.2f}x; over TLS as the kit ships it "
        f"{_ratio(figures['kit_nginx_tls'], base):.2f}x (direct is plain HTTP: JupyterLab speaks no TLS)"
    )
    for name in ("kit_nginx", "kit_nginx_tls"):
        results[f"{name}_median_ms"] = figures[name]["median_ms"]
        results[f"{name}_p95_ms"] = figures[name]["p95_ms"]
    return results


def _ratio(summary: dict, to: float) -> float:
    """`summary`'s median over `to`, to two decimals."""
    return round(summary["median_ms"] / to, 2) if to else float("nan")


def _print_table(figures: dict) -> None:
    base = figures["direct"]["median_ms"]
    for name, summary in figures.items():
        print(
            f"  {name:<17} median {summary['median_ms']:7.2f} ms  p95 {summary['p95_ms']:7.2f} ms  "
            f"max {summary['max_ms']:7.2f} ms  ratio to direct {_ratio(summary, base):5.2f}x"
        )


def _alternate(routes: dict, rounds: int) -> dict[str, list[float]]:
    """`rounds` samples of each route, taking the routes in turn so that all see the same machine load."""
    samples: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(rounds):
        for name, timed in routes.items():
            samples[name].append(timed())
    return samples
