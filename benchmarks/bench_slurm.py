"""Launch on Slurm: from clicking Launch to JupyterLab's /api/status answering through the gateway, next to
the same job submitted straight to slurmrestd and asked directly, measured in the same run.

What runs, all of it real:
- the test Slurm cluster (tests/support/slurm.py, a slot of its own): munge, slurmctld, slurmrestd with
  JWT, two slurmds in network namespaces with eight stand-in GPUs each; each job runs the portal's CPU
  image with runc through `srun --container`;
- a scratch PostgreSQL database, Redis, and the Celery workers of portal/workers.py (the default worker
  and the provisioning worker's thread pool), each with exactly the command line
  portal.workers.command() gives it, the production settings and queues of this run's own
  (benchmarks.layout_workers);
- the portal (Django and the gateway) as the deploy kit's web unit runs it (benchmarks.start_kit_web: its
  uvicorn command line, the production settings), listening on the cluster's controller address instead
  of loopback: that is where the nodes reach this machine, so the jobs' reports come to it there, as they
  would come through nginx in production;
- the cluster registered through provisioning.slurm.clusters.cluster_register, with the tests' per-GPU
  shares on the partition (1 CPU and 400 MB a GPU: a test node has 16 CPUs and 4,000 MB) and the shipped
  SLURM_JOB_HEARTBEAT_SECONDS.

The two sides:
- portal: `services.instance_launch` (what the Launch button's view calls) -> the provisioning worker
  hands it to the partition, submits its job through slurmrestd, waits for the job's report of its node
  and ports and then for JupyterLab -> the first 200 of GET /instances/<id>/lab/api/status through the
  gateway with the owner's session cookie. The clock waits for the instance to run (the gateway refuses an
  instance until it runs) and then asks the gateway. It learns that the instance runs from PostgreSQL
  (RunningWatcher: NOTIFY from a trigger on the scratch database's instance table), not by reading the
  row every 10 ms as bench_launch's StateWatcher does: those reads took CPU from the starting job on the
  portal's side only (the plain side's clock sleeps until its report comes; docs/slurm.md has figures).
- plain: the same job, provisioning.slurm.job.batch_script() and job_request() with the parameters the
  driver passes (from the warm-up launch's start spec: GPUs, CPUs, memory, /dev/shm, time limit, image,
  partition, the person's workspace, heartbeat), submitted with SlurmRest.submit. A small HTTP server on
  the controller address takes the job's report (node and ports; it answers 204 as the portal does), and
  the clock then asks GET http://<node>:<port>/instances/<id>/lab/api/status with the token until it
  answers 200. The nodes' addresses come from one REST listing made before the runs. Both sides make
  their HTTP clients inside the clock, except the portal's "browser", which is open before the click.

Single launches alternate portal / plain, SINGLES times each after one warm-up of both. A burst fires
BURST launches at once from as many threads (one person each; 16 GPUs hold them all), and as many plain
submissions at once, BURST_ROUNDS rounds a side, alternating which side goes first. After every run each
job is cancelled and the nodes are idle again before the next. Target: the portal's median within
TARGET_RATIO times plain's, for single launches, for a burst's instances, and for the moment each
burst's last instance is ready (median over the rounds).

Each side's time is also printed phase by phase, from the portal's timeline (InstanceEvent rows, the
SlurmJob row) and from JupyterLab's own timestamped log lines in the job's output (its first line, and
the one saying it serves). From the submission to JupyterLab serving is Slurm's, runc's and JupyterLab's
part, the same job on both sides, slower only where the portal's own processes take CPU from it; what
the portal adds itself comes before the submission and after JupyterLab serves.

Needs root and the tools of the test cluster (tests/support/slurm.py says which), and the CPU image
(built first when missing); prints why and returns {} when the machine cannot run a cluster.

    python -m benchmarks slurm        (BENCH_SLURM_SINGLES, BENCH_SLURM_BURST_ROUNDS change the counts)
"""

import json
import logging
import math
import os
import re
import secrets
import statistics
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from benchmarks import bench_people, kit_env, layout_workers, scratch_database, start_kit_web
from benchmarks import database_url as bench_database_url
from benchmarks.bench_launch import StateWatcher

