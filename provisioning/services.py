"""Operations on GPU hosts: register, check the Docker engine, discover GPUs, drain and reactivate.

Instance operations live elsewhere; this module only changes GpuHost and Gpu rows.
"""

import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field

import docker
import docker.errors
import docker.tls
import requests
from django.db import transaction
from django.utils import timezone

from .engine import EngineSettingsError, build_client, has_tls
from .inventory import InventoryError, read_inventory
from .models import Gpu, GpuAllocation, GpuHost

# Seconds to wait for a Docker engine before calling it unreachable. Short, because an operator waits
# on it in the admin and a beat task must not stall on one dead host.
ENGINE_TIMEOUT_SECONDS = 5
# A GPU whose render minor must make way for another node's is parked above any real minor until it is
# rewritten, so the (host, render_minor) unique constraint holds at every statement.
PARKED_MINOR_BASE = 1_000_000


class HostError(Exception):
    """A host operation failed for a reason an operator can act on; `message` says which."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class HostUnreachable(HostError):
    """The host's Docker engine did not answer."""


@dataclass
class DiscoverySummary:
    """What host_discover changed."""

    host_name: str
    present: int = 0
    added: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)
    # Node ids of vanished GPUs that an instance still holds: the operator should look at those.
    vanished_held: list[int] = field(default_factory=list)

    def __str__(self):
        parts = [f"{self.host_name}: {self.present} GPU(s) present"]
        if self.added:
            parts.append(f"added nodes {_nodes(self.added)}")
        if self.updated:
            parts.append(f"updated nodes {_nodes(self.updated)}")
        if self.vanished:
            parts.append(f"vanished nodes {_nodes(self.vanished)}")
        if self.vanished_held:
            parts.append(f"still held by an instance: nodes {_nodes(self.vanished_held)}")
        return "; ".join(parts)


def _nodes(node_ids):
    return ", ".join(str(node_id) for node_id in node_ids)


@contextmanager
def engine_client(
    *,
    docker_url: str,
    tls_ca_cert: str = "",
    tls_client_cert: str = "",
    tls_client_key: str = "",
    timeout: float = ENGINE_TIMEOUT_SECONDS,
):
    """Yield a docker.DockerClient for an engine, closed (and its PEM files removed) on exit.

    Raises HostError when the TLS settings are incomplete or given for a unix socket.
    """
    tls = dict(tls_ca_cert=tls_ca_cert, tls_client_cert=tls_client_cert, tls_client_key=tls_client_key)
    pem_dir = tempfile.mkdtemp(prefix="devcloud-engine-") if has_tls(**tls) else None
    client = None
    try:
        try:
            client = build_client(docker_url=docker_url, timeout=timeout, pem_dir=pem_dir, **tls)
        except EngineSettingsError as error:
            raise HostError(str(error)) from error
        yield client
    finally:
        if client is not None:
            client.close()
        if pem_dir is not None:
            shutil.rmtree(pem_dir, ignore_errors=True)


def _unreachable_message(docker_url: str, error: Exception) -> str:
    text = str(error)
    # The SDK wraps the real cause in several layers of urllib3 text; dig out the part a person can act on.
    if isinstance(error, requests.exceptions.SSLError) or "[SSL" in text:
        found = re.search(r"\[SSL[^\]]*\][^\"'(]*", text)
        detail = found.group(0).strip() if found else "certificate or key rejected"
        reason = f"TLS handshake failed ({detail})"
    elif isinstance(error, requests.exceptions.Timeout) or "timed out" in text:
        reason = "no answer (timed out)"
    elif found := re.search(r"\[Errno -?\d+\] ([^\"')]+)", text):
        reason = found.group(1).strip()
    elif "FileNotFoundError" in text:
        reason = "No such file or directory"
    elif "RemoteDisconnected" in text:
        reason = "the other end closed the connection without answering (is it a Docker engine?)"
    else:
        reason = (text.strip() or type(error).__name__).splitlines()[0][:300]
    return f"Cannot reach the Docker engine at {docker_url}: {reason}"


def engine_ping(
    *, docker_url: str, tls_ca_cert: str = "", tls_client_cert: str = "", tls_client_key: str = ""
) -> dict:
    """Ask an engine for its version. Returns the engine's /version answer (Version, ApiVersion, Os...).

    Raises HostUnreachable when the engine does not answer within ENGINE_TIMEOUT_SECONDS or refuses our
    TLS credentials, and HostError when the TLS settings are incomplete.
    """
    with engine_client(
        docker_url=docker_url,
        tls_ca_cert=tls_ca_cert,
        tls_client_cert=tls_client_cert,
        tls_client_key=tls_client_key,
    ) as client:
        try:
            client.ping()
            return client.version()
        except (docker.errors.DockerException, requests.RequestException, OSError) as error:
            raise HostUnreachable(_unreachable_message(docker_url, error)) from error


