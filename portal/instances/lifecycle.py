"""Worker-side operations on instances: provision, teardown, meter tick, reconcile, start queued launches,
and what a host going down means for its instances (hosts_heartbeat).

This is the instance lifecycle's worker half; the web half (launch, stop) is portal/instances/services.py.
Both move Instance.state only through portal/instances/transitions.py, and use provisioning for the fleet:
the scheduler (allocate and release GPUs), the drivers (start, stop, poll) and the hosts.

Every function here is safe to run twice and safe to kill at any line (docs/architecture.md, "Reliability"):
- state moves forward only by conditional updates (`filter(state=...).update(...)`), so a duplicate or
  late run finds the row already moved on and does nothing;
- the driver's start is idempotent (the container name derives from the instance id), stop treats
  "already gone" as done, and the scheduler's allocate returns the GPUs an instance already holds;
- whatever a killed worker leaves behind (a container, GPUs, an instance stuck in a transition) is
  found by `reconcile` on the next beat.
Celery tasks (portal/instances/tasks.py) are thin wrappers; retries of transient driver errors happen there.
"""

import functools
import logging
import socket
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlparse

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.credits import metering
from portal.lib.tasks import publish
from portal.notifications.services import notify_gpu_unhealthy, notify_instance_stopped, notify_launch_failed
from provisioning import health, scheduler, start_slots, workspaces
from provisioning.drivers import driver_for
from provisioning.drivers.base import DriverError, NotPlacedYet
from provisioning.models import GpuAllocation, GpuHost
from provisioning.slurm import clusters as slurm_clusters

from . import queue, sessions, tasks, transitions
from .models import Instance, LaunchPolicy
from .start_spec import instance_ref, start_spec_for
from .stop_reasons import StopReason
from .transitions import event_record

logger = logging.getLogger(__name__)

State = Instance.State
Step = Instance.Step

# A fresh launch's provision message is normally picked up within seconds; start_queued leaves queued
# instances that were never tried alone for this long, so it does not race their own task.
FRESH_LAUNCH_GRACE = timedelta(seconds=60)
# How often the readiness wait asks JupyterLab. The wait is the longest step of a launch and the user's
# clock runs through all of it, so the poll's lag is paid in full as launch latency: half the interval on
# average (a backoff to 0.5 s cost about 0.25 s per launch, most of the 0.3 s budget over a plain
# `docker run`). Until JupyterLab listens a poll is a refused or reset connection, and then one cheap
# request, so 20 a second per starting instance costs next to nothing.
READY_POLL_SECONDS = 0.05
# JupyterLab prints this once it listens (Jupyter Server's start-up banner). A driver that can follow an
# instance's output (Driver.watches_output) tells the wait when it appears; until then the wait asks only
# once a second, so a burst of starting instances does not spend the CPU their start-up needs on polls
# (thirty launches polling 20 times a second took a third of a core). The slow poll still finds a lab
# that never prints the line.
JUPYTER_SERVING_LINE = "Use Control-C to stop this server"
READY_POLL_UNTIL_SERVING_SECONDS = 1.0
# How often the readiness wait also asks the driver whether the container still runs, and the
# database whether the instance was stopped meanwhile: every second once JupyterLab serves (or the output
# ended), every five until then. In a burst of thirty start-ups, an engine inspect and a query per
# instance per second were CPU the start-ups needed.
READY_CHECK_EVERY = 1.0
READY_CHECK_UNTIL_SERVING_SECONDS = 5.0
STATUS_REQUEST_TIMEOUT = 2.0
# The readiness wait also waits for the instance's sshd to greet (`SSH-2.0-…`), so that "running" means
# `devcloud ssh` works too. sshd starts before JupyterLab, so it normally greets first; an image whose
# sshd never does (built without it: the docker driver publishes the port anyway) goes running this long
# after JupyterLab answers, with a line on its timeline saying SSH is off.
SSH_GRACE_AFTER_LAB_SECONDS = 10.0
SSH_BANNER_TIMEOUT = 1.0
SSH_BANNER = b"SSH-2.0-"

NOTHING_CHARGED = "Nothing was charged."


def enqueue(task, **kwargs) -> bool:
    """Publish `task` with `kwargs`. Returns False (and logs) when the broker is unreachable: the beat
    tasks (start_queued, reconcile) do the same work later, so nothing is lost."""
    return publish(task, kwargs=kwargs)


def _load(instance_id) -> Instance | None:
    return Instance.objects.select_related("image", "host", "user").filter(id=instance_id).first()


# --- provision -------------------------------------------------------------------------------------------