DATABASE = "devcloud_bench_slurm"
SINGLES = int(os.environ.get("BENCH_SLURM_SINGLES", "8"))
BURST = 8
# Rounds per side, alternating which side goes first (an even number favours neither).
BURST_ROUNDS = int(os.environ.get("BENCH_SLURM_BURST_ROUNDS", "4"))
TARGET_RATIO = 1.10
# How often the clocks ask JupyterLab, directly or through the gateway, once the job reported (plain) or
# the instance runs (portal): every 10 ms for a single launch, every 50 ms in a burst (eight clocks at
# 10 ms would themselves load two cores), on both sides alike.
POLL = 0.01
BURST_POLL = 0.05
# A launch takes seconds, a burst's last well under a minute here.
TIMEOUT = 60
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "9"))
SLURM_USER = "root"
MIB = 1024 * 1024


@dataclass
class Sample:
    """One launch: seconds from the click (or the submission) to the first 200, and where they went."""

    total: float
    phases: dict = field(default_factory=dict)


def _until(predicate, what: str, *, interval: float, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def _answers(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()


# JupyterLab's log lines in the job's output: "[I 2026-12-03 18:08:29.172 ServerApp] ...", in UTC (the
# image's time zone); the line it logs once it serves.
LAB_LOG_LINE = re.compile(r"^\[[A-Z] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) ")
SERVING_LINE = "Use Control-C to stop this server"


def _lab_times(job_root: str, job_id: int, timeout: float = 5) -> tuple[datetime, datetime]:
    """When JupyterLab in job `job_id` logged its first line and when it logged that it serves, from the
    job's output (<job root>/<job id>.out; srun forwards it a little later than it was logged). Raises
    RuntimeError when it has not said it serves within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        first = None
        with open(os.path.join(job_root, f"{job_id}.out"), errors="replace") as output:
            for line in output:
                match = LAB_LOG_LINE.match(line)
                if not match:
                    continue
                moment = datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC)
                first = first or moment
                if SERVING_LINE in line:
                    return first, moment
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} never logged {SERVING_LINE!r}")
        time.sleep(0.05)


def _job_output(instance_id, lines: int = 15) -> str:
    """The end of the output of the instance's job, to print beside a launch that failed."""
    from provisioning.models import SlurmJob

    record = SlurmJob.objects.select_related("host__slurm_cluster").filter(instance_id=instance_id).first()
    if record is None or not record.job_id:
        return "(no Slurm job was submitted)"
    return _output_tail(record.host.slurm_cluster.job_root, record.job_id, lines)


def _output_tail(job_root: str, job_id: int, lines: int = 15) -> str:
    try:
        with open(os.path.join(job_root, f"{job_id}.out"), errors="replace") as output:
            tail = output.read().splitlines()[-lines:]
    except OSError as error:
        return f"(no output of job {job_id}: {error})"
    return f"the end of job {job_id}'s output:\n" + "\n".join(tail)


class ReportReceiver:
    """The plain side's stand-in for the portal's report endpoint: an HTTP server on `address` that takes
    each job's POST /slurm/jobs/<key>/report, keeps its JSON body and answers 204."""

    def __init__(self, address: str):
        self._reports: dict[str, dict] = {}
        self._arrived: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                report = json.loads(self.rfile.read(length) or b"{}")
                parts = self.path.strip("/").split("/")
                if len(parts) == 4 and parts[:2] == ["slurm", "jobs"] and parts[3] == "report":
                    receiver._arrive(parts[2], report)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{address}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="bench-reports", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def _event(self, key: str) -> threading.Event:
        with self._lock:
            return self._arrived.setdefault(key, threading.Event())

    def _arrive(self, key: str, report: dict) -> None:
        self._reports.setdefault(key, report)
        self._event(key).set()

    def wait(self, key: str, timeout: float = TIMEOUT) -> dict:
        """The first report of job <key>. Raises RuntimeError when none came within `timeout` seconds."""
        if not self._event(key).wait(timeout):
            raise RuntimeError(f"the plain job {key} did not report within {timeout} s")
        return self._reports[key]


class Plain:
    """The portal's job, by hand: batch_script() and job_request() with the driver's parameters for
    `spec` (a StartSpec on `partition`), submitted straight to slurmrestd."""

    def __init__(self, partition, spec, receiver: ReportReceiver, token: str, addresses: dict[str, str]):
        from django.conf import settings

        from provisioning.drivers.slurm import image_rootfs
        from provisioning.slurm.job import batch_script

        cluster = partition.slurm_cluster
        self.cluster = cluster
        self.receiver = receiver
        self.token = token
        self.addresses = addresses
        self.script = batch_script()
        # What SlurmDriver._job_request derives from the start spec, beside what differs per job.
        self.parameters = {
            "gpus": spec.gpu_count,
            "time_limit_minutes": max(1, spec.time_limit_seconds // 60),
            "rootfs": image_rootfs(cluster, spec.image_reference),
            "run_dir": cluster.job_root,
            "authorized_keys": spec.authorized_keys,
            "partition": partition.slurm_partition or None,
            "gres_name": cluster.gres_name,
            "device_dir": cluster.device_dir,
            "cpus": max(1, math.ceil(spec.cpus)),
            "memory_mb": spec.memory_bytes // MIB,
            "shm_mb": spec.shm_bytes // MIB,
            "heartbeat_seconds": settings.SLURM_JOB_HEARTBEAT_SECONDS,
        }

    def run_and_time(self, workspace: str, interval: float) -> Sample:
        """Submits one job with `workspace` (a directory name under the workspace root) and returns its
        Sample once its JupyterLab answers 200."""
        from portal.gateway import lab_path
        from provisioning.slurm.job import job_request
        from provisioning.slurm.rest import SlurmRest

        key = str(uuid.uuid4())
        jupyter_token = secrets.token_hex(24)
        base = lab_path(key)
        job = job_request(
            name=f"bench-plain-{key}",
            jupyter_token=jupyter_token,
            jupyter_base_url=base,
            workspace_dir=os.path.join(self.cluster.workspace_root, workspace),
            callback_url=f"{self.receiver.url}/slurm/jobs/{key}/report",
            callback_token=secrets.token_hex(32),
            **self.parameters,
        )
        clicked = _now()
        started = time.perf_counter()
        with SlurmRest(self.cluster.rest_url, user_name=SLURM_USER, token=self.token, timeout=10) as rest:
            job_id = rest.submit(script=self.script, job=job)
        submitted = time.perf_counter()
        report = self.receiver.wait(key)
        reported = time.perf_counter()
        url = f"http://{self.addresses[report['node']]}:{report['jupyter_port']}{base}api/status"
        headers = {"Authorization": f"token {jupyter_token}"}
        with httpx.Client(headers=headers, timeout=2, trust_env=False, follow_redirects=False) as client:
            try:
                _until(lambda: _answers(client, url), f"the plain job {job_id} to answer", interval=interval)
            except RuntimeError as error:
                raise RuntimeError(f"{error}\n{_output_tail(self.cluster.job_root, job_id)}") from error
        answered = time.perf_counter()

        def at(moment: float) -> datetime:
            return clicked + timedelta(seconds=moment - started)

        logs, serves = _lab_times(self.cluster.job_root, job_id)
        marks = [
            ("click -> job submitted", clicked, at(submitted)),
            ("submitted -> job reports", at(submitted), at(reported)),
            ("report -> JupyterLab logs", at(reported), logs),
            ("JupyterLab logs -> it serves", logs, serves),
            ("serves -> 200", serves, at(answered)),
        ]
        return Sample(
            total=answered - started,
            phases={label: (end - begin).total_seconds() for label, begin, end in marks},
        )


class RunningWatcher(StateWatcher):
    """Tells waiting clocks when their instance runs, woken by PostgreSQL rather than by polling.

    A trigger on the instance table (in the bench's scratch database only) NOTIFYs on every change of an
    instance's state; the watcher's thread LISTENs and, on each notification, reads the states of the
    instances being waited for. Until the instance runs the clock costs nothing, as the plain side's
    clock, which sleeps until its job's report, costs nothing: reading the rows every 10 ms (the
    StateWatcher it extends) took CPU from the job starting, on the portal's side only. It also reads them
    every SAFETY_SECONDS, for a change it could have missed while it registered a clock.
    """

    CHANNEL = "bench_instance_state"
    SAFETY_SECONDS = 0.5

    def __init__(self, database_url: str):
        super().__init__()
        self._url = database_url
        self._listening = threading.Event()

    def __enter__(self):
        from django.db import connection

        from portal.instances.models import Instance

        table = connection.ops.quote_name(Instance._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                CREATE OR REPLACE FUNCTION bench_instance_state_notify() RETURNS trigger AS $$
                BEGIN
                  IF NEW.state IS DISTINCT FROM OLD.state THEN
                    PERFORM pg_notify('{self.CHANNEL}', NEW.id::text);
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql;
                DROP TRIGGER IF EXISTS bench_instance_state ON {table};
                CREATE TRIGGER bench_instance_state AFTER UPDATE ON {table}
                  FOR EACH ROW EXECUTE FUNCTION bench_instance_state_notify();
                """
            )
        super().__enter__()
        if not self._listening.wait(10):
            raise RuntimeError("the running watcher did not start listening")
        return self

    @contextmanager
    def _pauses(self):
        """Between two looks: until the first notification, or SAFETY_SECONDS without one."""
        import psycopg

        with psycopg.connect(self._url, autocommit=True) as listener:
            listener.execute(f"LISTEN {self.CHANNEL}")
            self._listening.set()

            def pause():
                for _ in listener.notifies(timeout=self.SAFETY_SECONDS, stop_after=1):
                    pass

            yield pause


class Portal:
    """Launches as a person clicks Launch, timed to the first 200 through the gateway."""

    def __init__(self, url: str, watcher):
        self.url = url
        self.watcher = watcher

    @staticmethod
    def session_for(user) -> str:
        from django.conf import settings
        from django.test import Client

        browser = Client()
        browser.force_login(user)
        return browser.cookies[settings.SESSION_COOKIE_NAME].value

    def launch_and_time(self, user, session_key: str, interval: float) -> tuple[Sample, object]:
        """Launches for `user`; returns its Sample and the instance id."""
        from django.db import close_old_connections

        from benchmarks.bench_launch import PRODUCTION_SESSION_COOKIE
        from portal.instances import services

        # Open before the click: the browser already shows the portal.
        browser = httpx.Client(cookies={PRODUCTION_SESSION_COOKIE: session_key}, timeout=5, trust_env=False)
        try:
            clicked = _now()
            started = time.perf_counter()
            instance = services.instance_launch(user=user, size="1x", image_key="cpu")
            launched = time.perf_counter()
            try:
                self.watcher.wait_running(instance.id, timeout=TIMEOUT)
            except RuntimeError as error:
                raise RuntimeError(f"{error}\n{_job_output(instance.id)}") from error
            seen = time.perf_counter()
            url = f"{self.url}/instances/{instance.id}/lab/api/status"
            _until(
                lambda: _answers(browser, url),
                f"the gateway to answer for {instance.short_id}",
                interval=interval,
            )
            answered = time.perf_counter()

            def at(moment: float) -> datetime:
                return clicked + timedelta(seconds=moment - started)

            return self._sample(instance.id, clicked, at(launched), at(seen), at(answered)), instance.id
        finally:
            browser.close()
            close_old_connections()

    @staticmethod
    def _sample(
        instance_id, clicked: datetime, launched: datetime, seen: datetime, answered: datetime
    ) -> Sample:
        """Where one launch's time went, from its timeline (InstanceEvent rows) and its SlurmJob row."""
        from portal.instances.models import Instance
        from provisioning.models import SlurmJob

        instance = Instance.objects.select_related("host__slurm_cluster").get(pk=instance_id)
        events = list(instance.events.order_by("created_at", "id"))

        def first(prefix: str) -> datetime:
            return next(event.created_at for event in events if event.message.startswith(prefix))

        submitted = first("Submitted to the Slurm cluster")
        record = SlurmJob.objects.get(instance_id=instance_id)
        logs, serves = _lab_times(instance.host.slurm_cluster.job_root, record.job_id)
        marks = [
            ("click -> the launch is recorded", clicked, launched),
            ("recorded -> worker claims it", launched, instance.provisioning_at),
            ("claim -> job submitted", instance.provisioning_at, submitted),
            ("submitted -> job reports", submitted, record.reported_at),
            ("report -> JupyterLab logs", record.reported_at, logs),
            ("JupyterLab logs -> it serves", logs, serves),
            ("serves -> lifecycle's 200 (ready)", serves, instance.ready_at),
            ("ready -> the clock sees it running", instance.ready_at, seen),
            ("-> gateway answers 200", seen, answered),
            ("(report -> driver passes it on)", record.reported_at, first("Waiting for JupyterLab")),
        ]
        return Sample(
            total=(answered - clicked).total_seconds(),
            phases={label: (end - begin).total_seconds() for label, begin, end in marks},
        )

    def stop_all(self, launched: list) -> None:
        """Stops each (user, instance id) and returns once every one is stopped."""
        from portal.instances import services
        from portal.instances.models import Instance

        for user, instance_id in launched:
            services.instance_stop(user=user, instance_id=instance_id)
        ids = [instance_id for _, instance_id in launched]
        _until(
            lambda: Instance.objects.filter(pk__in=ids, state=Instance.State.STOPPED).count() == len(ids),
            "the teardowns",
            interval=0.1,
        )


def _burst(count: int, work) -> list:
    """Runs work(i) in `count` threads released together; returns their results in order. Raises
    RuntimeError when any failed, once all ended."""
    from django.db import connection

    results: list = [None] * count
    gate = threading.Barrier(count)

    def run(index):
        gate.wait()
        try:
            results[index] = work(index)
        except Exception as error:  # noqa: BLE001  (reported below, once every thread ended)
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [result for result in results if isinstance(result, Exception)]
    if errors:
        raise RuntimeError(f"{len(errors)} of the burst failed: {errors[0]}")
    return results


@contextmanager
def _portal_web(host: str, database_url: str, log: Path, env: dict):
    """The kit's web unit listening on `host`; yields its URL once it answers."""
    from tests.gateway.helpers import free_port

    port = free_port()
    process = start_kit_web(port, database_url, log, host=host, env=env)
    url = f"http://{host}:{port}"
    try:
        with httpx.Client(trust_env=False) as client:
            _until(
                lambda: _answers(client, f"{url}/accounts/login/"),
                "the portal to answer",
                interval=0.05,
                timeout=60,
            )
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


def _median(values) -> float:
    return statistics.median(list(values))


def _report(label: str, portal: list[Sample], plain: list[Sample], size: int = 0) -> dict:
    """Prints one scenario against TARGET_RATIO; returns its figures. `size`, for a burst, is how many
    each round fired: the last one ready in each round is then compared too (median over the rounds)."""
    figures = {
        "portal_median_s": _median(s.total for s in portal),
        "plain_median_s": _median(s.total for s in plain),
        "portal_max_s": max(s.total for s in portal),
        "plain_max_s": max(s.total for s in plain),
    }
    figures["ratio"] = figures["portal_median_s"] / figures["plain_median_s"]
    print(f"{label} (n = {len(portal)} each)")
    print(
        f"  portal, through the gateway   median {figures['portal_median_s']:6.3f} s   max {figures['portal_max_s']:6.3f} s"
    )
    print(
        f"  plain job, asked directly     median {figures['plain_median_s']:6.3f} s   max {figures['plain_max_s']:6.3f} s"
    )
    verdict = "meets" if figures["ratio"] <= TARGET_RATIO else "MISSES"
    print(
        f"  portal - plain {figures['portal_median_s'] - figures['plain_median_s']:+.3f} s; ratio "
        f"{figures['ratio']:.3f}x, target {TARGET_RATIO:.2f}x: {verdict}"
    )
    if size:
        lasts = {
            side: [max(s.total for s in samples[i : i + size]) for i in range(0, len(samples), size)]
            for side, samples in (("portal", portal), ("plain", plain))
        }
        figures["portal_last_median_s"] = _median(lasts["portal"])
        figures["plain_last_median_s"] = _median(lasts["plain"])
        figures["last_ratio"] = figures["portal_last_median_s"] / figures["plain_last_median_s"]
        figures["max_ratio"] = figures["portal_max_s"] / figures["plain_max_s"]
        verdict = "meets" if figures["last_ratio"] <= TARGET_RATIO else "MISSES"
        print(
            f"  each round's last one ready, median of {len(lasts['portal'])} rounds: portal "
            f"{figures['portal_last_median_s']:.3f} s, plain {figures['plain_last_median_s']:.3f} s, ratio "
            f"{figures['last_ratio']:.3f}x: {verdict} (the slowest of all rounds: {figures['max_ratio']:.3f}x)"
        )
    print("  where the time goes (median of each phase):")
    for samples, side in ((portal, "portal"), (plain, "plain")):
        for phase in samples[0].phases:
            print(f"    {side:<6} {phase:<36} {_median(s.phases[phase] for s in samples):6.3f} s")
    return {key: round(value, 3) for key, value in figures.items()}


def _register(slurm_cluster, rootfs: Path, portal_id: str, callback_url: str):
    """The cluster registered as an operator registers it, with shared directories of this run's own;
    returns the partition's GpuHost."""
    from provisioning.models import GpuHost
    from provisioning.slurm import clusters

    shared = Path(slurm_cluster.directory) / "shared" / portal_id
    for name in ("workspaces", "jobs"):
        (shared / name).mkdir(parents=True, exist_ok=True)
    shared.chmod(0o755)
    cluster = clusters.cluster_register(
        actor=None,
        name="hpc",
        rest_url=slurm_cluster.rest_url,
        rest_user=SLURM_USER,
        token=slurm_cluster.token(SLURM_USER),
        partitions=[slurm_cluster.partition],
        gres_name=slurm_cluster.gres_name,
        image_root=str(rootfs.parent),
        workspace_root=str(shared / "workspaces"),
        job_root=str(shared / "jobs"),
        device_dir=str(slurm_cluster.device_dir("{node}")),
        callback_url=callback_url,
    )
    partition = cluster.partitions.get()
    # A test node has 16 CPUs and 4,000 MB: the tests' shares, so that eight 1-GPU instances fit on one.
    GpuHost.objects.filter(pk=partition.pk).update(cpus_per_gpu=1, memory_mb_per_gpu=400)
    return GpuHost.objects.select_related("slurm_cluster").get(pk=partition.pk)


def main() -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from tests.support.slurm import SlurmCluster, SlurmUnavailable

    try:
        slurm_cluster = SlurmCluster.start(nodes=2)
    except SlurmUnavailable as error:
        print(f"skipped: no Slurm test cluster on this machine: {error}")
        return {}
    try:
        return _run(slurm_cluster)
    finally:
        slurm_cluster.stop()


def _run(slurm_cluster) -> dict:
    from django.db import connection
    from django.test import override_settings

    from portal.instances.catalog import catalog_sync
    from portal.instances.models import Instance
    from portal.instances.start_spec import start_spec_for
    from provisioning.slurm.rest import SlurmRest
    from provisioning.workspaces import workspace_name
    from tests.support.images import build_cpu_image
    from tests.support.slurm_portal import cancel_all
    from tests.support.worker import celery_publishing_to, redis_url, unique_queue

    reference = build_cpu_image()
    rootfs = slurm_cluster.rootfs_for(reference)
    portal_id = f"bench-slurm-{uuid.uuid4().hex[:8]}"
    default_queue, launch_queue = unique_queue("bench-default"), unique_queue("bench-slurm")
    broker = redis_url(REDIS_DB)
    address = slurm_cluster.controller_address
    print(
        f"test cluster in slot {slurm_cluster.slot}: {len(slurm_cluster.nodes)} nodes x "
        f"{slurm_cluster.gpus_per_node} GPUs, up in {slurm_cluster.started_in_seconds:.1f} s; image {reference}",
        flush=True,
    )

    with (
        scratch_database(DATABASE),
        tempfile.TemporaryDirectory(prefix="bench-slurm-") as scratch,
        override_settings(
            DEVCLOUD_PORTAL_ID=portal_id,
            CELERY_TASK_ALWAYS_EAGER=False,
            CELERY_TASK_DEFAULT_QUEUE=default_queue,
            CELERY_PROVISIONING_QUEUE=launch_queue,
        ),
    ):
        scratch = Path(scratch)
        catalog_sync()
        users = bench_people(BURST)
        database_url = bench_database_url(connection.settings_dict)
        # What the deploy kit's environment file gives the workers and the web unit, pointed at this run's
        # database, Redis, queues and portal id.
        env = kit_env(
            database_url=database_url,
            broker=broker,
            default_queue=default_queue,
            launch_queue=launch_queue,
            portal_id=portal_id,
            READY_TIMEOUT_SECONDS="50",
        )
        web_env = {
            key: env[key]
            for key in (
                "REDIS_URL",
                "CELERY_BROKER_URL",
                "CELERY_QUEUE",
                "CELERY_PROVISIONING_QUEUE",
                "DEVCLOUD_PORTAL_ID",
            )
        }
        web_env["ALLOWED_HOSTS"] = address
        with (
            _portal_web(address, database_url, scratch / "portal.log", web_env) as portal_url,
            layout_workers(env, scratch),
            celery_publishing_to(broker_url=broker, queue=default_queue),
            RunningWatcher(database_url) as watcher,
            ReportReceiver(address) as receiver,
        ):
            partition = _register(slurm_cluster, rootfs, portal_id, portal_url)
            token = slurm_cluster.token(SLURM_USER)
            with SlurmRest(slurm_cluster.rest_url, user_name=SLURM_USER, token=token) as rest:
                addresses = {node.name: node.address for node in rest.nodes()}
            portal = Portal(portal_url, watcher)
            sessions = [portal.session_for(user) for user in users]
            workspaces = [workspace_name(user.id) for user in users]

            # Warm-up (the rootfs in the page cache, the first person's workspace made, connections open);
            # the plain side takes the driver's parameters from the warm-up launch's start spec.
            _, warm = portal.launch_and_time(users[0], sessions[0], POLL)
            spec = start_spec_for(Instance.objects.select_related("image").get(pk=warm), host=partition)
            plain = Plain(partition, spec, receiver, token, addresses)
            portal.stop_all([(users[0], warm)])
            cancel_all(slurm_cluster)
            plain.run_and_time(workspaces[0], POLL)
            cancel_all(slurm_cluster)

            singles_portal, singles_plain = [], []
            for _ in range(SINGLES):
                sample, instance_id = portal.launch_and_time(users[0], sessions[0], POLL)
                singles_portal.append(sample)
                portal.stop_all([(users[0], instance_id)])
                cancel_all(slurm_cluster)
                singles_plain.append(plain.run_and_time(workspaces[0], POLL))
                cancel_all(slurm_cluster)
            print(f"Launch to JupyterLab /api/status on Slurm, CPU image {reference}", flush=True)
            figures = {}
            if SINGLES:
                single = _report("1 launch", singles_portal, singles_plain)
                figures.update({f"single_{key}": value for key, value in single.items()})

            burst_portal, burst_plain = [], []

            def portal_burst():
                launched = _burst(BURST, lambda i: portal.launch_and_time(users[i], sessions[i], BURST_POLL))
                burst_portal.extend(sample for sample, _ in launched)
                portal.stop_all([(user, instance_id) for user, (_, instance_id) in zip(users, launched)])
                cancel_all(slurm_cluster)

            def plain_burst():
                try:
                    burst_plain.extend(_burst(BURST, lambda i: plain.run_and_time(workspaces[i], BURST_POLL)))
                finally:
                    cancel_all(slurm_cluster)

            for number in range(BURST_ROUNDS):
                for run in (portal_burst, plain_burst)[:: 1 if number % 2 == 0 else -1]:
                    run()
            if BURST_ROUNDS:
                burst = _report(f"burst of {BURST}, per instance", burst_portal, burst_plain, size=BURST)
                figures.update({f"burst{BURST}_{key}": value for key, value in burst.items()})
    figures["target_ratio"] = TARGET_RATIO
    return figures


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
