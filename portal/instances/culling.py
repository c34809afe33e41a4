"""Idle culling: stop running instances nobody is using, after warning their owners.

An instance counts as idle when JupyterLab shows no activity AND its GPUs show no use:
- JupyterLab: /api/status `last_activity` (API requests, kernel messages, terminals), and each kernel's
  and terminal's `last_activity`. A kernel whose execution_state is "busy" is activity however long it
  has been silent, so a cell that trains for hours is never idle. The culler's own requests carry
  `no_track_activity`, so looking does not count as using.
- GPUs: `gpu_busy_percent` of each GPU the instance holds, from the host's sysfs. amdgpu exposes it in
  the render node's device directory, `<sysfs_root>/sys/class/drm/renderD<minor>/device/gpu_busy_percent`
  (the counter amd-smi reports as GFX activity; reading the file needs no subprocess, so amd-smi is not
  used). It is read on the host, through its engine (provisioning/hostfs.py: one helper container per
  host and round; directly for this machine's own engine). Above settings.IDLE_GPU_BUSY_PERCENT on any
  GPU is activity: a job started from a shell keeps its instance.
  Where no file can be read (an older driver, or a host whose engine does not answer), GPU use is
  unknown and JupyterLab alone decides.
- SSH: an open session through the SSH gateway (portal/sshgateway records them, with a heartbeat) is
  use, whatever JupyterLab says: someone working in a terminal over SSH never touches JupyterLab. When
  the last one ends, the idle clock starts from its end.
- Exposed ports: traffic the gateway carried to one of the instance's exposed ports (portal/ports; the
  gateway writes it down at most every half minute, and every ten seconds while a websocket is open) is
  use: people using a web app served from the instance never touch JupyterLab either.

The idle clock, `idle_since`, is the latest of: JupyterLab's activity, `ready_at`, the end of the last
SSH session, the last traffic to an exposed port, and the last time
this culler saw the GPUs busy or go idle again. Those GPU sightings are written to the instance's
timeline ("GPUs busy...", "GPUs idle again...") only when they change and no kernel is busy (a busy
kernel explains itself), so that the clock survives between rounds and the owner can see why the
instance was kept or stopped. Every GPU reading, whatever else keeps or skips the instance, is also
added to its sampled and busy GPU-seconds for the efficiency report (portal/instances/efficiency.py).

Past the policy's idle minutes for the size (LaunchPolicy.idle_minutes_for; 0 means never culled) the
owner is warned. The warning is a Notification whose event key names the idle stretch by `idle_since`;
it is also the record of when the grace period began. If `idle_since` is the same once the grace
minutes have passed, the instance is stopped (stop_reason "idle"; the workspace is kept) and the owner
told. Any activity moves `idle_since`, which names a new stretch: the old warning no longer counts, and
a new one must be sent before any stop.

A JupyterLab that does not answer is not evidence of idleness: the instance is skipped this round (the
reconciler deals with containers that are gone). The server answering is the tenant's (its owner controls
the container), so "does not answer" includes: not done within PROBE_DEADLINE_SECONDS for its three
requests together (a server that dribbles bytes forever), an answer larger than PROBE_MAX_BYTES, and a
compressed one. Such an instance is neither busy nor idle this round; it only keeps running, on its
owner's credit, as an instance whose JupyterLab is down would. One hostile lab costs a round at most the
deadline, and the others are asked at the same time. Safe to run twice or concurrently: the warning and the
stop email are sent once per event, and instance_request_stop leaves a stopping instance alone.
"""

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from portal.gateway import lab_path
from portal.notifications.models import Kind, Notification
from portal.notifications.services import notify_instance_idle_warning, notify_instance_stopped
from portal.ports.selectors import last_port_traffic
from portal.sshgateway.selectors import last_session_activity, open_session_instance_ids
from provisioning import hostfs

from . import services
from .efficiency import gpu_samples_record
from .models import Instance, InstanceEvent, LaunchPolicy
from .stop_reasons import StopReason
from .transitions import event_record as instance_event_record

logger = logging.getLogger(__name__)