def instance_provision(*, instance_id, resume: bool = False) -> str:
    """Take a queued instance to RUNNING: allocate GPUs, start the container, wait for JupyterLab, go ready.

    Returns what happened: "running", "queued" (no GPUs free: back in the queue, with its position),
    "failed" (a permanent driver error, a crash or the ready timeout: the failure reason says what to do,
    GPUs are released, the container removed, nothing charged), "pending" (placed on a backend that
    queues it itself, a Slurm partition, which has not given it GPUs yet: ask again with resume) or
    "skipped" (someone else has it, or it was stopped).

    Claims the instance with a conditional update queued -> provisioning. With `resume` (a retry of this
    task, a redelivered message, or the reconciler), an instance already in PROVISIONING is taken up
    where it stands; every step is idempotent, so that is safe even if another run is still going.

    Raises DriverError(permanent=False) when the host cannot be reached; the task retries with resume.
    """
    claimed = transitions.claim(instance_id, now=timezone.now())
    instance = _load(instance_id)
    if instance is None:
        return "skipped"
    if not claimed and not (resume and instance.state == State.PROVISIONING):
        return "skipped"

    # A launch a backend places (a Slurm partition) has its place and no GPU rows: the backend holds them.
    on_backend = instance.host if instance.host_id and instance.host.is_slurm else None
    held = [] if on_backend else list(
        GpuAllocation.objects.filter(instance_id=instance_id, released_at__isnull=True).select_related("gpu")
    )
    # A launch on a booking starts at once, on GPUs kept for it, whoever waits for others.
    on_booking = instance.reservation_id is not None
    if not held and not on_backend and not resume and not on_booking and _waiting_ahead(instance):
        # Launches that already waited for GPUs go first; the queue task hands out what frees up.
        return _requeue(instance, "Waiting for free GPUs behind earlier launches")
    if claimed:
        event_record(instance=instance, message="Allocating GPUs.")
    allocations = []
    if on_backend is None:
        try:
            allocations = held or scheduler.allocate(
                instance_id=instance_id, runs_until=_runs_until(instance)
            )
        except scheduler.SchedulerError:
            return "skipped"  # stopped since the claim: it gets no GPUs
        if not allocations:
            # No GPUs of DevCloud's own hosts are free: a partition whose scheduler places, if there is one.
            on_backend = None if on_booking else slurm_clusters.partition_place(instance_id=instance_id)
            if on_backend is None:
                return _requeue(instance, "No GPUs are free right now")
            allocations = []
    instance.refresh_from_db(fields=["host", "state", "driver", "step"])
    host = GpuHost.objects.select_related("slurm_cluster").get(pk=instance.host_id)
    instance.host = host

    starting = (
        f"Submitting it to the Slurm partition {host.slurm_partition} of {host.slurm_cluster.name}."
        if host.is_slurm
        else f"Starting the {instance.image.name} container on {host.name}."
    )
    if instance.step == Step.STARTING and host.is_slurm:
        # Asked again while the backend keeps it pending: already said.
        if instance.state != State.PROVISIONING:
            return "skipped"
    elif not _step(instance, Step.STARTING, starting):
        return "skipped"
    driver = driver_for(host, instance.driver)
    spec = start_spec_for(instance, host=host, gpus=[allocation.gpu for allocation in allocations])
    line = driver.start_line()
    try:
        with ExitStack() as slot:
            waited = []

            def waiting(ahead: int) -> None:
                waited.append(ahead)
                _tell_waiting_to_start(instance, host, ahead)

            def turn():
                if line is None:
                    return
                slot.enter_context(
                    start_slots.start_slot(
                        line,
                        str(instance.id),
                        waiting=waiting,
                        wanted=lambda: Instance.objects.filter(id=instance.id, state=State.PROVISIONING).exists(),
                    )
                )
                if waited:
                    # The moment the wait for a slot ended: the launch metrics time it as its own phase.
                    event_record(instance=instance, message=TURN_CAME)

            # The slot is held from the container's start until JupyterLab answers or the launch ends.
            outcome = _start_and_wait(instance, driver, spec, turn)
    except start_slots.Cancelled:
        # Stopped while it waited its turn: nothing ran; what was made for it goes.
        _stop_quietly(driver, instance)
        return "skipped"
    if isinstance(outcome, str):
        return outcome
    if outcome.aborted:
        return "skipped"
    if not outcome.ready:
        return _fail(instance, outcome.reason, driver=driver)

    if not transitions.mark_running(instance, ready_at=timezone.now()):
        return "skipped"
    return "running"


def _runs_until(instance: Instance):
    """The latest the instance may run, for the scheduler to keep booked GPUs clear of it."""
    return sessions.runs_until(
        instance, LaunchPolicy.current(), timezone.now(), ready_within=settings.READY_TIMEOUT_SECONDS
    )


# On a launch's timeline when it had to wait for a start slot and got one.
TURN_CAME = "Its turn came: starting the container."


