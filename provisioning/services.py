"""Operations on GPU hosts: register, check the Docker engine, discover GPUs, drain, cordon and evict,
retire and reactivate; and the operator's stops of instances (one, or all of a host's).

Instance lifecycles live elsewhere (portal.instances.services, provisioning.lifecycle): the stops here go
through instance_request_stop and add the owner's notice and the audit entry. Host images are in images.py.
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
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.console.services import audit_record
from portal.instances.models import Instance
from portal.instances.services import instance_request_stop
from portal.notifications.services import StopReason, notify_instance_stopped

from .engine import (
    EngineSettingsError,
    build_client,
    has_tls,
    private_address_for,
    refuse_insecure_endpoint,
)
from . import hostfs
from .inventory import InventoryError
from .models import Gpu, GpuAllocation, GpuHost

# Seconds to wait for a Docker engine before calling it unreachable. Short, because an operator waits
# on it in the admin and a beat task must not stall on one dead host.
ENGINE_TIMEOUT_SECONDS = 5
# A GPU whose render minor must make way for another node's is parked above any real minor until it is
# rewritten, so the (host, render_minor) unique constraint holds at every statement.
PARKED_MINOR_BASE = 1_000_000
# What the owner's instance page shows for an instance stopped by a host eviction.
STOP_REASON_EVICTED = "operator: host evicted"
STOP_REASON_PREFIX = "operator: "
# Instance.stop_reason holds 200 characters, the prefix included.
FORCE_STOP_REASON_MAX = 200 - len(STOP_REASON_PREFIX)


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
    return summary


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


@dataclass
class EvictionSummary:
    """What host_evict did: instances it stopped (their owners were told) and ones already stopping."""

    host: GpuHost
    stopped: list = field(default_factory=list)
    already_stopping: list = field(default_factory=list)

    def __str__(self):
        text = f"Evicted {self.host.name}: it is draining, {len(self.stopped)} instance(s) stopped and their owners told"
        if self.already_stopping:
            text += f"; {len(self.already_stopping)} were already stopping"
        return text + "."


def host_evict(*, host_id: int, actor, reason: str) -> EvictionSummary:
    """Cordon the host (draining: nothing new is placed) and stop every instance on it, telling each owner.

    Each queued, provisioning or running instance on the host is stopped as an operator stop
    (stop_reason "operator: host evicted", charged up to now, workspace kept), and its owner gets an
    instance_stopped notice carrying `reason`. Instances already stopping are left to finish. Audited as
    "host.evict" before the stops, so the log shows the eviction even if a stop fails halfway; running
    it again stops whatever is left and tells nobody twice. Returns an EvictionSummary.

    Raises ValueError for a blank reason (the owners read it) and HostError for a retired host.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("Evicting a host needs a reason: the owners of its instances read it.")
    with transaction.atomic():
        host = _lock_host(host_id)
        _refuse_retired(host, "be evicted")
        previous = host.state
        GpuHost.objects.filter(pk=host_id).update(state=GpuHost.State.DRAINING)
        host.state = GpuHost.State.DRAINING
        live = list(_live_instances(host).order_by("created_at"))
        _audit(
            actor=actor,
            action="host.evict",
            host=host,
            reason=reason,
            previous_state=previous,
            instances=[str(instance.id) for instance in live],
        )
    summary = EvictionSummary(host=host)
    for instance in live:
        if instance.state == Instance.State.STOPPING:
            summary.already_stopping.append(instance)
            continue
        # One transaction per instance: a stop that fails (it ended meanwhile) leaves the others alone.
        stopped = _operator_stop(
            instance_id=instance.id,
            stop_reason=STOP_REASON_EVICTED,
            reason=reason,
            message=f"Stopped by an operator, who is evicting host {host.name}: {reason}",
        )
        if stopped is not None:
            summary.stopped.append(stopped)
    return summary


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


# --- Operator stops ----------------------------------------------------------------------------------
#
# The stop itself is portal.instances.services.instance_request_stop (billing ends at once, teardown is
# enqueued); an operator's stop adds the notice to the owner, in the same transaction.


def _operator_stop(*, instance_id, stop_reason: str, reason: str, message: str):
    """Stop one instance for an operator and tell its owner why. Returns the Instance, or None when it
    had already ended or was already stopping for another reason (then nobody is told anything)."""
    with transaction.atomic():
        try:
            instance = instance_request_stop(
                instance_id=instance_id, stop_reason=stop_reason, message=message
            )
        except ValidationError:
            return None
        if instance.stop_reason != stop_reason:
            return None  # it was stopping already, for its own reason
        notify_instance_stopped(instance=instance, reason=StopReason.OPERATOR, operator_reason=reason)
    return instance


def instance_force_stop(*, instance_id, actor, reason: str):
    """An operator stops one instance. Returns it (stopping, or stopped if it was still queued).

    The owner sees `reason` on their instance page (stop_reason "operator: <reason>") and in the
    instance_stopped email; the audit log records it as "instance.force_stop". Billing ends at once.

    Raises ValueError for a blank reason or one longer than FORCE_STOP_REASON_MAX characters, and
    django's ValidationError when the instance has already ended or is already stopping.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("A force stop needs a reason: the owner reads it.")
    if len(reason) > FORCE_STOP_REASON_MAX:
        raise ValueError(f"Keep the reason within {FORCE_STOP_REASON_MAX} characters.")
    with transaction.atomic():
        before = Instance.objects.select_related("user", "host").get(id=instance_id)
        if before.state == Instance.State.STOPPING:
            raise ValidationError("This instance is already stopping.")
        instance = _operator_stop(
            instance_id=instance_id,
            stop_reason=f"{STOP_REASON_PREFIX}{reason}",
            reason=reason,
            message=f"Stopped by an operator: {reason}",
        )
        if instance is None:
            raise ValidationError(f"This instance has already {before.state}.")
        audit_record(
            actor=actor,
            action="instance.force_stop",
            target=instance,
            reason=reason,
            details={
                "owner": before.user.email,
                "previous_state": before.state,
                "host": before.host.name if before.host_id else "",
            },
        )
    return instance
