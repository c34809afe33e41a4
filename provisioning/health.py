"""Host health: a heartbeat through each host's Docker engine, and a host marked down when it misses beats.

Every HOST_HEARTBEAT_SECONDS beat pings the engine of every host that is not retired, all at once (one
thread per host, each bounded by the heartbeat timeout), so one dead host never delays the others. A
host that answers gets `last_seen_at = now`: that is the last moment its instances were confirmed alive.
A host whose last answer is older than HOST_DOWN_AFTER_MISSED_BEATS beats is marked DOWN: the scheduler
places nothing on a down host. When a down host answers again it goes back to the state it had (active,
or draining if an operator was draining it). Both moves are in the audit log ("host.down", "host.up",
actor: the system), which the host's console page shows as its health history.

What happens to the instances of a host that went down or came back is the instance lifecycle's business
(portal.instances): this module only reports which hosts moved. With a driver that runs no engine (the
`local` driver of `make run`, the tests' fake driver) the machine running the worker is the host, so it
is alive whenever the beat runs.

The same beat reads the health of every GPU of the hosts that answered (provisioning/gpu_health.py) and
drains the ones that turned unhealthy.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.audit.models import AuditEntry
from portal.audit.services import audit_record

from . import gpu_health, services
from .engine import is_local_engine
from .models import Gpu, GpuHost

# At most this many engines are pinged at the same time.
PING_THREADS = 16


@dataclass
class HeartbeatReport:
    """What one beat found: ids of the hosts checked, answering, newly down and back up."""

    checked: list[int] = field(default_factory=list)
    answering: list[int] = field(default_factory=list)
    went_down: list[int] = field(default_factory=list)
    came_back: list[int] = field(default_factory=list)
    # GPUs the health check drained this beat (provisioning/gpu_health.py), and hosts whose GPU health
    # could not be read (id -> why).
    gpus_drained: list[int] = field(default_factory=list)
    gpu_health_unknown: dict[int, str] = field(default_factory=dict)


def heartbeat_seconds() -> int:
    return settings.HOST_HEARTBEAT_SECONDS


def down_after() -> timedelta:
    """How long a host may go unheard before it is down: the missed beats the settings allow."""
    return timedelta(seconds=heartbeat_seconds() * settings.HOST_DOWN_AFTER_MISSED_BEATS)


def _ping(host: GpuHost) -> str:
    """'' when the host's engine answered, else what went wrong."""
    if settings.DEVCLOUD_DRIVER != "docker":
        return ""
    try:
        services.engine_ping(
            docker_url=host.docker_url,
            **services.engine_tls(host),
            timeout=max(1, min(services.ENGINE_TIMEOUT_SECONDS, heartbeat_seconds())),
        )
    except services.HostError as error:
        return error.message
    return ""


def hosts_heartbeat(*, now: datetime | None = None) -> HeartbeatReport:
    """Ping every host that is not retired, record who answered, and move hosts down or back up.

    Returns the HeartbeatReport. Safe to run twice at once: the state moves are conditional updates.
    """
    now = now or timezone.now()
    # A Slurm partition has no engine of its own: provisioning/slurm/clusters.py checks its cluster.
    hosts = list(GpuHost.objects.exclude(state=GpuHost.State.RETIRED).exclude(backend=GpuHost.Backend.SLURM))
    with ThreadPoolExecutor(max_workers=min(PING_THREADS, len(hosts) or 1)) as pool:
        failures = list(pool.map(_ping, hosts))
    report = HeartbeatReport(checked=[host.pk for host in hosts])
    for host, failure in zip(hosts, failures):
        if not failure:
            report.answering.append(host.pk)
            GpuHost.objects.filter(pk=host.pk).update(last_seen_at=now, last_error="")
            if host.state == GpuHost.State.DOWN and _host_back(host, now=now):
                report.came_back.append(host.pk)
            continue
        GpuHost.objects.filter(pk=host.pk).update(last_error=failure)
        heard = host.last_seen_at or host.created_at
        if host.state in (GpuHost.State.ACTIVE, GpuHost.State.DRAINING) and now - heard >= down_after():
            if _host_down(host, failure=failure, now=now):
                report.went_down.append(host.pk)
    _gpus_health(hosts, report, now=now)
    return report


def _gpus_health(hosts, report: HeartbeatReport, *, now: datetime) -> None:
    """Read the GPU health of every host that answered, all at once, then drain the unhealthy GPUs."""
    answering = [
        host
        for host in hosts
        if host.pk in report.answering
        and (settings.DEVCLOUD_DRIVER == "docker" or is_local_engine(host.docker_url))
    ]
    gpus = {host.pk: [] for host in answering}
    for gpu in Gpu.objects.filter(host_id__in=gpus.keys(), is_present=True).order_by("node_id"):
        gpus[gpu.host_id].append(gpu)
    answering = [host for host in answering if gpus[host.pk]]
    if not answering:
        return
    with ThreadPoolExecutor(max_workers=min(PING_THREADS, len(answering))) as pool:
        readings = list(pool.map(lambda host: gpu_health.host_gpus_read(host, gpus[host.pk]), answering))
    for host, reading in zip(answering, readings):
        if reading.error:
            report.gpu_health_unknown[host.pk] = reading.error
        report.gpus_drained += gpu_health.host_gpus_judge(host, gpus[host.pk], reading, now=now)


def _host_down(host: GpuHost, *, failure: str, now: datetime) -> bool:
    with transaction.atomic():
        moved = GpuHost.objects.filter(pk=host.pk, state=host.state).update(state=GpuHost.State.DOWN)
        if moved:
            audit_record(
                actor=None,
                action="host.down",
                target=host,
                reason=f"Missed heartbeats for {int((now - (host.last_seen_at or host.created_at)).total_seconds())} s: {failure}",
                details={"previous_state": host.state, "last_seen_at": host.last_seen_at},
            )
    return bool(moved)


def _host_back(host: GpuHost, *, now: datetime) -> bool:
    """Return a host that answers again to the state it had before it went down."""
    went_down = (
        AuditEntry.objects.filter(action="host.down", target_type="provisioning.gpuhost", target_id=str(host.pk))
        .order_by("-id")
        .first()
    )
    previous = (went_down.details or {}).get("previous_state") if went_down else None
    if previous not in (GpuHost.State.ACTIVE, GpuHost.State.DRAINING):
        previous = GpuHost.State.ACTIVE
    with transaction.atomic():
        moved = GpuHost.objects.filter(pk=host.pk, state=GpuHost.State.DOWN).update(state=previous)
        if moved:
            down_for = (now - went_down.created_at).total_seconds() if went_down else 0
            audit_record(
                actor=None,
                action="host.up",
                target=host,
                reason=f"The engine answers again after {int(down_for)} s down.",
                details={"state": previous},
            )
    return bool(moved)


def health_history(host: GpuHost, *, limit: int = 20) -> list[AuditEntry]:
    """The host's latest down and up moves, newest first."""
    return list(
        AuditEntry.objects.filter(
            action__in=["host.down", "host.up"], target_type="provisioning.gpuhost", target_id=str(host.pk)
        ).order_by("-id")[:limit]
    )