def host_register(
    *,
    name: str,
    docker_url: str,
    sysfs_root: str = "/",
    dev_root: str = "/",
    tls_ca_cert: str = "",
    tls_client_cert: str = "",
    tls_client_key: str = "",
    check: bool = True,
    discover: bool = True,
) -> GpuHost:
    """Add a GPU host, after checking its engine answers, and discover its GPUs. Returns the host.

    Raises HostUnreachable (nothing saved) when `check` is on and the engine does not answer, HostError
    for incomplete TLS settings, and InventoryError (nothing saved) when `discover` is on and the host's
    KFD topology cannot be read.
    """
    tls = {"tls_ca_cert": tls_ca_cert, "tls_client_cert": tls_client_cert, "tls_client_key": tls_client_key}
    if check:
        engine_ping(docker_url=docker_url, **tls)
    with transaction.atomic():
        host = GpuHost.objects.create(
            name=name, docker_url=docker_url, sysfs_root=sysfs_root, dev_root=dev_root, **tls
        )
        if check:
            GpuHost.objects.filter(pk=host.pk).update(last_seen_at=timezone.now())
        if discover:
            host_discover(host_id=host.pk)
    host.refresh_from_db()
    return host


def host_check(*, host_id: int) -> dict:
    """Ping the host's Docker engine and record the outcome on the host (last_seen_at or last_error).

    Returns the engine's /version answer. Raises HostUnreachable, with a message naming the endpoint,
    when it does not answer; the host's state is left to the operator and the reconciler.
    """
    host = GpuHost.objects.get(pk=host_id)
    try:
        version = engine_ping(
            docker_url=host.docker_url,
            tls_ca_cert=host.tls_ca_cert,
            tls_client_cert=host.tls_client_cert,
            tls_client_key=host.tls_client_key,
        )
    except HostError as error:
        GpuHost.objects.filter(pk=host_id).update(last_error=error.message)
        raise
    GpuHost.objects.filter(pk=host_id).update(last_seen_at=timezone.now(), last_error="")
    return version


def host_discover(*, host_id: int) -> DiscoverySummary:
    """Read the host's KFD topology and bring its Gpu rows in line. Returns what changed.

    GPUs are matched by KFD node id. New ones are added, changed ones updated, and ones that are no
    longer listed are marked is_present=False; no Gpu row is ever deleted, so a GPU an instance holds
    keeps its allocation history. Runs under the host's row lock, so the scheduler never places onto a
    half-updated host.

    The sysfs tree is read from this (the portal's) filesystem at host.sysfs_root: "/" when the portal
    runs on the GPU host, otherwise a copy that is mounted or synced from the remote host. Reading it
    through the host's Docker engine is future work.

    Raises InventoryError (also recorded as the host's last_error) when the topology cannot be read.
    """
    host = GpuHost.objects.get(pk=host_id)
    try:
        inventory = read_inventory(host.sysfs_root)
    except InventoryError as error:
        GpuHost.objects.filter(pk=host_id).update(last_error=f"GPU discovery failed: {error}")
        raise
    summary = DiscoverySummary(host_name=host.name, present=len(inventory))
    with transaction.atomic():
        GpuHost.objects.select_for_update().get(pk=host_id)
        existing = {gpu.node_id: gpu for gpu in Gpu.objects.filter(host_id=host_id)}
        incoming = {info.node_id: info for info in inventory}
        incoming_minors = {info.drm_render_minor for info in inventory}

        # Step 1: move aside every minor that another node is about to take (GPUs renumbered after a
        # reboot or a swap), so step 2 never trips the (host, render_minor) unique constraint.
        for node_id, gpu in existing.items():
            info = incoming.get(node_id)
            keeps_minor = info is not None and info.drm_render_minor == gpu.render_minor
            if not keeps_minor and gpu.render_minor in incoming_minors:
                gpu.render_minor = PARKED_MINOR_BASE + gpu.pk
                gpu.save(update_fields=["render_minor"])

        # Step 2: write what the kernel says.
        for node_id, info in incoming.items():
            values = {
                "gpu_id": info.gpu_id,
                "render_minor": info.drm_render_minor,
                "location_id": info.location_id,
                "unique_id": info.unique_id,
                "vram_bytes": info.vram,
                "is_present": True,
            }
            gpu = existing.get(node_id)
            if gpu is None:
                Gpu.objects.create(host_id=host_id, node_id=node_id, **values)
                summary.added.append(node_id)
                continue
            changed = [name for name, value in values.items() if getattr(gpu, name) != value]
            if changed:
                for name in changed:
                    setattr(gpu, name, values[name])
                gpu.save(update_fields=changed)
                summary.updated.append(node_id)

        vanished = [gpu for node_id, gpu in existing.items() if node_id not in incoming and gpu.is_present]
        if vanished:
            Gpu.objects.filter(pk__in=[gpu.pk for gpu in vanished]).update(is_present=False)
            summary.vanished = sorted(gpu.node_id for gpu in vanished)
            held = GpuAllocation.objects.filter(gpu__in=vanished, released_at__isnull=True)
            summary.vanished_held = sorted(set(held.values_list("gpu__node_id", flat=True)))
        GpuHost.objects.filter(pk=host_id).update(last_error="")
    return summary


def _host_set_state(host_id: int, state: str) -> GpuHost:
    GpuHost.objects.filter(pk=host_id).update(state=state)
    return GpuHost.objects.get(pk=host_id)


def host_drain(*, host_id: int) -> GpuHost:
    """Stop placing new instances on the host; running ones keep their GPUs. Returns the host."""
    return _host_set_state(host_id, GpuHost.State.DRAINING)


def host_activate(*, host_id: int) -> GpuHost:
    """Let the scheduler place instances on the host again. Returns the host."""
    return _host_set_state(host_id, GpuHost.State.ACTIVE)