def _tell_waiting_to_start(instance: Instance, host: GpuHost, ahead: int) -> None:
    launches = "1 launch starts" if ahead == 1 else f"{ahead} launches start"
    event_record(
        instance=instance,
        message=f"Waiting for its turn to start on {host.name}: {launches} first, so that none is slowed "
        "by all starting at once.",
    )


def _start_and_wait(instance: Instance, driver, spec, turn) -> "ReadyOutcome | str":
    """Brings the owner's workspace to the host where it lives on one host at a time, starts the container
    once `turn()` returns and waits for JupyterLab. Returns the readiness outcome, or what
    instance_provision returns when the launch ended before that ("failed", "skipped")."""

    def progress(line):
        transitions.event_record_once(instance=instance, message=line)

    try:
        if driver.workspace_moves:
            # Its own step, before the start: the move's lines show on the timeline as it goes.
            workspaces.workspace_prepare(
                host=driver.host, owner_id=instance.user_id, image_reference=spec.image_reference,
                progress=progress, limit_bytes=spec.workspace_limit_bytes,
            )
        result = driver.start(spec, progress=progress, turn=turn)
    except NotPlacedYet as pending:
        # The backend queues it (a pending Slurm job): the task asks again; nothing is charged meanwhile.
        if not transitions.backend_pending(instance, reason=f"Waiting in the cluster's queue: {pending.reason}."):
            _stop_quietly(driver, instance)
            return "skipped"
        return "pending"
    except DriverError as error:
        if not error.permanent:
            raise
        return _fail(
            instance,
            f"The host could not start the {instance.image.name} image: {error.message} {NOTHING_CHARGED} "
            "Try another image, or tell the operators if it keeps happening.",
            driver=driver,
        )
    if driver.workspace_moves and result.state.get("volume"):
        workspaces.workspace_created(user_id=instance.user_id, host=driver.host, volume=result.state["volume"])
    state = {**result.state, "endpoint": result.endpoint}
    if not transitions.keep_driver_state(instance.id, state):
        # Stopped while the container started: the teardown may already have run, so remove it here.
        _stop_quietly(driver, instance)
        return "skipped"
    instance.driver_state = state

    if not _step(instance, Step.WAITING, "Waiting for JupyterLab to answer."):
        _stop_quietly(driver, instance)
        return "skipped"
    return wait_until_ready(instance, driver, endpoint=result.endpoint)


def _waiting_ahead(instance: Instance) -> bool:
    """Whether launches ahead of it in the queue's order are waiting for GPUs (tried before and put back)."""
    for standing in queue.standings(also=instance):
        if standing.launch.id == instance.id:
            return False
        if standing.launch.provisioning_at is not None:
            return True
    return False


def _requeue(instance: Instance, why: str) -> str:
    if not transitions.requeue(instance):
        return "skipped"
    place = queue.place_of(instance)
    where = f": number {place.position} in the queue" if place else ""
    event_record(instance=instance, message=f"{why}{where}. It starts as soon as GPUs free up.")
    return "queued"


_step = transitions.step


@dataclass
class ReadyOutcome:
    ready: bool = False
    # The instance left PROVISIONING while we waited (stopped, or failed by the reconciler).
    aborted: bool = False
    reason: str = ""


def status_url(instance: Instance, endpoint: str) -> str:
    """JupyterLab's status API for the instance; its base URL is /instances/<id>/lab/, as the gateway routes it."""
    return f"{endpoint.rstrip('/')}/instances/{instance.id}/lab/api/status"


@functools.cache
def _tls_context():
    # One for every readiness wait: building one loads the whole CA bundle, as much CPU as a hundred polls.
    return httpx.create_ssl_context()


def ssh_endpoint(instance: Instance, endpoint: str) -> tuple[str, int] | None:
    """Where the portal reaches the instance's sshd: the port the driver reported (driver_state
    "ssh_port") on the endpoint's address, as the SSH gateway connects. None when it runs no sshd (the
    local and fake drivers, a Slurm job started without one)."""
    port = (instance.driver_state or {}).get("ssh_port")
    address = urlparse(endpoint).hostname
    return (address, int(port)) if port and address else None


def sshd_greets(address: str, port: int) -> bool:
    """Whether an SSH server answers on address:port with its version line (`SSH-2.0-…`). A refused or
    silent connection is False, as is the engine's port proxy, which accepts before sshd inside listens
    and then closes."""
    banner = b""
    try:
        with socket.create_connection((address, port), timeout=SSH_BANNER_TIMEOUT) as sock:
            while b"\n" not in banner and len(banner) < 256:
                chunk = sock.recv(256)
                if not chunk:
                    break
                banner += chunk
    except OSError:
        return False
    return banner.startswith(SSH_BANNER)


