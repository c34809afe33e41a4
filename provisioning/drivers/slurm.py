"""Instances as Slurm batch jobs on an existing cluster, through slurmrestd: Slurm places them.

The driver is bound to one partition (a GpuHost with backend "slurm") of a SlurmCluster. An instance is
one job named devcloud-<portal id>-<instance uuid>, so a retried start finds its job instead of
submitting a second, and the reconciler recognises the portal's jobs among everyone else's. The job
(provisioning/slurm/job.py) runs the instance's image with runc through `srun --container` on the node
Slurm chose, with `--gres=<gres>:<GPUs>`, no requeue and the instance's longest session as its time
limit, and reports its node and ports back to the portal (provisioning/slurm/callback.py). Slurm's
devices cgroup isolates the GPUs; the workspace is a directory per person on storage every node shares.

DevCloud's own record of each job is a SlurmJob row: without accounting (slurmdbd) Slurm forgets a
finished job after MinJobAge.
"""

import logging
import math
import os
import re
import shutil
import time

import redis
from django.conf import settings
from django.utils import timezone

from ..models import SlurmJob
from ..slurm import job as slurm_job
from ..slurm.callback import callback_token, report_signal_key
from ..slurm.rest import SlurmBadToken, SlurmError, SlurmRest, SlurmUnreachable
from .base import (
    Driver,
    DriverError,
    InstanceRef,
    NotPlacedYet,
    PollResult,
    StartResult,
    StartSpec,
    hide_token,
)

logger = logging.getLogger(__name__)

# How long one start waits for a submitted job to run before it hands the launch back as NotPlacedYet
# (the lifecycle asks again). Long enough for a free node (a few seconds), short enough that a pending job
# does not hold a worker. A job that runs by then is waited for until it reports (REPORT_TIMEOUT_SECONDS).
START_WAIT_SECONDS = 20.0
# How long a running job may take to report its node and ports before the launch fails (the report
# comes within seconds of the job starting; longer means the nodes do not reach the portal).
REPORT_TIMEOUT_SECONDS = 120
# How long stop waits for Slurm to say the cancelled job ended.
STOP_WAIT_SECONDS = 30.0
POLL_SECONDS = 0.25
# While a start waits for the job's report it sleeps on the report's Redis signal: the report, not
# Slurm, says the job is up. It asks slurmrestd only for the page (a pending reason, the node it starts
# on) and for the job's end: after JOB_POLL_SECONDS, then twice as long each time up to
# JOB_POLL_MAX_SECONDS. Every ask is an RPC to slurmctld, which schedules the whole cluster; a burst of
# launches asking once a second each was also CPU their own jobs' start-up needed on a small cluster.
# Without Redis it reads the job's row every REPORT_POLL_SECONDS instead.
REPORT_POLL_SECONDS = 0.05
JOB_POLL_SECONDS = 1.0
JOB_POLL_MAX_SECONDS = 5.0
# Nodes' addresses, as slurmrestd listed them, per (slurmrestd URL, node name): a launch in a burst would
# otherwise list every node of the cluster once more just before its readiness wait.
NODE_ADDRESS_SECONDS = 60.0
_NODE_ADDRESSES: dict[tuple[str, str], tuple[str, float]] = {}
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
# How a job's end maps to the instance's stop reason, where Slurm ended it for a reason DevCloud knows:
# its node failed, or it reached its time limit (the instance's longest session).
ENDED_BECAUSE = {"NODE_FAIL": "host_down", "TIMEOUT": "max_length"}
# Slurm's reasons for a pending job, in words for the instance's page.
PENDING_REASONS = {
    "Resources": "waiting for GPUs to free up on the cluster",
    "Priority": "waiting behind jobs with a higher priority on the cluster",
    "ReqNodeNotAvail": "waiting: the nodes it may use are not available",
    "PartitionDown": "waiting: the partition is down",
    "PartitionNodeLimit": "waiting: the partition's node limit is reached",
    "BeginTime": "waiting for its start time",
    "None": "waiting for the cluster to schedule it",
}


def job_name(instance_id) -> str:
    return f"{job_prefix()}{instance_id}"


def job_prefix() -> str:
    from ..identity import install_id

    return f"devcloud-{install_id()}-"


