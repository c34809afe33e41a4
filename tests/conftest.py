"""Shared personas: alice and bob are verified developers, charlie is unverified, olivia is the superuser who
runs the console, otto is an operator (staff in the Operators group, nothing more), oscar is staff without
any permission; alice_client, bob_client, olivia_client and otto_client are their browsers, logged in.
Plain helpers beside them: give (credit through the ledger), balance, text (a page's visible text) and
mails_to. Launches run on the fake driver where a file asks for `cloud` (usually with usefixtures).

Below them, what both the instance lifecycle's tests and provisioning's use: the 8x MI300X KFD sysfs tree
and a stand-in /dev for it (kfd_*), and a CA with certificates for an engine behind mutual TLS (host_*)."""

import datetime
import ipaddress
import os
import re
import shutil
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from portal.accounts.models import User
from portal.credits import services as credit_services
from portal.credits.models import CreditAccount
from provisioning.drivers import fake
from provisioning.inventory import read_inventory
from provisioning.localhost import standin_devices_make

# Skipped tests fail the run unless it says why it allows them (tests/support/skips.py).
pytest_plugins = ["tests.support.skips"]

PASSWORD = "correct horse battery staple"
HOUR = 3600


def make_user(email, *, verified=True, staff=False, **extra):
    user = User.objects.create_user(
        email,
        PASSWORD,
        email_verified_at=timezone.now() if verified else None,
        is_staff=staff,
        is_superuser=staff,
        **extra,
    )
    return user


def make_staff(email, *permissions):
    """Staff holding exactly `permissions` ("app_label.codename"), for tests of who may do what."""
    from django.contrib.auth.models import Permission

    user = make_user(email)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    for name in permissions:
        app_label, codename = name.split(".", 1)
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def give(user, gpu_hours, reason="Test credit", actor=None):
    """Credit `gpu_hours` through the ledger, as an operator grant would. Returns the entry."""
    return credit_services.credits_adjust(
        user=user,
        gpu_seconds=int(gpu_hours * HOUR),
        reason=reason,
        actor=actor,
        idempotency_key=str(uuid.uuid4()),
    )


def balance(user) -> int:
    """The user's balance in GPU-seconds."""
    return CreditAccount.objects.get(user=user).balance_gpu_seconds


def text(response) -> str:
    """The page's visible text, whitespace collapsed."""
    html = re.sub(r"<(script|style).*?</\1>", " ", response.content.decode(), flags=re.DOTALL)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def mails_to(outbox, user):
    """The mails in `outbox` addressed to `user` alone."""
    return [message for message in outbox if message.to == [user.email]]


@pytest.fixture
def alice(db):
    return make_user("alice@example.com", first_name="Alice")


@pytest.fixture
def bob(db):
    return make_user("bob@example.com", first_name="Bob")


@pytest.fixture
def charlie(db):
    return make_user("charlie@example.com", verified=False, first_name="Charlie")


@pytest.fixture
def olivia(db):
    return make_user("olivia@ops.example.com", staff=True, first_name="Olivia", last_name="Operator")


@pytest.fixture
def otto(db):
    """An operator as the console means it: staff, and exactly the "Operators" group."""
    from django.contrib.auth.models import Group, Permission

    from portal.console.operators import operators_group_seed

    otto = make_user("otto@ops.example.com", first_name="Otto", last_name="Operator")
    otto.is_staff = True
    otto.save(update_fields=["is_staff"])
    # get-or-create: a transactional test may have flushed the group the migration made.
    otto.groups.set([operators_group_seed(Group, Permission)])
    return otto


@pytest.fixture
def olivia_client(olivia):
    """A browser logged in as olivia."""
    browser = Client()
    browser.force_login(olivia)
    return browser


@pytest.fixture
def otto_client(otto):
    browser = Client()
    browser.force_login(otto)
    return browser


@pytest.fixture
def oscar(db):
    """Staff without any permission: may open the console, may do nothing in it."""
    oscar = make_user("oscar@ops.example.com", first_name="Oscar")
    oscar.is_staff = True
    oscar.save(update_fields=["is_staff"])
    return oscar


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob):
    """A second browser, logged in as bob (alice_client uses the default `client`)."""
    browser = Client()
    browser.force_login(bob)
    return browser


@pytest.fixture
def cloud(settings):
    """Launches and the reconciler use the fake driver (no Docker), starting from an empty fake cloud.
    Returns the FakeCloud. A file whose every test wants it says pytest.mark.usefixtures("cloud")."""
    settings.DEVCLOUD_DRIVER = "fake"
    return fake.install()