# Default of settings.IDLE_GPU_BUSY_PERCENT: utilisation above this, on any GPU the instance holds, counts
# as use (an idle MI300X reads 0-2%).
GPU_BUSY_PERCENT = 5
# How the GPU sightings start on the timeline; the culler reads its last one back by these prefixes.
GPU_EVENT_BUSY = "GPUs busy"
GPU_EVENT_IDLE = "GPUs idle again"
# JupyterLabs asked at once. Each is asked three short questions.
PROBE_WORKERS = 32
# Per connect and per read; a server that sends a byte every second never trips these, hence the deadline.
PROBE_TIMEOUT = httpx.Timeout(3.0, connect=1.0)
# All three questions to one JupyterLab, answers included, end within this, however its server behaves.
PROBE_DEADLINE_SECONDS = 10.0
# A real answer is a few KiB (a list of hundreds of kernels stays far below this).
PROBE_MAX_BYTES = 1024 * 1024


class JupyterUnreachable(Exception):
    """JupyterLab did not answer, refused the token, or answered something unexpected."""


@dataclass(frozen=True)
class JupyterActivity:
    """What JupyterLab says about its use."""

    # The latest of /api/status last_activity and every kernel's and terminal's.
    last_activity: datetime
    kernels: int
    busy_kernels: int
    terminals: int
    # Open kernel websockets (browser tabs). Reported, not counted: an open tab is not use by itself.
    connections: int


@dataclass
class CullReport:
    """What one round did."""

    checked: int = 0
    # JupyterLab did not answer: skipped this round.
    unreachable: int = 0
    # A busy kernel or a busy GPU right now.
    busy: int = 0
    # Idle, but for less than the idle time (or warned and within the grace period).
    idle: int = 0
    warned: int = 0
    stopped: int = 0


def lab_api_url(instance, endpoint: str, path: str) -> str:
    """URL of JupyterLab's REST API `path` for the instance, under the base URL the drivers give it."""
    return f"{endpoint.rstrip('/')}{lab_path(instance.id)}api/{path}"


def _parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def _get_json(client: httpx.AsyncClient, url: str, *, headers: dict, params=None):
    """GETs `url`; returns (status, the JSON body for a 200, else None).

    Reads at most PROBE_MAX_BYTES, uncompressed (so the cap is what lands in memory). Raises
    JupyterUnreachable for a larger or compressed answer, and httpx errors as they come.
    """
    # identity: a small gzip answer could inflate to gigabytes past the cap.
    headers = {**headers, "Accept-Encoding": "identity"}
    async with client.stream("GET", url, headers=headers, params=params) as response:
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            raise JupyterUnreachable(f"compressed answer ({response.headers['content-encoding']})")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > PROBE_MAX_BYTES:
            raise JupyterUnreachable(f"answer of {declared} bytes, more than {PROBE_MAX_BYTES}")
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > PROBE_MAX_BYTES:
                raise JupyterUnreachable(f"answer longer than {PROBE_MAX_BYTES} bytes")
    return response.status_code, json.loads(body) if response.status_code == 200 else None


async def jupyter_activity(client: httpx.AsyncClient, instance, endpoint: str) -> JupyterActivity:
    """Ask the instance's JupyterLab how it is used: /api/status, /api/kernels and /api/terminals.

    Returns a JupyterActivity. Raises JupyterUnreachable when a request fails, is refused (wrong token),
    gets an answer that cannot be read or is too large, or when the three together take longer than
    PROBE_DEADLINE_SECONDS. Terminals turned off (404) count as no terminals.
    """
    headers = {"Authorization": f"token {instance.jupyter_token}"}
    # Without it, listing kernels and terminals would itself count as API activity.
    quiet = {"no_track_activity": "1"}
    try:
        async with asyncio.timeout(PROBE_DEADLINE_SECONDS):
            status, status_body = await _get_json(
                client, lab_api_url(instance, endpoint, "status"), headers=headers
            )
            if status != 200:
                raise JupyterUnreachable(f"/api/status answered {status}")
            status, kernel_list = await _get_json(
                client, lab_api_url(instance, endpoint, "kernels"), headers=headers, params=quiet
            )
            if status != 200:
                raise JupyterUnreachable(f"/api/kernels answered {status}")
            status, terminal_list = await _get_json(
                client, lab_api_url(instance, endpoint, "terminals"), headers=headers, params=quiet
            )
            if status not in (200, 404):
                raise JupyterUnreachable(f"/api/terminals answered {status}")
        terminal_list = terminal_list if status == 200 else []
        times = [_parse_time(status_body["last_activity"])] + [
            _parse_time(item["last_activity"])
            for item in [*kernel_list, *terminal_list]
            if item.get("last_activity")
        ]
        return JupyterActivity(
            last_activity=max(times),
            kernels=len(kernel_list),
            busy_kernels=sum(1 for kernel in kernel_list if kernel.get("execution_state") == "busy"),
            terminals=len(terminal_list),
            connections=int(status_body.get("connections") or 0),
        )
    except TimeoutError as error:
        raise JupyterUnreachable(f"no complete answer within {PROBE_DEADLINE_SECONDS} seconds") from error
    except httpx.HTTPError as error:
        raise JupyterUnreachable(f"{type(error).__name__}: {error}") from error
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise JupyterUnreachable(f"unreadable answer ({type(error).__name__}: {error})") from error