def pending_text(reason: str) -> str:
    """Slurm's pending reason in words ("Resources" -> "waiting for GPUs to free up on the cluster")."""
    return PENDING_REASONS.get(reason or "None") or f"waiting: Slurm says {reason}"


def rest_for(cluster, *, timeout: float = 10.0) -> SlurmRest:
    """A slurmrestd client for `cluster` with its unsealed token."""
    from portal.lib.sealed import unseal

    return SlurmRest(cluster.rest_url, user_name=cluster.rest_user, token=unseal(cluster.token_sealed), timeout=timeout)


def driver_error(error: SlurmError, cluster) -> DriverError:
    """A SlurmError as the lifecycle reads it: what happened, what to do, and whether waiting can help.

    An unreachable slurmrestd and a refused token are both transient for the launch (it waits, and goes
    ahead once the operator fixed it); the operator is told by the cluster check (provisioning/slurm/clusters.py).
    """
    if isinstance(error, SlurmUnreachable):
        return DriverError(
            f"The Slurm cluster {cluster.name} does not answer ({error.message}). The launch waits and goes "
            "ahead when it answers.",
            permanent=False,
        )
    if isinstance(error, SlurmBadToken) or error.status == 401:
        return DriverError(
            f"The Slurm cluster {cluster.name} refused DevCloud's token ({error.message}). The operators "
            "are told; the launch waits until they enter a new token.",
            permanent=False,
        )
    return DriverError(f"The Slurm cluster {cluster.name}: {error.message}", permanent=error.permanent)


