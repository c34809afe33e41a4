"""Operations on GPU hosts: register, check the Docker engine, discover GPUs, drain, cordon, retire and
reactivate. Host images are in images.py.

This is the fleet layer: it never changes an instance. Stopping instances (an operator's force stop, the
stops of a host eviction) belongs to the instance lifecycle, portal/instances/services.py, which calls
host_cordon here and then stops what it returns.
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

from portal.audit.services import audit_record
from portal.instances.models import Instance

from . import hostfs, shares
from .drivers.docker_engine import disk_limit_support
from .engine import (
    EngineSettingsError,
    build_client,
    has_tls,
    host_tls,
    private_address_for,
    refuse_insecure_endpoint,
)
from .inventory import InventoryError
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


def engine_tls(host: GpuHost) -> dict:
    """The host's TLS settings, its client key unsealed. Raises HostError when the key cannot be opened."""
    try:
        return host_tls(host)
    except EngineSettingsError as error:
        raise HostError(str(error)) from error


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
    *,
    docker_url: str,
    tls_ca_cert: str = "",
    tls_client_cert: str = "",
    tls_client_key: str = "",
    timeout: float = ENGINE_TIMEOUT_SECONDS,
) -> dict:
    """Ask an engine for its version. Returns the engine's /version answer (Version, ApiVersion, Os...).

    Raises HostUnreachable when the engine does not answer within `timeout` seconds or refuses our TLS
    credentials, and HostError when the TLS settings are incomplete.
    """
    with engine_client(
        docker_url=docker_url,
        tls_ca_cert=tls_ca_cert,
        tls_client_cert=tls_client_cert,
        tls_client_key=tls_client_key,
        timeout=timeout,
    ) as client:
        try:
            client.ping()
            return client.version()
        except (docker.errors.DockerException, requests.RequestException, OSError) as error:
            raise HostUnreachable(_unreachable_message(docker_url, error)) from error


def host_endpoint_check(
    *,
    docker_url: str,
    private_address: str | None = None,
    tls_ca_cert: str = "",
    tls_client_cert: str = "",
    tls_client_key: str = "",
) -> str:
    """Apply the rules for reaching a host before anything is saved. Returns the private address to store
    (127.0.0.1 for this machine's engine when none is given).

    Raises HostError, saying why and what to do, for an engine anyone could drive (tcp:// without TLS, or
    TLS without a client certificate), a unix:// socket registered with an address that is not this
    machine's, and a tcp:// host without a private address (or with 0.0.0.0).
    """
    try:
        refuse_insecure_endpoint(
            docker_url=docker_url,
            tls_ca_cert=tls_ca_cert,
            tls_client_cert=tls_client_cert,
            tls_client_key=tls_client_key,
        )
        return private_address_for(docker_url=docker_url, private_address=private_address)
    except EngineSettingsError as error:
        raise HostError(str(error)) from error


def host_register(
    *,
    name: str,
    docker_url: str,
    private_address: str | None = None,
    sysfs_root: str = "/",
    dev_root: str = "/",
    tls_ca_cert: str = "",
    tls_client_cert: str = "",
    tls_client_key: str = "",
    check: bool = True,
    discover: bool = True,
) -> GpuHost:
    """Add a GPU host, after checking its engine answers, and discover its GPUs. Returns the host.

    `sysfs_root` and `dev_root` are paths on the host; `private_address` is where its containers publish
    JupyterLab (see host_endpoint_check). Raises HostError (nothing saved) when host_endpoint_check
    refuses the endpoint or the TLS settings are incomplete, HostUnreachable (nothing saved) when
    `check` is on and the engine does not answer, and InventoryError (nothing saved) when `discover` is
    on and the host's KFD topology cannot be read.
    """
    tls = {"tls_ca_cert": tls_ca_cert, "tls_client_cert": tls_client_cert, "tls_client_key": tls_client_key}
    private_address = host_endpoint_check(docker_url=docker_url, private_address=private_address, **tls)
    if check:
        engine_ping(docker_url=docker_url, **tls)
    with transaction.atomic():
        host = GpuHost.objects.create(
            name=name,
            docker_url=docker_url,
            private_address=private_address,
            sysfs_root=sysfs_root,
            dev_root=dev_root,
            **tls,
        )
        if check:
            GpuHost.objects.filter(pk=host.pk).update(last_seen_at=timezone.now())
            host_disk_limits_check(host_id=host.pk)
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
            **engine_tls(host),
        )
    except HostError as error:
        GpuHost.objects.filter(pk=host_id).update(last_error=error.message)
        raise
    GpuHost.objects.filter(pk=host_id).update(last_seen_at=timezone.now(), last_error="")
    host_disk_limits_check(host_id=host_id)
    return version