def wait_until_ready(instance: Instance, driver, *, endpoint: str) -> ReadyOutcome:
    """Poll JupyterLab's /api/status with the instance's token until it answers 200, and the instance's
    sshd (ssh_endpoint) until it greets, within READY_TIMEOUT_SECONDS.

    Returns a ReadyOutcome: ready, aborted (the instance was stopped meanwhile), or not ready with a
    reason a person can act on (timeout, or the container exited). An sshd that has not greeted
    SSH_GRACE_AFTER_LAB_SECONDS after JupyterLab answered does not hold the launch: it is ready, with a
    timeline line saying SSH does not answer. Raises DriverError(permanent=False) from driver.poll when
    the host stops answering.
    """
    timeout = settings.READY_TIMEOUT_SECONDS
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"token {instance.jupyter_token}"}
    url = status_url(instance, endpoint)
    sshd = ssh_endpoint(instance, endpoint)
    sshd_answered = sshd is None
    lab_answered_at = None
    serving, done = _watch_for_serving_line(instance, driver, deadline)
    next_check = time.monotonic() + (READY_CHECK_EVERY if serving.is_set() else READY_CHECK_UNTIL_SERVING_SECONDS)
    try:
        # trust_env=False: a proxy from the environment must never sit between the portal and an instance.
        with httpx.Client(
            timeout=STATUS_REQUEST_TIMEOUT, trust_env=False, follow_redirects=False, verify=_tls_context()
        ) as client:
            while True:
                if lab_answered_at is None:
                    try:
                        if client.get(url, headers=headers).status_code == 200:
                            lab_answered_at = time.monotonic()
                    except httpx.HTTPError:
                        pass
                if not sshd_answered:
                    sshd_answered = sshd_greets(*sshd)
                if lab_answered_at is not None:
                    if sshd_answered:
                        return ReadyOutcome(ready=True)
                    if time.monotonic() >= min(lab_answered_at + SSH_GRACE_AFTER_LAB_SECONDS, deadline):
                        event_record(
                            instance=instance,
                            message=f"Its SSH server did not answer within {SSH_GRACE_AFTER_LAB_SECONDS:.0f} "
                            "seconds of JupyterLab, so SSH may not reach it; JupyterLab works.",
                        )
                        return ReadyOutcome(ready=True)
                now = time.monotonic()
                if now >= next_check or now >= deadline:
                    # While the output is followed, its end (the container exited or was removed by a
                    # stop) sets `serving`, so the checks can be rarer until then. At the deadline it is
                    # checked once more: a container that exited is the reason to give, not the time.
                    every = READY_CHECK_EVERY if serving.is_set() else READY_CHECK_UNTIL_SERVING_SECONDS
                    next_check = time.monotonic() + every
                    if not Instance.objects.filter(id=instance.id, state=State.PROVISIONING).exists():
                        return ReadyOutcome(aborted=True)
                    seen = driver.poll(instance_ref(instance))
                    if not seen.running:
                        code = f" with exit code {seen.exit_code}" if seen.exit_code is not None else ""
                        return ReadyOutcome(
                            reason=f"The container {'exited' if seen.status == 'exited' else 'disappeared'}"
                            f"{code} before JupyterLab answered. {NOTHING_CHARGED} Launch again; if it happens "
                            "again, try another image or tell the operators."
                        )
                if time.monotonic() >= deadline:
                    return ReadyOutcome(
                        reason=f"JupyterLab did not answer within {timeout} seconds, so the launch was stopped. "
                        f"{NOTHING_CHARGED} Launch again; if it happens again, tell the operators "
                        f"(instance {instance.short_id})."
                    )
                remaining = max(deadline - time.monotonic(), 0.01)
                if serving.is_set() or lab_answered_at is not None:
                    # A sleep, not serving.wait: a set event returns at once, and the poll would spin
                    # (a driver that cannot follow output sets it from the start: the whole wait).
                    time.sleep(min(READY_POLL_SECONDS, remaining))
                else:
                    # Wakes at once when the serving line appears.
                    serving.wait(min(READY_POLL_UNTIL_SERVING_SECONDS, remaining))
    finally:
        done.set()


def _watch_for_serving_line(instance: Instance, driver, deadline: float):
    """Starts following the instance's output for JUPYTER_SERVING_LINE; returns (serving, done) events.

    `serving` is set when the line appears, when the output ends (the poll then finds out why) and at
    once for a driver that cannot follow output, so the readiness wait polls fast from the start.
    Setting `done` ends the following.
    """
    serving, done = threading.Event(), threading.Event()
    if not driver.watches_output:
        serving.set()
        return serving, done

    def follow():
        try:
            driver.wait_for_output(instance_ref(instance), JUPYTER_SERVING_LINE, deadline, done)
        except DriverError as error:
            logger.info("instance %s: could not follow its output (%s); polling instead", instance.id, error)
        finally:
            serving.set()

    threading.Thread(target=follow, name=f"serving-{instance.short_id}", daemon=True).start()
    return serving, done


