"""Provisioning fixtures: the 2-socket KFD sysfs tree (kfd_*), and hosts, launches and engines (host_*).

The 8x MI300X tree, its stand-in /dev (kfd_dev_root) and the engine PKI (host_pki, host_engine_mtls) are in
tests/conftest.py: the instance lifecycle's tests use them too. Other helpers add fixtures here too; keep to
the kfd_/host_ prefixes for these.
"""

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from portal.instances.models import Image, Instance
from provisioning.localhost import render_gid
from provisioning.models import Gpu, GpuHost
from tests.conftest import KFD_FIXTURES, issue_certificate, key_pem, pem


@pytest.fixture
def kfd_sysfs_2socket() -> Path:
    """sysfs root of a 2-socket 8x MI300X host (CPU nodes 0-1, GPU nodes 2-9)."""
    return KFD_FIXTURES / "mi300x-2socket"


def render_group_gid(name: str = "render") -> int:
    """gid of the `render` group, created if missing ("video" when it cannot be)."""
    return render_gid()


@pytest.fixture
def host_make(db):
    """Factory: host_make("gpu-01", gpus=8, state=ACTIVE) makes a host with GPU rows (no sysfs needed)."""

    def make(name, *, gpus=8, state=GpuHost.State.ACTIVE, docker_url="unix:///var/run/docker.sock"):
        host = GpuHost.objects.create(name=name, state=state, docker_url=docker_url)
        Gpu.objects.bulk_create(
            [
                Gpu(
                    host=host,
                    node_id=index + 1,
                    gpu_id=20000 + index,
                    render_minor=128 + 8 * index,
                    location_id=(0x05 + 0x20 * index) << 8,
                    vram_bytes=206141652992,
                )
                for index in range(gpus)
            ]
        )
        return host

    return make


@pytest.fixture
def host_image(db) -> Image:
    """An enabled image every size may launch."""
    image, _ = Image.objects.get_or_create(
        key="cpu-sched",
        defaults={
            "name": "CPU JupyterLab",
            "sizes": ["1x", "8x"],
            "reference": "devcloud/cpu:test",
            "needs_gpu": False,
        },
    )
    return image


@pytest.fixture
def host_queued_instance(host_image):
    """Factory: host_queued_instance(user, size="1x") makes a QUEUED instance, as a launch leaves it."""

    def make(user, size="1x"):
        return Instance.objects.create(user=user, size=size, image=host_image, state=Instance.State.QUEUED)

    return make


# --- A Docker engine behind mutual TLS, on loopback ---------------------------------------------------


@pytest.fixture
def host_tls_engine(tmp_path):
    """A stand-in Docker engine on 127.0.0.1 that speaks HTTPS and demands a client certificate from our CA.

    It answers /version and /_ping the way dockerd does; that is all engine_ping asks. Yields a dict with
    the URL and the PEM texts an operator would paste into the admin.
    """
    ca_cert, ca_key = issue_certificate("devcloud test CA", None, None, ca=True)
    server_cert, server_key = issue_certificate("engine", ca_cert.subject, ca_key, ip="127.0.0.1")
    client_cert, client_key = issue_certificate("portal", ca_cert.subject, ca_key, client=True)
    (tmp_path / "ca.pem").write_text(pem(ca_cert))
    (tmp_path / "server.pem").write_text(pem(server_cert))
    (tmp_path / "server-key.pem").write_text(key_pem(server_key))

    class Engine(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith("/_ping"):
                body, kind = b"OK", "text/plain"
            elif self.path.endswith("/version"):
                version = {"Version": "20.10.24-standin", "ApiVersion": "1.41", "Os": "linux"}
                body = json.dumps(version).encode()
                kind = "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server-key.pem")
    context.load_verify_locations(tmp_path / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED

    class TlsServer(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):
            sock, address = super().get_request()
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

        def handle_error(self, request, client_address):
            pass  # a refused handshake is what some tests want

    server = TlsServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {
        "docker_url": f"tcp://127.0.0.1:{server.server_address[1]}",
        "tls_ca_cert": pem(ca_cert),
        "tls_client_cert": pem(client_cert),
        "tls_client_key": key_pem(client_key),
    }
    server.shutdown()
    server.server_close()


# --- The real local Docker engine behind TCP, as a remote host's engine looks to the portal ---------------


@pytest.fixture
def host_engine_plain_tcp():
    """This machine's dockerd on a loopback TCP port without TLS (dockerd -H tcp://0.0.0.0:2375). Yields the URL."""
    from tests.support.engine_forwarder import EngineForwarder

    forwarder = EngineForwarder()
    yield forwarder.url
    forwarder.close()


@pytest.fixture
def host_engine_tls_any_client(host_pki):
    """This machine's dockerd behind TLS that asks no client certificate (dockerd --tls without --tlsverify).

    Yields the settings without a client certificate: the engine answers anyone who can reach it.
    """
    from tests.support.engine_forwarder import EngineForwarder

    forwarder = EngineForwarder(tls=host_pki.server_context(demand_client_certificate=False))
    yield {"docker_url": forwarder.url, "tls_ca_cert": host_pki.ca_cert}
    forwarder.close()