class SlurmDriver(Driver):
    """Runs instances as jobs on `host`'s Slurm partition. See base.Driver for the contract of each method."""

    name = "slurm"
    isolates_gpus = True
    places_with_scheduler = False
    workspace_moves = False

    def __init__(self, host):
        super().__init__(host)
        self.cluster = host.slurm_cluster

    def _rest(self) -> SlurmRest:
        return rest_for(self.cluster)

    def _error(self, error: SlurmError) -> DriverError:
        return driver_error(error, self.cluster)

    def workspace_dir(self, workspace: str) -> str:
        return os.path.join(self.cluster.workspace_root, workspace)

    # --- The contract -----------------------------------------------------------------------------

    def start(self, spec: StartSpec, progress=None, turn=None) -> StartResult:
        """Submits the instance's job (or finds the one an earlier call submitted) and waits up to
        START_WAIT_SECONDS for it to run and report its ports. Returns the endpoint on the node.

        Raises NotPlacedYet while Slurm keeps it pending (its reason in words) and while slurmrestd cannot
        be reached or refuses the token (the launch waits), DriverError(permanent=True) when the job ended
        before it served (it failed, or was cancelled outside DevCloud) or Slurm refused it.
        """
        say = progress or (lambda message: None)
        record, created = SlurmJob.objects.get_or_create(
            instance_id=spec.instance_id, defaults={"host": self.host, "name": job_name(spec.instance_id)}
        )
        try:
            with self._rest() as rest:
                if created:
                    # A start makes the row before it submits, so no earlier start submitted a job; a
                    # search would list every job the cluster still knows, for nothing.
                    job = None
                else:
                    job = rest.job(record.job_id) if record.job_id else rest.find_job(record.name)
                if job is None:
                    job_id = rest.submit(script=slurm_job.batch_script(), job=self._job_request(spec))
                    SlurmJob.objects.filter(pk=record.pk).update(job_id=job_id)
                    say(f"Submitted to the Slurm cluster {self.cluster.name} as job {job_id}.")
                    job = rest.job(job_id)
                elif not record.job_id:
                    SlurmJob.objects.filter(pk=record.pk).update(job_id=job.job_id)
                return self._wait_for_report(rest, spec, job, say)
        except (SlurmUnreachable, SlurmBadToken) as error:
            # Nothing is lost while the cluster cannot be asked: the launch waits in place (the cluster
            # check tells the operators) and goes ahead when slurmrestd answers again.
            raise NotPlacedYet(self._error(error).message) from error
        except SlurmError as error:
            if error.status == 401:
                raise NotPlacedYet(self._error(error).message) from error
            raise self._error(error) from error

    def _job_request(self, spec: StartSpec) -> dict:
        cluster = self.cluster
        return slurm_job.job_request(
            name=job_name(spec.instance_id),
            gpus=spec.gpu_count,
            time_limit_minutes=max(1, spec.time_limit_seconds // 60),
            jupyter_token=spec.jupyter_token,
            jupyter_base_url=spec.lab_base_path,
            rootfs=image_rootfs(cluster, spec.image_reference),
            workspace_dir=self.workspace_dir(spec.workspace),
            run_dir=cluster.job_root,
            callback_url=f"{cluster.callback_url.rstrip('/')}/slurm/jobs/{spec.instance_id}/report",
            callback_token=callback_token(spec.instance_id),
            authorized_keys=spec.authorized_keys,
            partition=self.host.slurm_partition or None,
            gres_name=cluster.gres_name,
            device_dir=cluster.device_dir,
            cpus=max(1, math.ceil(spec.cpus)),
            memory_mb=spec.memory_bytes // (1024 * 1024),
            shm_mb=spec.shm_bytes // (1024 * 1024),
            heartbeat_seconds=settings.SLURM_JOB_HEARTBEAT_SECONDS,
        )

    def _wait_for_report(self, rest: SlurmRest, spec: StartSpec, job, say) -> StartResult:
        deadline = time.monotonic() + START_WAIT_SECONDS
        said = ""
        asked = 0
        while True:
            if job is None or job.ended:
                state = job.state if job else "gone"
                reason = f" ({job.reason})" if job and job.reason and job.reason != "None" else ""
                raise DriverError(
                    f"Its Slurm job ended before JupyterLab answered: {state}{reason}. See the job's output "
                    f"in {self.cluster.job_root} on the cluster.",
                    permanent=True,
                )
            record = SlurmJob.objects.get(instance_id=spec.instance_id)
            seen = {"slurm_state": job.state, "slurm_reason": job.reason or ""}
            if (record.slurm_state, record.slurm_reason) != tuple(seen.values()):
                SlurmJob.objects.filter(pk=record.pk).update(**seen)
            if record.reported_at is not None:
                # The report is the job's own word from its node that JupyterLab listens there; Slurm is
                # asked again only when the last answer predates the job's start (for its GPUs).
                if job.state != "RUNNING":
                    job = rest.job(job.job_id)
                    if job is None or job.ended:
                        continue
                address = record.address or self._node_address(rest, record.node)
                if not record.address:
                    SlurmJob.objects.filter(pk=record.pk).update(address=address)
                host_part = f"[{address}]" if ":" in address else address
                return StartResult(
                    endpoint=f"http://{host_part}:{record.jupyter_port}",
                    state={
                        "job_id": job.job_id,
                        "job_name": job.name,
                        "node": record.node,
                        "host_port": record.jupyter_port,
                        "ssh_port": record.ssh_port,
                        "image": spec.image_reference,
                        "gpus": job.gres_detail,
                    },
                )
            if job.state == "PENDING":
                waiting = pending_text(job.reason)
            else:
                waiting = f"starting on {job.nodes or 'its node'}"
                if job.start_time and time.time() - job.start_time > REPORT_TIMEOUT_SECONDS:
                    raise DriverError(
                        f"Its Slurm job {job.job_id} has run on {job.nodes} for over {REPORT_TIMEOUT_SECONDS} s "
                        f"without reporting where it listens. The operators should check that the nodes reach "
                        f"{self.cluster.callback_url} and read the job's output ({self.cluster.job_root}/"
                        f"{job.job_id}.out).",
                        permanent=True,
                    )
            if waiting != said:
                say(f"Slurm job {job.job_id}: {waiting}.")
                said = waiting
            if time.monotonic() > deadline and (
                job.state == "PENDING" or time.monotonic() > deadline + REPORT_TIMEOUT_SECONDS
            ):
                # Only a job Slurm still holds is handed back: one that runs reports within seconds (up to
                # REPORT_TIMEOUT_SECONDS, checked above), and handing it back would make its report wait
                # for the lifecycle's next ask, seconds later, in a loaded burst.
                raise NotPlacedYet(waiting)
            gap = min(JOB_POLL_SECONDS * 2**asked, JOB_POLL_MAX_SECONDS)
            left = deadline - time.monotonic()
            if self._until_reported(spec.instance_id, min(gap, left) if left > 0 else gap):
                continue  # straight to the endpoint, without asking Slurm first
            job = rest.job(job.job_id)
            asked += 1

    @staticmethod
    def _until_reported(instance_id, seconds: float) -> bool:
        """Returns True once the job's report has come, False after `seconds` without it. Sleeps on the
        report's Redis signal (provisioning/slurm/callback.py); reads the job's row every
        REPORT_POLL_SECONDS instead when Redis does not answer."""
        until = time.monotonic() + seconds

        def reported() -> bool:
            return SlurmJob.objects.filter(instance_id=instance_id, reported_at__isnull=False).exists()

        if reported():
            return True
        left = until - time.monotonic()
        if left > 0:
            try:
                client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=left + 5)
                # Never 0: BLPOP would block for good.
                client.blpop([report_signal_key(instance_id)], timeout=max(left, 0.05))
            except (redis.RedisError, OSError):
                while not reported() and time.monotonic() < until:
                    time.sleep(REPORT_POLL_SECONDS)
        return reported()

    def _node_address(self, rest: SlurmRest, node_name: str) -> str:
        key = (self.cluster.rest_url, node_name)
        known = _NODE_ADDRESSES.get(key)
        if known and time.monotonic() - known[1] < NODE_ADDRESS_SECONDS:
            return known[0]
        for node in rest.nodes():
            _NODE_ADDRESSES[(self.cluster.rest_url, node.name)] = (node.address or node.name, time.monotonic())
        if key in _NODE_ADDRESSES:
            return _NODE_ADDRESSES[key][0]
        raise DriverError(f"Slurm does not know the node {node_name!r} its job reported.", permanent=False)

    def stop(self, ref: InstanceRef) -> None:
        """Cancels the instance's job and returns once Slurm says it ended; a job that is gone is stopped.

        Raises DriverError(permanent=False) when slurmrestd cannot be reached or the job is still ending.
        """
        record = SlurmJob.objects.filter(instance_id=ref.id).first()
        try:
            with self._rest() as rest:
                job_id = (record.job_id if record else None) or ref.state.get("job_id")
                job = rest.job(job_id) if job_id else rest.find_job(job_name(ref.id))
                if job is not None and not job.ended:
                    rest.cancel(job.job_id)
                    deadline = time.monotonic() + STOP_WAIT_SECONDS
                    while job is not None and not job.ended:
                        if time.monotonic() > deadline:
                            raise DriverError(
                                f"Slurm job {job.job_id} was cancelled but has not ended yet ({job.state}).",
                                permanent=False,
                            )
                        time.sleep(POLL_SECONDS)
                        job = rest.job(job.job_id)
        except SlurmError as error:
            raise self._error(error) from error
        if record is not None:
            SlurmJob.objects.filter(pk=record.pk, ended_at__isnull=True).update(
                ended_at=timezone.now(), slurm_state=job.state if job is not None else record.slurm_state
            )
            self._remove_job_dir(record.job_id)

    def poll(self, ref: InstanceRef) -> PollResult:
        """running, pending, exited (ended_because "host_down" when its node failed under it, with
        last_seen_at) or missing. Raises DriverError(permanent=False) when slurmrestd cannot be reached."""
        record = SlurmJob.objects.filter(instance_id=ref.id).first()
        if record is None or not record.job_id:
            return PollResult(status="missing")
        try:
            with self._rest() as rest:
                job = rest.job(record.job_id)
        except SlurmError as error:
            raise self._error(error) from error
        now = timezone.now()
        if job is None:
            # Forgotten by Slurm (MinJobAge): what DevCloud saw last stands.
            if record.slurm_state in LIVE_STATES or not record.slurm_state:
                return PollResult(status="missing", detail="Slurm no longer knows the job.")
            return self._ended(record, record.slurm_state, record.slurm_reason)
        if job.state == "RUNNING":
            # Not a sighting: Slurm says RUNNING for a while after a node goes silent. The job's own
            # reports from its node are the sightings (provisioning/slurm/callback.py).
            if record.slurm_state != job.state:
                SlurmJob.objects.filter(pk=record.pk).update(slurm_state=job.state)
            return PollResult(status="running")
        if not job.ended:
            SlurmJob.objects.filter(pk=record.pk).update(slurm_state=job.state, slurm_reason=job.reason or "")
            return PollResult(status="pending", detail=pending_text(job.reason))
        SlurmJob.objects.filter(pk=record.pk).update(
            slurm_state=job.state, slurm_reason=job.reason or "", ended_at=record.ended_at or now
        )
        self._remove_job_dir(record.job_id)
        result = self._ended(record, job.state, job.reason)
        result.exit_code = job.exit_code
        return result

    @staticmethod
    def _ended(record, state: str, reason: str) -> PollResult:
        detail = f"Slurm says {state}" + (f" ({reason})" if reason and reason != "None" else "")
        return PollResult(
            status="exited",
            detail=detail,
            ended_because=ENDED_BECAUSE.get(state, ""),
            last_seen_at=record.last_seen_running_at,
        )

    def _remove_job_dir(self, job_id) -> None:
        """Removes the ended job's directory under the job directory (its bundle and its home, with the
        container's sshd host key), when the portal sees it. The workspace is elsewhere and stays, and so
        does the job's output (<job id>.out beside it), which a failed launch's message points to."""
        if job_id:
            shutil.rmtree(os.path.join(self.cluster.job_root, str(int(job_id))), ignore_errors=True)

    def managed_instance_ids(self) -> set[str]:
        """Instance ids of this portal's live jobs in the partition (named devcloud-<portal id>-<uuid>).

        Raises DriverError(permanent=False) when slurmrestd cannot be reached.
        """
        prefix = job_prefix()
        try:
            with self._rest() as rest:
                jobs = [job for job in rest.jobs() if job.name.startswith(prefix) and not job.ended]
        except SlurmError as error:
            raise self._error(error) from error
        partition = self.host.slurm_partition
        if partition:
            jobs = [job for job in jobs if not job.partition or job.partition == partition]
        return {job.name[len(prefix) :] for job in jobs}

    def logs(self, ref: InstanceRef, tail: int = 100) -> str:
        """The last `tail` lines of the job's output file, when the portal sees the cluster's job_root."""
        record = SlurmJob.objects.filter(instance_id=ref.id).first()
        if record is None or not record.job_id:
            return ""
        try:
            with open(os.path.join(self.cluster.job_root, f"{record.job_id}.out"), errors="replace") as output:
                lines = output.read().splitlines()[-tail:]
        except OSError:
            return ""
        return hide_token("\n".join(lines), ref.jupyter_token)

    def authorized_keys_set(self, ref: InstanceRef, text: str) -> bool:
        """Writes the job's keys/authorized_keys on shared storage (owner root, mode 0644; the container
        sees it read-only at /etc/devcloud/ssh/keys). False when the job has no keys directory there (not
        started, or the portal does not see the cluster's job_root)."""
        record = SlurmJob.objects.filter(instance_id=ref.id).first()
        if record is None or not record.job_id:
            return False
        key_dir = os.path.join(self.cluster.job_root, str(record.job_id), "keys")
        if not os.path.isdir(key_dir):
            return False
        partial = os.path.join(key_dir, "authorized_keys.partial")
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w") as handle:
            handle.write(text)
        # Root's, like the directory: sshd (uid 1000) reads it, and only root may change it.
        os.chown(partial, 0, 0)
        os.chmod(partial, 0o644)
        os.replace(partial, os.path.join(key_dir, "authorized_keys"))
        return True

    def remove_workspace(self, owner_id) -> None:
        """Removes the person's workspace directory on the shared storage (when the portal sees it)."""
        from ..workspaces import workspace_name

        shutil.rmtree(self.workspace_dir(workspace_name(owner_id)), ignore_errors=True)


def image_rootfs(cluster, reference: str) -> str:
    """Where the root filesystem of the image `reference` lives on the cluster's shared storage:
    <image_root>/<the reference with every character but letters, digits, "_", "." and "-" as "_">
    (devcloud/cpu:abc is devcloud_cpu_abc)."""
    return os.path.join(cluster.image_root, re.sub(r"[^A-Za-z0-9_.-]", "_", reference))