def _stop_quietly(driver, instance) -> bool:
    """driver.stop that logs instead of raising: the reconciler removes what is left. Returns whether it worked."""
    try:
        driver.stop(instance_ref(instance))
        return True
    except DriverError as error:
        logger.warning("Could not remove the container of %s: %s", instance.id, error.message)
        return False


def instance_fail(*, instance_id, reason: str, from_states=(State.QUEUED, State.PROVISIONING)) -> bool:
    """Mark an instance failed with `reason`, remove its container (best effort), free its GPUs and email
    the owner that the launch failed (once).

    Returns whether this call failed it (False when it had already moved on). Nothing is charged: an
    instance that never turned ready was never metered.
    """
    instance = _load(instance_id)
    if instance is None:
        return False
    driver = driver_for(instance.host, instance.driver) if instance.host_id else None
    return _fail(instance, reason, driver=driver, from_states=from_states) == "failed"


def _fail(
    instance: Instance, reason: str, *, driver=None, from_states=(State.QUEUED, State.PROVISIONING)
) -> str:
    if not transitions.fail(instance, reason=reason, from_states=list(from_states)):
        return "skipped"
    if driver is not None:
        _stop_quietly(driver, instance)
    # GPUs go back even when the host did not answer: the reconciler removes the container once it does.
    if scheduler.release(instance_id=instance.id):
        _kick_queue()
    if State.RUNNING not in from_states:
        # A launch that never got ready. (A running instance whose container vanished is not a failed
        # launch; there is no notification kind for it yet, so its owner reads the reason on the page.)
        notify_launch_failed(instance=instance)
    return "failed"


def _kick_queue() -> None:
    """Ask for queued launches to start, now that GPUs are free. Beat does it anyway within a minute."""
    transaction.on_commit(lambda: enqueue(tasks.start_queued))


# --- teardown --------------------------------------------------------------------------------------------


def instance_teardown(*, instance_id, force: bool = False) -> str:
    """Take a STOPPING instance to STOPPED: stop the container (keeping the workspace volume), free its GPUs,
    charge whatever metering has not yet (only if it was ever ready), and start queued launches.

    When the owner deleted their account (stop_reason account_deleted) the driver also removes their
    workspace on this host (Driver.remove_workspace). The reason is read from the row, not passed in, so
    a retry or the reconciler's forced teardown removes it too.

    Returns "stopped" or "skipped" (it is not stopping). Raises DriverError(permanent=False) when the host
    cannot be reached, for the task to retry; with `force` (the reconciler, after retries ran out) it
    goes on anyway and the orphan container is removed when the host answers again.
    """
    instance = _load(instance_id)
    if instance is None or instance.state != State.STOPPING:
        return "skipped"
    if instance.host_id:
        driver = driver_for(instance.host, instance.driver)
        try:
            driver.stop(instance_ref(instance))
            if instance.stop_reason == StopReason.ACCOUNT_DELETED:
                driver.remove_workspace(instance.user_id)
        except DriverError as error:
            if not force:
                raise
            logger.warning("Tearing down %s without reaching its host: %s", instance_id, error.message)
    _close_metering(instance)
    released = scheduler.release(instance_id=instance_id)
    kept = instance.stop_reason != StopReason.ACCOUNT_DELETED
    message = "Stopped. Your /workspace files are kept for your next launch." if kept else "Stopped."
    if not transitions.finish_stop(instance, message=message):
        return "skipped"
    if released:
        enqueue(tasks.start_queued)
    return "stopped"


def _close_metering(instance: Instance) -> int:
    """Charge a stopping instance up to the moment it began stopping, if anything is left. Returns GPU-seconds.

    Stops through portal.instances.services charge the rest already; this catches a stop that reached
    STOPPING another way, so no ready time goes unbilled. A never-ready instance costs nothing.
    """
    if (
        instance.ready_at is None
        or instance.metered_until is None
        or instance.metered_until >= instance.state_changed_at
    ):
        return 0
    with transaction.atomic():
        metering.payer_locked(instance)
        locked = Instance.objects.select_for_update().get(id=instance.id)
        if locked.state != State.STOPPING:
            return 0
        return metering.charge_until(instance=locked, until=locked.state_changed_at)


# --- metering --------------------------------------------------------------------------------------------


def meter_tick(now: datetime | None = None) -> metering.TickResult:
    """Charge running instances (portal.credits.metering.meter_tick), then tear down those whose owner ran out.

    Returns the TickResult.
    """
    result = metering.meter_tick(now)
    for instance_id in result.stopped_queued_ids:
        scheduler.release(instance_id=instance_id)
    for instance_id in result.stopping_ids:
        enqueue(tasks.teardown_instance, instance_id=str(instance_id))
    return result