def _running_instances():
    gpu_sightings = InstanceEvent.objects.filter(
        Q(message__startswith=GPU_EVENT_BUSY) | Q(message__startswith=GPU_EVENT_IDLE), instance=OuterRef("pk")
    ).order_by("-created_at", "-id")
    return list(
        Instance.objects.filter(state=Instance.State.RUNNING, ready_at__isnull=False)
        .select_related("user", "image", "host")
        .annotate(
            gpu_sighting=Subquery(gpu_sightings.values("message")[:1]),
            gpu_sighting_at=Subquery(gpu_sightings.values("created_at")[:1]),
        )
        .order_by("ready_at")
    )


def _probe_all(instances) -> dict:
    """instance id -> JupyterActivity, or the JupyterUnreachable it raised. Asks PROBE_WORKERS at a time.

    Returns within about PROBE_DEADLINE_SECONDS per PROBE_WORKERS instances, whatever they answer.
    """
    if not instances:
        return {}
    return asyncio.run(_probe_all_async(instances))


async def _probe_all_async(instances) -> dict:
    limits = httpx.Limits(max_connections=PROBE_WORKERS, max_keepalive_connections=PROBE_WORKERS)
    at_once = asyncio.Semaphore(PROBE_WORKERS)
    # trust_env=False: a proxy from the environment must never sit between the portal and an instance.
    async with httpx.AsyncClient(
        timeout=PROBE_TIMEOUT, trust_env=False, follow_redirects=False, limits=limits
    ) as client:

        async def probe(instance):
            async with at_once:
                try:
                    return await jupyter_activity(client, instance, instance.driver_state["endpoint"])
                except JupyterUnreachable as error:
                    return error

        results = await asyncio.gather(*(probe(instance) for instance in instances))
    return dict(zip([i.id for i in instances], results))


@dataclass
class _Idle:
    instance: Instance
    idle_since: datetime
    idle_minutes: int