@pytest.fixture
def meter_ticks_every_minute(settings):
    """The meter runs once a minute (METER_TICK_SECONDS), whatever the environment says."""
    settings.METER_TICK_SECONDS = 60


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    # Rate-limit counters (the "ratelimit" DatabaseCache) live in a table no migration creates.
    with django_db_blocker.unblock():
        call_command("createcachetable", verbosity=0)


def _is_transactional(request) -> bool:
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and marker.kwargs.get("transaction"):
        return True
    return bool({"transactional_db", "live_server"} & set(request.fixturenames))


@pytest.fixture(autouse=True)
def seeded_programs_after_flush(request):
    """A transactional test starts from a database the previous one emptied (Django flushes it, and
    serialized_rollback clashes with the content types Django re-creates). Put back what the migrations
    seed, so every test sees a freshly migrated database."""
    if _is_transactional(request):
        request.getfixturevalue("_django_db_helper")
        from django.contrib.auth.models import Group, Permission

        from portal.console.operators import operators_group_seed
        from portal.credits.models import BonusProgram, SignupGrantProgram
        from portal.credits.seed import seed_programs

        seed_programs(SignupGrantProgram, BonusProgram)
        operators_group_seed(Group, Permission)


@pytest.fixture(autouse=True)
def celery_runs_tasks_inline_by_default():
    """Celery reads CELERY_TASK_ALWAYS_EAGER once, on first use. If that first use happens inside a test
    that turned it off, every later test would publish to Redis instead of running tasks inline."""
    from django.conf import settings as django_settings

    from portal.celery import app

    eager = django_settings.CELERY_TASK_ALWAYS_EAGER
    app.conf.task_always_eager = eager
    yield
    app.conf.task_always_eager = eager


# --- KFD sysfs trees and a stand-in /dev ---------------------------------------------------------------

KFD_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kfd"
# The render minors of both fixture hosts, as MI300X numbers them.
MI300X_RENDER_MINORS = [128, 136, 144, 152, 160, 168, 176, 184]


@pytest.fixture
def kfd_sysfs_8gpu() -> Path:
    """sysfs root of an 8x MI300X host with one CPU node (GPU nodes 1-8)."""
    return KFD_FIXTURES / "mi300x-8gpu"


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


# --- An engine's PKI: a CA, the engine's certificate for 127.0.0.1 and the portal's client certificate ---


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def issue_certificate(subject, issuer_name, issuer_key, *, ca=False, ip=None, client=False):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
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


# --- GPU health: a host whose GPUs fail the way real ones do (provisioning/gpu_health.py) ---------------


class FakeHostFiles:
    """The host's sysfs and /dev, with ways to break one GPU the way a failing one breaks."""

    def __init__(self, root: Path):
        self.sysfs = root / "sysfs"
        shutil.copytree(KFD_FIXTURES / "mi300x-8gpu", self.sysfs)
        self.dev = make_kfd_dev_root(root / "dev-root", MI300X_RENDER_MINORS).path

    def ras(self, minor: int, block: str = "umc", *, ue: int = 0, ce: int = 0) -> None:
        path = self.sysfs / f"sys/class/drm/renderD{minor}/device/ras/{block}_err_count"
        path.write_text(f"ue: {ue}\nce: {ce}\n")

    def remove_device_node(self, minor: int) -> None:
        (self.dev / "dev" / "dri" / f"renderD{minor}").unlink()

    def drop_from_kfd(self, minor: int) -> None:
        nodes = self.sysfs / "sys/class/kfd/kfd/topology/nodes"
        for node in nodes.iterdir():
            if f"drm_render_minor {minor}\n" in (node / "properties").read_text():
                shutil.rmtree(node)


@pytest.fixture
def gpu_health_files(tmp_path):
    """The files of a GPU host whose GPUs can be broken one by one (FakeHostFiles). Needs root (mknod)."""
    if os.geteuid() != 0:
        pytest.skip("creating device nodes (mknod) needs root")
    return FakeHostFiles(tmp_path)


@pytest.fixture
def gpu_health_host(settings, gpu_health_files):
    """Host gpu-01 registered on gpu_health_files, its eight GPUs discovered."""
    from provisioning import services

    # The engine is this machine's: the heartbeat reads the host's files directly, as `make run` does.
    settings.DEVCLOUD_DRIVER = "local"
    return services.host_register(
        name="gpu-01",
        docker_url="unix:///var/run/docker.sock",
        sysfs_root=str(gpu_health_files.sysfs),
        dev_root=str(gpu_health_files.dev),
        check=False,
    )