# --- queue -----------------------------------------------------------------------------------------------


def start_queued(now: datetime | None = None, *, limit: int = 100) -> int:
    """Hand free GPUs to queued launches in the queue's fair-share order (queue.queue_order; the scheduler's
    next_queued keeps 8x launches from starving in it), and enqueue provisioning for each one that got
    GPUs. Returns how many were started.

    Skips fresh launches whose own provision task is still on its way (never tried, younger than
    FRESH_LAUNCH_GRACE); an older never-tried one lost its message and is picked up here.
    """
    now = now or timezone.now()
    started = 0
    for launch in scheduler.next_queued(limit=limit, now=now, order=queue.queue_order(now=now)):
        instance = launch.instance
        if instance.provisioning_at is None and instance.created_at > now - FRESH_LAUNCH_GRACE:
            continue
        try:
            allocations = scheduler.allocate(
                instance_id=instance.id,
                reserve_whole_hosts=launch.reserve_whole_hosts,
                runs_until=_runs_until(instance),
            )
        except scheduler.SchedulerError:
            continue  # stopped meanwhile
        if allocations:
            enqueue(tasks.provision_instance, instance_id=str(instance.id))
            started += 1
    return started


# --- host health -----------------------------------------------------------------------------------------


@dataclass
class HostsHeartbeatReport:
    """One beat: what provisioning.health found, and what the lifecycle did about the hosts that are down."""

    heartbeat: health.HeartbeatReport
    # Running instances stopped (host_down) and launches put back in the queue, on hosts that are down.
    stopped: list = field(default_factory=list)
    requeued: list = field(default_factory=list)


def hosts_heartbeat(now: datetime | None = None) -> HostsHeartbeatReport:
    """Ping every host (provisioning.health.hosts_heartbeat), then settle the instances of every host
    that is down (host_down_settle): the ones that went down in this beat, and any a crashed earlier beat
    left half done. A host that came back gets a reconcile at once, which removes the containers its
    stopped instances left there. Returns a HostsHeartbeatReport. Safe to run twice at once.
    """
    report = HostsHeartbeatReport(heartbeat=health.hosts_heartbeat(now=now))
    # Slurm clusters have no engine to ping: their slurmrestd is checked, and the operators told of a
    # refused token or a cluster that does not answer. Their instances are settled job by job (reconcile).
    slurm_clusters.clusters_check(now=now)
    for host_id in GpuHost.objects.filter(state=GpuHost.State.DOWN).values_list("pk", flat=True):
        stopped, requeued = host_down_settle(host_id=host_id)
        report.stopped += stopped
        report.requeued += requeued
    if report.heartbeat.came_back:
        enqueue(tasks.reconcile)
    gpus_drained_tell(gpu_ids=report.heartbeat.gpus_drained)
    return report


def gpus_drained_tell(*, gpu_ids) -> list:
    """Tell the owner of each live instance holding one of the drained GPUs (provisioning/gpu_health.py),
    on its timeline and by notification; the instance keeps running. Returns the instance ids told."""
    told = []
    live = GpuAllocation.objects.filter(gpu_id__in=list(gpu_ids), released_at__isnull=True).select_related(
        "gpu", "instance", "instance__user", "instance__image"
    )
    for allocation in live:
        gpu, instance = allocation.gpu, allocation.instance
        event_record(
            instance=instance,
            message=f"Its GPU renderD{gpu.render_minor} failed its health check and was taken out of service: "
            f"{gpu.drained_reason} The instance keeps running; save your work, then stop it and launch again "
            "to get healthy GPUs.",
        )
        notify_gpu_unhealthy(
            instance=instance,
            gpu=f"renderD{gpu.render_minor}",
            health_reason=gpu.drained_reason,
            drained_at=gpu.drained_at or timezone.now(),
        )
        told.append(instance.id)
    return told


def host_down_settle(*, host_id: int) -> tuple[list, list]:
    """What a host that stopped answering means for its instances (docs/architecture.md, "Host health").

    - Running ones are charged only up to the host's last_seen_at (metering.settle_until: what a tick
      charged after it is given back), stopped with reason host_down as of that moment, and their
      owners told. Their teardown is forced: it cannot reach the engine, so it frees the GPUs and
      finishes without it; the reconciler removes the container once the host answers again.
    - Queued and provisioning ones (launches that had GPUs there) give their GPUs back and go back to
      the queue, to be placed on another host.

    Returns (ids stopped, ids put back in the queue). Does nothing unless the host is down, and nothing
    twice: the stops and the requeue are conditional moves.
    """
    host = GpuHost.objects.filter(pk=host_id, state=GpuHost.State.DOWN).first()
    if host is None:
        return [], []
    stopped, requeued = [], []
    live = Instance.objects.filter(host_id=host_id, state__in=transitions.STOPPABLE_STATES).order_by("created_at")
    for instance_id, state in live.values_list("id", "state"):
        if state == State.RUNNING:
            if _stop_host_down(instance_id, host, last_seen=host.last_seen_at, where=f"Its host {host.name}"):
                stopped.append(instance_id)
        elif _requeue_off_host(instance_id, host):
            requeued.append(instance_id)
    if requeued:
        _kick_queue()
    return stopped, requeued