def cull_idle(now: datetime | None = None) -> CullReport:
    """One round over every running instance: warn the owners of those idle past their size's idle time,
    and stop those still idle (the same idle stretch) a grace period after the warning.

    `now` is the moment of the round (tests pass a later one to move time forward); what the round
    writes (warnings, GPU sightings) carries the database's clock. Returns a CullReport. Raises nothing
    for an instance that cannot be reached or that someone else stops meanwhile; it is skipped.
    """
    now = now or timezone.now()
    policy = LaunchPolicy.current()
    busy_percent = getattr(settings, "IDLE_GPU_BUSY_PERCENT", GPU_BUSY_PERCENT)
    report = CullReport()
    instances = [
        instance
        for instance in _running_instances()
        if policy.idle_minutes_for(instance.size) and (instance.driver_state or {}).get("endpoint")
    ]
    report.checked = len(instances)
    activity = _probe_all(instances)
    instance_ids = [instance.id for instance in instances]
    ssh_open = open_session_instance_ids(instance_ids)
    ssh_last = last_session_activity(instance_ids)
    port_last = last_port_traffic(instance_ids)
    gpu_percents = hostfs.instances_gpu_busy([instance.id for instance in instances])
    # Every reading counts towards the efficiency report, whatever else keeps or skips the instance.
    gpu_samples_record(
        readings={
            key: percent > busy_percent for key, percent in gpu_percents.items() if percent is not None
        },
        instances=instances,
        now=now,
    )

    past_idle_time = []
    for instance in instances:
        if instance.id in ssh_open:
            report.busy += 1
            continue
        seen = activity[instance.id]
        if isinstance(seen, JupyterUnreachable):
            report.unreachable += 1
            logger.warning("Idle culling skipped %s this round: JupyterLab: %s", instance.id, seen)
            continue
        gpu_percent = gpu_percents.get(instance.id)
        gpu_busy = None if gpu_percent is None else gpu_percent > busy_percent
        gpu_time = _track_gpu(instance, gpu_busy, gpu_percent, kernel_busy=seen.busy_kernels > 0, now=now)
        if seen.busy_kernels or gpu_busy:
            report.busy += 1
            continue
        idle_since = max(
            filter(
                None,
                [
                    seen.last_activity,
                    instance.ready_at,
                    gpu_time,
                    ssh_last.get(instance.id),
                    port_last.get(instance.id),
                ],
            )
        )
        if now - idle_since < timedelta(minutes=policy.idle_minutes_for(instance.size)):
            report.idle += 1
            continue
        past_idle_time.append(_Idle(instance, idle_since, int((now - idle_since).total_seconds() // 60)))

    warned_at = _warnings_sent(past_idle_time)
    grace = timedelta(minutes=policy.idle_grace_minutes)
    for idle in past_idle_time:
        sent = warned_at.get(idle_warning_key(idle.instance, idle.idle_since))
        if sent is None:
            report.warned += _warn(idle, policy.idle_grace_minutes, now)
            continue
        # Never sooner than the idle time plus the grace, whenever the warning went out.
        grace_began = max(
            sent, idle.idle_since + timedelta(minutes=policy.idle_minutes_for(idle.instance.size))
        )
        if now - grace_began < grace:
            report.idle += 1
            continue
        report.stopped += _stop(idle)
    return report


def _track_gpu(
    instance, gpu_busy: bool | None, gpu_percent: int | None, *, kernel_busy: bool, now: datetime
) -> datetime | None:
    """Record a change in what the GPUs do on the timeline; return the time of the last sighting, if any.

    Busy is recorded only when no kernel is busy (the kernel already keeps the instance and explains
    itself), idle again only after a recorded busy. Unknown (no reading) changes nothing.
    """
    last, last_at = instance.gpu_sighting or "", instance.gpu_sighting_at
    if gpu_busy is None:
        return last_at
    if gpu_busy:
        if not kernel_busy and not last.startswith(GPU_EVENT_BUSY):
            instance_event_record(
                instance=instance,
                message=f"{GPU_EVENT_BUSY} ({gpu_percent}%): idle culling counts this instance as in use.",
            )
            return now
        return last_at
    if last.startswith(GPU_EVENT_BUSY):
        instance_event_record(
            instance=instance, message=f"{GPU_EVENT_IDLE}: the idle clock starts again now."
        )
        return now
    return last_at


def idle_warning_key(instance, idle_since: datetime) -> str:
    """The event key notify_instance_idle_warning gives the warning for this idle stretch."""
    return f"instance:{instance.id}:idle:{idle_since.isoformat()}"


def _warnings_sent(idle: list[_Idle]) -> dict:
    """event key -> when the idle warning for that stretch was recorded, for the stretches in `idle`."""
    if not idle:
        return {}
    rows = Notification.objects.filter(
        user_id__in={i.instance.user_id for i in idle},
        kind=Kind.INSTANCE_IDLE_WARNING,
        event_key__in=[idle_warning_key(i.instance, i.idle_since) for i in idle],
    ).values_list("event_key", "created_at")
    return dict(rows)


def _warn(idle: _Idle, grace_minutes: int, now: datetime) -> int:
    """Warn the owner and note it on the timeline. Returns 1 when this call warned, 0 if already warned."""
    warned = notify_instance_idle_warning(
        instance=idle.instance,
        idle_since=idle.idle_since,
        idle_minutes=idle.idle_minutes,
        grace_minutes=grace_minutes,
    )
    if warned is None:
        return 0
    stop_at = now + timedelta(minutes=grace_minutes)
    instance_event_record(
        instance=idle.instance,
        message=f"Idle for {idle.idle_minutes} minutes (no kernel, terminal, SSH or GPU activity): it stops at "
        f"{stop_at:%H:%M} UTC unless it is used again. Your /workspace files are kept.",
    )
    return 1


def _stop(idle: _Idle) -> int:
    """Stop the instance as idle and tell the owner. Returns 1 when it was stopped as idle, 0 when it had
    already ended or someone else (the owner, an operator) stopped it first."""
    try:
        stopped = services.instance_request_stop(
            instance_id=idle.instance.id,
            reason=StopReason.IDLE,
            message=f"Stopped after {idle.idle_minutes} minutes idle (no kernel, terminal, SSH or GPU activity). "
            "Your /workspace files are kept.",
        )
    except (ValidationError, Instance.DoesNotExist):
        return 0
    if stopped.stop_reason != StopReason.IDLE:
        return 0
    notify_instance_stopped(instance=idle.instance, reason=StopReason.IDLE, idle_minutes=idle.idle_minutes)
    logger.info("Idle culling stopped %s after %s idle minutes", idle.instance.id, idle.idle_minutes)
    return 1