def host_disk_limits_check(*, host_id: int) -> GpuHost:
    """Ask the host's engine what disk limits it can enforce (docker_engine.disk_limit_support) and store
    the answer on the host, so its page and registration say so before a launch finds out. Returns the
    host as saved. An engine that fails the question leaves the answer unknown (null) with its reason;
    raises HostError only for TLS settings that cannot be used."""
    host = GpuHost.objects.get(pk=host_id)
    values = {"disk_limits_checked_at": timezone.now()}
    with engine_client(docker_url=host.docker_url, **engine_tls(host)) as client:
        try:
            support = disk_limit_support(client)
        except (docker.errors.DockerException, requests.RequestException, OSError) as error:
            values.update(
                can_limit_workspaces=None,
                can_limit_writable_layers=None,
                disk_limits_reason=f"the engine could not be asked: {_unreachable_message(host.docker_url, error)}",
            )
        else:
            values.update(
                can_limit_workspaces=support["workspace"],
                can_limit_writable_layers=support["writable_layer"],
                engine_storage=support["storage"][:200],
                disk_limits_reason=support["reason"],
            )
    GpuHost.objects.filter(pk=host_id).update(**values)
    host.refresh_from_db()
    return host


def host_discover(*, host_id: int) -> DiscoverySummary:
    """Read the host's KFD topology and bring its Gpu rows in line. Returns what changed.

    GPUs are matched by KFD node id. New ones are added, changed ones updated, and ones that are no
    longer listed are marked is_present=False; no Gpu row is ever deleted, so a GPU an instance holds
    keeps its allocation history. Runs under the host's row lock, so the scheduler never places onto a
    half-updated host.

    The KFD topology and the group ids of the device nodes are read on the host, through its engine
    (provisioning.hostfs; directly for this machine's own engine), at the host's sysfs_root and dev_root.
    The gids are stored (GpuHost.kfd_gid, Gpu.render_gid): containers get them, so uid 1000 may open
    its GPU on that host.

    Raises InventoryError (also recorded as the host's last_error) when the topology cannot be read,
    HostFilesError (an InventoryError) when the engine cannot show it.
    """
    host = GpuHost.objects.get(pk=host_id)
    try:
        survey = hostfs.gpu_survey(host)
        inventory = survey.gpus
    except InventoryError as error:
        GpuHost.objects.filter(pk=host_id).update(last_error=f"GPU discovery failed: {error}")
        raise
    resources = shares.host_resources(host)
    summary = DiscoverySummary(host_name=host.name, present=len(inventory))
    with transaction.atomic():
        GpuHost.objects.select_for_update().get(pk=host_id)
        GpuHost.objects.filter(pk=host_id).update(kfd_gid=survey.kfd_gid)
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
                "render_gid": survey.render_gids.get(info.drm_render_minor),
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
        _host_shares_write(host_id=host_id, resources=resources, gpu_count=len(inventory))
    return summary


def _host_shares_write(*, host_id: int, resources: shares.HostResources, gpu_count: int) -> None:
    # What discovery read (where it could), and each GPU's share: the override, else an even share of it.
    host = GpuHost.objects.get(pk=host_id)
    if resources.cpus:
        host.host_cpus = resources.cpus
    if resources.memory_mb:
        host.host_memory_mb = resources.memory_mb
    if resources.disk_gb:
        host.host_disk_gb = resources.disk_gb
    computed = shares.even_shares(
        shares.HostResources(cpus=host.host_cpus, memory_mb=host.host_memory_mb), gpu_count
    )
    values = shares.effective_shares(host, computed)
    GpuHost.objects.filter(pk=host_id).update(
        host_cpus=host.host_cpus, host_memory_mb=host.host_memory_mb, host_disk_gb=host.host_disk_gb, **values
    )


def host_shares_apply(*, host_id: int) -> GpuHost:
    """Recompute the host's per-GPU shares from its overrides and what discovery last read (no engine
    call), e.g. after an operator changed an override. Returns the host as saved."""
    with transaction.atomic():
        host = GpuHost.objects.select_for_update().get(pk=host_id)
        gpu_count = Gpu.objects.filter(host_id=host_id, is_present=True).count()
        computed = shares.even_shares(
            shares.HostResources(cpus=host.host_cpus, memory_mb=host.host_memory_mb), gpu_count
        )
        GpuHost.objects.filter(pk=host_id).update(**shares.effective_shares(host, computed))
    host.refresh_from_db()
    return host