def _stop_host_down(instance_id, host: GpuHost, *, last_seen, where: str) -> bool:
    """Stop a running instance whose machine died (`where` names it for the owner), charged only up to
    `last_seen`, when it was last confirmed running. Returns whether this call stopped it."""
    return _stop_ended(instance_id, host, ended_because="host_down", last_seen=last_seen, where=where)


def _stop_ended(instance_id, host: GpuHost, *, ended_because: str, last_seen, where: str) -> bool:
    """Stop a running instance its backend ended: "host_down" (its machine died; `where` names it) or
    "max_length" (the backend's time limit). Charged only up to `last_seen`; the owner is told. Returns
    whether this call stopped it."""
    payer = Instance.objects.only("user_id", "project_id").get(id=instance_id)
    with transaction.atomic():
        metering.payer_locked(payer)
        instance = Instance.objects.select_for_update(of=("self",)).select_related("user", "image").get(id=instance_id)
        if instance.state != State.RUNNING or instance.host_id != host.pk:
            return False
        # Billing ends when the host was last confirmed alive (never before the instance was ready).
        seen = last_seen or instance.metered_until or instance.ready_at
        end = max(seen, instance.ready_at) if instance.ready_at else seen
        metering.settle_until(instance=instance, until=end)
        if ended_because == "max_length":
            reason = StopReason.MAX_LENGTH
            message = (
                f"The cluster ended it at its time limit, the longest a session may run at its size (last "
                f"seen running {end:%Y-%m-%d %H:%M:%S} UTC); nothing is charged after that moment."
            )
        else:
            reason = StopReason.HOST_DOWN
            message = (
                f"{where} stopped answering (last seen {end:%Y-%m-%d %H:%M:%S} UTC), so it was stopped; "
                "nothing is charged after that moment."
            )
        moved = transitions.stop(instance, reason=reason, message=message, now=end)
        if moved != State.STOPPING:
            return False
        notify_instance_stopped(instance=instance, reason=reason)
        transaction.on_commit(
            lambda: enqueue(tasks.teardown_instance, instance_id=str(instance_id), force=True)
        )
    return True


def _requeue_off_host(instance_id, host: GpuHost) -> bool:
    with transaction.atomic():
        instance = Instance.objects.select_for_update(of=("self",)).filter(id=instance_id).first()
        if instance is None or instance.host_id != host.pk:
            return False
        if instance.state == State.PROVISIONING and not transitions.requeue(instance):
            return False
        if instance.state != State.QUEUED:
            return False
        scheduler.release(instance_id=instance_id)
        # Not a state change: the launch no longer has a host until the scheduler gives it another.
        Instance.objects.filter(id=instance_id, state=State.QUEUED).update(host=None)
        event_record(
            instance=instance,
            message=f"Its host {host.name} stopped answering before it started, so it is back in the queue "
            "for another host. Nothing was charged.",
        )
    return True


# --- reconcile -------------------------------------------------------------------------------------------


@dataclass
class ReconcileReport:
    hosts_checked: int = 0
    hosts_unreachable: int = 0
    orphans_removed: int = 0
    vanished_failed: int = 0
    allocations_freed: int = 0
    provisioning_resumed: int = 0
    provisioning_failed: int = 0
    teardowns_enqueued: int = 0


def reconcile(now: datetime | None = None) -> ReconcileReport:
    """Compare the database with what each host's driver reports, and repair both sides.

    On every active or draining host: containers labelled as ours with no live instance are removed;
    running instances whose container is gone are failed ("the container disappeared"), with their GPUs
    freed and metering closed (what was charged up to the last tick stands; the lost time is not
    charged). Then, everywhere: GPUs still held by ended instances are freed; instances stuck in
    PROVISIONING longer than STUCK_TRANSITION_SECONDS are resumed once and failed the second time; those
    stuck in STOPPING get their teardown enqueued again (forced). Returns a ReconcileReport.
    """
    now = now or timezone.now()
    report = ReconcileReport()
    for host in GpuHost.objects.filter(state__in=[GpuHost.State.ACTIVE, GpuHost.State.DRAINING]):
        _reconcile_host(host, now, report)
    report.allocations_freed += _free_ended_allocations()
    _repair_stuck(now, report)
    return report


