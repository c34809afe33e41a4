"""Provisioning fixtures: KFD sysfs trees and a stand-in /dev (kfd_*), hosts, launches and engines (host_*).

Other helpers add fixtures here too; keep to the kfd_/host_ prefixes for these.
"""

import datetime
import ipaddress
import json
import os
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from portal.instances.models import Image, Instance
from provisioning.inventory import read_inventory
from provisioning.localhost import render_gid, standin_devices_make
from provisioning.models import Gpu, GpuHost

KFD_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kfd"
# The render minors of both fixture hosts, as MI300X numbers them.
MI300X_RENDER_MINORS = [128, 136, 144, 152, 160, 168, 176, 184]


@pytest.fixture
def kfd_sysfs_8gpu() -> Path:
    """sysfs root of an 8x MI300X host with one CPU node (GPU nodes 1-8)."""
    return KFD_FIXTURES / "mi300x-8gpu"


@pytest.fixture
def kfd_sysfs_2socket() -> Path:
    """sysfs root of a 2-socket 8x MI300X host (CPU nodes 0-1, GPU nodes 2-9)."""
    return KFD_FIXTURES / "mi300x-2socket"


def render_group_gid(name: str = "render") -> int:
    """gid of the `render` group, created if missing ("video" when it cannot be)."""
    return render_gid()


@dataclass(frozen=True)
class KfdDevRoot:
    """A stand-in for a GPU host's /dev: `path` is the dev_root (it contains dev/kfd and dev/dri/)."""

    path: Path
    render_minors: list[int]
    gid: int

    def render_node(self, minor: int) -> Path:
        return self.path / "dev" / "dri" / f"renderD{minor}"

    @property
    def kfd(self) -> Path:
        return self.path / "dev" / "kfd"


def make_kfd_dev_root(root: Path, render_minors, *, gid: int | None = None) -> KfdDevRoot:
    """Create root/dev/kfd and root/dev/dri/renderD<minor> as stand-in nodes, as `make run` does (group-owned,
    0660, /dev/null's numbers). Needs root (mknod). Returns the KfdDevRoot."""
    gid = standin_devices_make(root, render_minors, gid=gid)
    return KfdDevRoot(path=root, render_minors=list(render_minors), gid=gid)


@pytest.fixture
def kfd_dev_root(tmp_path, kfd_sysfs_8gpu) -> KfdDevRoot:
    """A stand-in /dev for the 8x MI300X fixture host: dev/kfd plus one renderD<minor> per GPU."""
    if os.geteuid() != 0:
        pytest.skip("creating device nodes (mknod) needs root")
    minors = [gpu.drm_render_minor for gpu in read_inventory(kfd_sysfs_8gpu)]
    return make_kfd_dev_root(tmp_path / "host-dev", minors)


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


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def issue_certificate(subject, issuer_name, issuer_key, *, ca=False, ip=None, client=False):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip:
        names = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))])
        builder = builder.add_extension(names, critical=False)
    if client:
        usage = x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH])
        builder = builder.add_extension(usage, critical=False)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return cert, key


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


@dataclass(frozen=True)
class HostPki:
    """A CA, the engine's certificate for 127.0.0.1 and the portal's client certificate, as PEM files."""

    directory: Path
    ca_cert: str
    client_cert: str
    client_key: str

    def server_context(self, *, demand_client_certificate: bool) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.directory / "server.pem", self.directory / "server-key.pem")
        context.load_verify_locations(self.directory / "ca.pem")
        context.verify_mode = ssl.CERT_REQUIRED if demand_client_certificate else ssl.CERT_NONE
        return context


@pytest.fixture
def host_pki(tmp_path) -> HostPki:
    directory = tmp_path / "engine-pki"
    directory.mkdir()
    ca_cert, ca_key = issue_certificate("devcloud test CA", None, None, ca=True)
    server_cert, server_key = issue_certificate("engine", ca_cert.subject, ca_key, ip="127.0.0.1")
    client_cert, client_key = issue_certificate("portal", ca_cert.subject, ca_key, client=True)
    (directory / "ca.pem").write_text(pem(ca_cert))
    (directory / "server.pem").write_text(pem(server_cert))
    (directory / "server-key.pem").write_text(key_pem(server_key))
    return HostPki(directory, pem(ca_cert), pem(client_cert), key_pem(client_key))


@pytest.fixture
def host_engine_mtls(host_pki):
    """This machine's dockerd behind mutual TLS on a loopback port: what a remote GPU host should look like.

    Yields the engine settings an operator pastes into the admin (docker_url and the three PEM texts).
    """
    from tests.support.engine_forwarder import EngineForwarder

    forwarder = EngineForwarder(tls=host_pki.server_context(demand_client_certificate=True))
    yield {
        "docker_url": forwarder.url,
        "tls_ca_cert": host_pki.ca_cert,
        "tls_client_cert": host_pki.client_cert,
        "tls_client_key": host_pki.client_key,
    }
    forwarder.close()


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
