"""Latency the gateway adds: JupyterLab's /api/status through the gateway vs straight to JupyterLab.

A real JupyterLab subprocess, and the portal as the deploy kit's web unit runs it (its uvicorn command
line and the production settings: DEBUG off, the database connection pool; benchmarks.start_kit_web),
on a scratch PostgreSQL database. Requests alternate between the two routes, one at a time, over
kept-alive connections, so both see the same machine load:
- direct:  GET <endpoint>/instances/<id>/lab/api/status with the token header;
- gateway: the same path on the portal with the owner's session cookie, decision cached (a lab
  page load is a burst of requests from one session);
- gateway, uncached: each request from a new session (the first request of a session), so every one
  pays the session, user and instance reads, on a pooled connection;
- minimal proxy: benchmarks/minimal_proxy.py on the same uvicorn command line, forwarding to the same
  JupyterLab with the gateway's aiohttp client settings and nothing else (no session, no decision, no
  header rewriting): the cost of the extra hop itself, which a gateway written this way cannot beat.

Targets: the cached gateway's median within 1.3 times direct's, measured alternately in the same run;
the first request of a session under 10 ms (median).
"""

import logging
import secrets
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
# Production names the session cookie __Host-sessionid (portal/settings/production.py).
PRODUCTION_SESSION_COOKIE = "__Host-sessionid"


def _timed_get(client: httpx.Client, url: str, **kwargs) -> float:
    started = time.perf_counter()
    response = client.get(url, **kwargs)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} answered {response.status_code}: {response.text[:200]}")
    return elapsed


def main() -> dict:
    # httpx logs every request at INFO; 600 lines would bury the figures.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.conf import settings
    from django.db import connection
    from django.test import Client

    from portal.accounts.models import User
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
        portal = start_kit_web(port, database_url(connection.settings_dict), scratch / "portal.log")
        proxy_port = free_port()
        proxy = start_kit_web(
            proxy_port,
            database_url(connection.settings_dict),
            scratch / "proxy.log",
            app="benchmarks.minimal_proxy:app",
            env={"BENCH_PROXY_UPSTREAM": endpoint},
        )
        try:
            gateway_url = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: httpx.get(f"{gateway_url}/accounts/login/").status_code == 200,
                timeout=60,
                what="the portal to answer",
            )
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            wait_until(
                lambda: httpx.get(proxy_url + "/").status_code, timeout=60, what="the minimal proxy to answer"
            )
            path = f"/instances/{instance.id}/lab/api/status"

            def new_session() -> str:
                browser = Client()
                browser.force_login(user)
                return browser.cookies[settings.SESSION_COOKIE_NAME].value

            fresh_sessions = [new_session() for _ in range(REQUESTS)]
            direct, cached, uncached, minimal = [], [], [], []
            with (
                httpx.Client(headers={"Authorization": f"token {token}"}) as to_lab,
                httpx.Client(cookies={PRODUCTION_SESSION_COOKIE: new_session()}) as to_gateway,
                httpx.Client() as to_gateway_cold,
            ):
                for _ in range(WARMUP):
                    _timed_get(to_lab, endpoint + path)
                    _timed_get(to_gateway, gateway_url + path)
                    _timed_get(to_lab, proxy_url + path)
                for number in range(REQUESTS):
                    direct.append(_timed_get(to_lab, endpoint + path))
                    cached.append(_timed_get(to_gateway, gateway_url + path))
                    cookie = {"Cookie": f"{PRODUCTION_SESSION_COOKIE}={fresh_sessions[number]}"}
                    uncached.append(_timed_get(to_gateway_cold, gateway_url + path, headers=cookie))
                    minimal.append(_timed_get(to_lab, proxy_url + path))
        finally:
            for process in (portal, proxy, lab):
                process.terminate()
            for process in (portal, proxy, lab):
                process.wait(timeout=15)

    figures = {
        "direct": summarize_ms(direct),
        "gateway": summarize_ms(cached),
        "gateway_uncached": summarize_ms(uncached),
        "minimal_proxy": summarize_ms(minimal),
    }
    base = figures["direct"]["median_ms"]
    print(f"GET /api/status, {REQUESTS} requests each, one at a time (medians; baseline: direct)")
    for name, summary in figures.items():
        ratio = summary["median_ms"] / base if base else float("nan")
        print(
            f"  {name:<17} median {summary['median_ms']:7.2f} ms  p95 {summary['p95_ms']:7.2f} ms  "
            f"max {summary['max_ms']:7.2f} ms  ratio to direct {ratio:5.2f}x"
        )
    ratio = figures["gateway"]["median_ms"] / base if base else float("nan")
    first = figures["gateway_uncached"]["median_ms"]
    print(
        f"  target: gateway within {TARGET_RATIO}x of direct: "
        f"{'meets' if ratio <= TARGET_RATIO else 'MISSES'} "
        f"({ratio:.2f}x); first request of a session under {TARGET_FIRST_MS} ms: "
        f"{'meets' if first < TARGET_FIRST_MS else 'MISSES'} ({first:.2f} ms)"
    )
    return {
        "direct_median_ms": base,
        "gateway_median_ms": figures["gateway"]["median_ms"],
        "gateway_uncached_median_ms": figures["gateway_uncached"]["median_ms"],
        "gateway_ratio": round(figures["gateway"]["median_ms"] / base, 2) if base else None,
        "gateway_uncached_ratio": round(figures["gateway_uncached"]["median_ms"] / base, 2) if base else None,
        "minimal_proxy_ratio": round(figures["minimal_proxy"]["median_ms"] / base, 2) if base else None,
    }