def _reconcile_host(host: GpuHost, now: datetime, report: ReconcileReport) -> None:
    driver = driver_for(host)
    try:
        # Listed before the database is read: a container started after this listing belongs to an
        # instance that is live by the time we read, so it is never mistaken for an orphan.
        managed = driver.managed_instance_ids()
    except DriverError as error:
        report.hosts_unreachable += 1
        logger.warning("Reconcile: host %s did not answer: %s", host.name, error.message)
        return
    report.hosts_checked += 1
    live = {
        str(instance_id): state
        for instance_id, state in Instance.objects.filter(
            host=host, state__in=Instance.LIVE_STATES
        ).values_list("id", "state")
    }
    for instance_id in sorted(managed - set(live)):
        try:
            uuid.UUID(instance_id)
        except ValueError:
            logger.warning(
                "Reconcile: container on %s labelled with a bad instance id %r", host.name, instance_id
            )
            continue
        stub = Instance.objects.filter(id=instance_id).first() or Instance(id=uuid.UUID(instance_id), user_id=0)
        if _stop_quietly(driver, stub):
            report.orphans_removed += 1
            logger.info("Reconcile: removed orphan container of %s on %s", instance_id, host.name)
    for instance_id, state in live.items():
        if state != State.RUNNING or instance_id in managed:
            continue
        instance = _load(instance_id)
        try:
            seen = driver.poll(instance_ref(instance))
        except DriverError:
            continue
        if seen.running or seen.status == "pending":
            continue
        if seen.ended_because in ("host_down", "max_length"):
            # Its node died under it (a Slurm NODE_FAIL), or the backend ended it at its time limit: stopped
            # for that reason, charged up to when it was last seen running.
            node = (instance.driver_state or {}).get("node") or "its node"
            if _stop_ended(instance.id, host, ended_because=seen.ended_because, last_seen=seen.last_seen_at,
                           where=f"Its node {node} of {host.name}"):
                report.vanished_failed += 1
            continue
        if host.is_slurm:
            reason = (
                f"Its Slurm job ended outside DevCloud ({seen.detail}), so this instance ended. Your /workspace "
                "files are kept; launch a new instance to continue. Time after the last charge was not charged."
            )
            if _fail(instance, reason, driver=None, from_states=[State.RUNNING]) == "failed":
                report.vanished_failed += 1
            continue
        reason = (
            "The container disappeared (it was removed, or its host restarted), so this instance ended. Your "
            "/workspace files are kept; launch a new instance to continue. Time after the last charge was "
            "not charged."
        )
        if _fail(instance, reason, driver=None, from_states=[State.RUNNING]) == "failed":
            report.vanished_failed += 1


def _free_ended_allocations() -> int:
    """Free GPUs still held by stopped or failed instances (a worker died between the state change and the release)."""
    ended = (
        GpuAllocation.objects.filter(released_at__isnull=True)
        .exclude(instance__state__in=Instance.LIVE_STATES)
        .values_list("instance_id", flat=True)
        .distinct()
    )
    return sum(scheduler.release(instance_id=instance_id) for instance_id in list(ended))


def _repair_stuck(now: datetime, report: ReconcileReport) -> None:
    stuck_after = timedelta(seconds=settings.STUCK_TRANSITION_SECONDS)
    cutoff = now - stuck_after
    for instance in Instance.objects.filter(state=State.PROVISIONING, state_changed_at__lt=cutoff).select_related(
        "host"
    ):
        started = instance.provisioning_at or instance.state_changed_at
        # A launch in a cluster's own queue waits as long as the cluster keeps it pending; its task asks
        # again every few seconds, so one that stalled here lost that task: resume it, never fail it.
        in_backend_queue = instance.host is not None and instance.host.is_slurm and instance.step == Step.STARTING
        if in_backend_queue or now - started < 2 * stuck_after:
            # Resumed once: every step is idempotent, so this finishes what a killed worker started.
            if transitions.touch_stuck(instance, "Provisioning stalled; resuming it."):
                enqueue(tasks.provision_instance, instance_id=str(instance.id), resume=True)
                report.provisioning_resumed += 1
        elif instance_fail(
            instance_id=instance.id,
            reason=f"Starting took longer than {int(2 * stuck_after.total_seconds() // 60)} minutes, so it was "
            f"stopped. {NOTHING_CHARGED} Launch again; if it happens again, tell the operators "
            f"(instance {instance.short_id}).",
            from_states=[State.PROVISIONING],
        ):
            report.provisioning_failed += 1
    for instance_id in Instance.objects.filter(state=State.STOPPING, state_changed_at__lt=cutoff).values_list(
        "id", flat=True
    ):
        # state_changed_at is left alone: it is when billing ended, and teardown is safe to repeat.
        enqueue(tasks.teardown_instance, instance_id=str(instance_id), force=True)
        report.teardowns_enqueued += 1