# --- Host state: drain, cordon and evict, retire, reactivate ---------------------------------------------
#
# Each runs under the host's row lock, the lock the scheduler takes before it places anything there, so
# a placement either happened before (and is seen here) or finds the host no longer active. Each is
# recorded in the audit log, in the same transaction, with the operator's reason.


class HostBusy(HostError):
    """The host still runs instances, so it cannot be retired yet."""


def _lock_host(host_id: int) -> GpuHost:
    return GpuHost.objects.select_for_update().get(pk=host_id)


def _live_instances(host: GpuHost):
    return Instance.objects.filter(host=host, state__in=Instance.LIVE_STATES).select_related("user", "image")


def _audit(*, actor, action: str, host: GpuHost, reason: str, **details):
    return audit_record(actor=actor, action=action, target=host, reason=reason, details=details)


def _refuse_retired(host: GpuHost, doing: str) -> None:
    if host.state == GpuHost.State.RETIRED:
        raise HostError(f"{host.name} is retired; mark it active first if it should {doing}.")


def host_drain(*, host_id: int, actor=None, reason: str = "") -> GpuHost:
    """Stop placing new instances on the host; running ones keep their GPUs and run on. Returns the host.

    Audited as "host.drain" with `reason`, under `actor` (None: the system). Raises HostError for a
    retired host (draining would bring it back into the fleet).
    """
    with transaction.atomic():
        host = _lock_host(host_id)
        _refuse_retired(host, "take instances again")
        previous = host.state
        GpuHost.objects.filter(pk=host_id).update(state=GpuHost.State.DRAINING)
        host.state = GpuHost.State.DRAINING
        _audit(
            actor=actor,
            action="host.drain",
            host=host,
            reason=reason,
            previous_state=previous,
            live_instances=_live_instances(host).count(),
        )
    return host


def host_cordon(*, host_id: int, actor, reason: str) -> tuple[GpuHost, list]:
    """Cordon the host for an eviction: draining, so nothing new is placed there. Audited as "host.evict"
    with `reason` and the instances on it, before anyone stops them, so the log shows the eviction even
    if a stop fails halfway. Returns (the host, ids of its live instances, oldest first); the instance
    lifecycle (portal.instances.services.host_evict) stops them.

    Raises HostError for a retired host.
    """
    with transaction.atomic():
        host = _lock_host(host_id)
        _refuse_retired(host, "be evicted")
        previous = host.state
        GpuHost.objects.filter(pk=host_id).update(state=GpuHost.State.DRAINING)
        host.state = GpuHost.State.DRAINING
        live = [instance.id for instance in _live_instances(host).order_by("created_at")]
        _audit(
            actor=actor,
            action="host.evict",
            host=host,
            reason=reason,
            previous_state=previous,
            instances=[str(instance_id) for instance_id in live],
        )
    return host, live


def host_retire(*, host_id: int, actor, reason: str) -> GpuHost:
    """Take the host out of service for good: state retired, so the scheduler never allocates its GPUs.

    Only a host with no live instance (queued with its GPUs, provisioning, running or stopping) can be
    retired. Audited as "host.retire". Returns the host.

    Raises HostBusy, naming the instances, while any is live (drain and wait, or cordon and evict
    first), and ValueError for a blank reason.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("Retiring a host needs a reason.")
    with transaction.atomic():
        host = _lock_host(host_id)
        live = list(_live_instances(host).order_by("created_at"))
        if live:
            names = ", ".join(f"{instance.short_id} ({instance.state})" for instance in live[:10])
            more = f" and {len(live) - 10} more" if len(live) > 10 else ""
            raise HostBusy(
                f"{host.name} still has {len(live)} live instance(s): {names}{more}. Drain it and wait "
                "for them to stop, or cordon and evict it, then retire it."
            )
        previous = host.state
        GpuHost.objects.filter(pk=host_id).update(state=GpuHost.State.RETIRED)
        host.state = GpuHost.State.RETIRED
        _audit(actor=actor, action="host.retire", host=host, reason=reason, previous_state=previous)
    return host


def host_activate(*, host_id: int, actor=None, reason: str = "") -> GpuHost:
    """Let the scheduler place instances on the host again (also brings back a retired one). Returns the host.

    Audited as "host.activate" with `reason`.
    """
    with transaction.atomic():
        host = _lock_host(host_id)
        previous = host.state
        GpuHost.objects.filter(pk=host_id).update(state=GpuHost.State.ACTIVE)
        host.state = GpuHost.State.ACTIVE
        _audit(actor=actor, action="host.activate", host=host, reason=reason, previous_state=previous)
    return host
