"""Time to the first streamed chunk from an exposed port: through the gateway against straight to the app.

A real instance container of the CPU image runs the tests' small app (tests/support/port_app.py) on
port 8000; its /stream sends one server-sent event, then holds the response open until told to finish.
The portal runs as the deploy kit's web unit runs it (benchmarks.start_kit_web, production settings)
on a scratch PostgreSQL database, with the port exposed to a signed-in owner who holds the port's
cookie. Each sample opens the stream and times from sending the request to receiving the first event,
then releases it and reads the rest. The two routes alternate, one sample each, on kept-alive
connections, so both see the same machine load:
- direct:  GET http://<container address>:8000/stream, as a client next to the container would;
- gateway: the same through the portal, on the port's own host (`<short id>-8000.localhost`) with the
  owner's port cookie: the owner's access decision, remembered for a few seconds as for the lab (a
  page's burst comes from one browser), the traffic note for idle culling (at most every 30 s) and the
  streamed hop;
- gateway_share: the same with a share link's cookie, decided afresh on every request (the session,
  the port's and the link's rows), as a revoked link must be refused at once.

The figure is the gateway's median over the direct median, in the same run, with the medians.
"""

import logging
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx

from benchmarks import database_url, ensure_cpu_image, scratch_database, start_kit_web, summarize_ms

DATABASE = "devcloud_bench_expose"
SAMPLES = 100
WARMUP = 10
# Production names the lab cookie, which an exposed port's host uses too, __Host-devcloud_lab.
PRODUCTION_PORT_COOKIE = "__Host-devcloud_lab"


def _first_chunk(client: httpx.Client, url: str, release, stream_id: str, **kwargs) -> float:
    """Seconds from sending the request to the first event; then releases the stream and drains it."""
    started = time.perf_counter()
    with client.stream("GET", url, params={"id": stream_id}, **kwargs) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}: {response.read()[:200]!r}")
        received = b""
        chunks = response.iter_raw()
        while b"data: first\n\n" not in received:
            received += next(chunks)
        elapsed = time.perf_counter() - started
        release(stream_id)
        for _ in chunks:
            pass
    return elapsed


def main() -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from portal.accounts.models import User
    from portal.gateway import tickets
    from portal.instances.models import Image, Instance
    from portal.ports.models import ExposedPort, ShareLink
    from tests.gateway.helpers import free_port, wait_until
    from tests.support.docker_instances import remove_portal_objects
    from tests.support.port_app import APP_PORT, start_instance_container

    reference = ensure_cpu_image()
    portal_id = f"bench-expose-{uuid.uuid4().hex[:10]}"
    with scratch_database(DATABASE), tempfile.TemporaryDirectory(prefix="bench-expose-") as scratch:
        scratch = Path(scratch)
        portal = None
        try:
            box = start_instance_container(reference, portal_id)
            user = User.objects.create_user("bench@example.com", "bench-password-0123")
            image = Image.objects.create(key="cpu", name="CPU", sizes=["1x"], reference=reference)
            instance = Instance.objects.create(
                id=box.instance_id,
                user=user,
                size="1x",
                image=image,
                state=Instance.State.RUNNING,
                jupyter_token=box.token,
                driver_state={"endpoint": box.endpoint, "address": box.address},
            )
            label = f"{instance.short_id}-{APP_PORT}"
            ExposedPort.objects.create(instance=instance, port=APP_PORT, host_label=label)
            port = free_port()
            portal = start_kit_web(port, database_url(connection.settings_dict), scratch / "portal.log")
            gateway_url = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: httpx.get(f"{gateway_url}/accounts/login/").status_code == 200,
                timeout=60,
                what="the portal to answer",
            )
            browser = Client()
            browser.force_login(user)
            session_key = browser.session.session_key
            # What the owner's browser holds on the port's host after the handshake (port_hosts.py).
            cookie = tickets.seal("port", i=label, k=session_key, s=0)
            # A share link's holder (anyone with the link): the port cookie its redeem sets names it.
            link = ShareLink.objects.create(
                exposed_port=ExposedPort.objects.get(host_label=label),
                secret_digest="0" * 64,
                prefix="bench",
                expires_at=timezone.now() + timedelta(hours=1),
            )
            share_cookie = tickets.seal("port", i=label, k="", s=link.id)
            on_port_host = {
                "Host": f"{label}.localhost:{port}",
                "Cookie": f"{PRODUCTION_PORT_COOKIE}={cookie}",
            }
            direct_url, gateway_stream = f"{box.app_url}/stream", f"{gateway_url}/stream"
            on_port_host_shared = {**on_port_host, "Cookie": f"{PRODUCTION_PORT_COOKIE}={share_cookie}"}
            samples: dict[str, list[float]] = {"direct": [], "gateway": [], "gateway_share": []}
            with (
                httpx.Client(timeout=30) as to_app,
                httpx.Client(timeout=30, headers=on_port_host) as to_gateway,
                httpx.Client(timeout=30, headers=on_port_host_shared) as to_gateway_shared,
            ):
                routes = {
                    "direct": lambda n: _first_chunk(to_app, direct_url, box.release, f"d{n}"),
                    "gateway": lambda n: _first_chunk(to_gateway, gateway_stream, box.release, f"g{n}"),
                    "gateway_share": lambda n: _first_chunk(
                        to_gateway_shared, gateway_stream, box.release, f"s{n}"
                    ),
                }
                for n in range(WARMUP + SAMPLES):
                    for name, route in routes.items():
                        elapsed = route(n)
                        if n >= WARMUP:
                            samples[name].append(elapsed)
        finally:
            if portal is not None:
                portal.terminate()
                portal.wait(30)
            remove_portal_objects(portal_id)
    summaries = {name: summarize_ms(values) for name, values in samples.items()}
    direct = summaries["direct"]["median_ms"]
    print(f"first streamed chunk, {SAMPLES} samples a route, alternating:")
    for name, summary in summaries.items():
        print(f"  {name:14} {summary}")
    figures = {f"{name}_first_chunk_median_ms": summary["median_ms"] for name, summary in summaries.items()}
    for name in ("gateway", "gateway_share"):
        figures[f"{name}_over_direct"] = round(summaries[name]["median_ms"] / direct, 2)
        print(f"  {name} / direct (median): {figures[f'{name}_over_direct']}")
    return figures
