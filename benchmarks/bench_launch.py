"""Launch latency: from clicking Launch to JupyterLab answering /api/status through the gateway, next to a
plain `docker run` of the same image with the same hardening and a network of its own, answering
/api/status, measured in the same run on the same machine.

Everything is real: a scratch PostgreSQL database, Redis, the Celery workers, the Docker engine with the
built CPU image, and the portal in its own process with the deploy kit's web command line and production
settings (benchmarks.start_kit_web). Simulated 8x
MI300X hosts (the KFD fixture sysfs and stand-in device nodes), as many as the largest burst needs,
share the local engine; their containers may use every CPU of the engine, as a plain `docker run` may.
The workers run with DEVCLOUD_DISK_LIMITS=warn: this machine's engine keeps its data on ext4, which cannot
enforce the kit's disk limits.

The workers are the layout `make run` and the deploy kit start (portal/workers.py): the default worker
and the provisioning worker, each with exactly the command line `portal.workers.command()` gives them,
the production settings, and queues of their own for this run.

- portal: `instance_launch` (what the Launch button's view calls) -> the provisioning worker allocates,
  starts the hardened container on its own network, and waits for JupyterLab -> the first 200 from
  GET /instances/<id>/lab/api/status through the gateway with the owner's session cookie. The gateway
  refuses an instance until it runs, so the clock waits for the instance to run (one thread reads every
  waited-for state in one query per look) and then asks the gateway.
- plain: what an operator would type for one hardened instance: `docker network create` (a bridge of
  its own), `docker volume create` (the workspace), then `docker run -d` with the hardening of the
  portal's own container (user, dropped capabilities, no-new-privileges, memory, CPUs, pids, shm, IPC,
  the stand-in GPU devices and their groups, log limits; read from the warm-up launch's container), the
  same environment and published ports; then, as the portal's readiness wait does, it follows the
  container's output until JupyterLab says it serves and asks GET /api/status on its port until it
  answers 200.

The portal side runs with the start slots make run and the kit ship (provisioning/start_slots.py,
LAUNCH_STARTS_PER_CPU): in a burst, the engine brings up a few instances per CPU at once and the rest wait
their turn, while the plain side starts every container at once, as a script of `docker run`s would. So
each burst prints the median (what a typical person in the class waits) and the max (the last one
ready, which no ordering can make earlier than the cores allow), each as a ratio to plain's.

Single launches alternate portal / plain, REPEAT times each after one warm-up of both, every instance
stopped (and its teardown finished) before the next. Each burst (BURSTS: 10 and 30) fires that many
launches at once from as many threads (one user each), and as many plain runs at once, and reports each
one's own time; it runs BURST_ROUNDS times for each side, alternating which side goes first. Target:
the portal's median within 1.10 times plain's median, for each burst, and the moment each round's last
instance is ready, as the median over the rounds, within 1.10 times plain's. The slowest instance of all
rounds is printed beside it: one number from all the rounds, it moves most with the machine's noise.

JupyterLab's own start-up (from the container starting to its "Use Control-C to stop this server" log
line, timestamped by the engine) is most of either figure and varies with the machine's load. The bench
also prints each side's time outside it, which is what the launch path adds, and where the portal's
time goes, phase by phase.

Needs root (mknod for the stand-in device nodes) and the CPU image (`make bench` builds it first). A
burst of 30 needs 30 instance networks at once on the one engine: dockerd's default address pools hold
31 bridge networks in all, so an engine that other work also uses needs more (default-address-pools in
/etc/docker/daemon.json, e.g. base 10.200.0.0/16, size 24), or the burst's last launches fail for want
of an address, as they would in production. Each scenario is printed as soon as it has run.
"""

import logging
import os
import secrets
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from benchmarks import (
    LOCAL_ENGINE,
    bench_people,
    ensure_cpu_image,
    kit_env,
    layout_workers,
    scratch_database,
    start_kit_web,
)
from benchmarks import database_url as bench_database_url

DATABASE = "devcloud_bench_launch"
REPEAT = int(os.environ.get("BENCH_LAUNCH_REPEAT", "5"))
# Burst sizes, e.g. "10,30"; empty skips the bursts.
BURSTS = [int(size) for size in os.environ.get("BENCH_LAUNCH_BURSTS", "10,30").split(",") if size.strip()]
# Rounds per side and burst size. One round's launches share its luck (what else the machine did
# meanwhile): with two rounds the burst of 10 read 1.06x and 1.13x on the same code the same morning,
# so four, alternating, make the median worth quoting.
BURST_ROUNDS = int(os.environ.get("BENCH_LAUNCH_BURST_ROUNDS", "4"))
TARGET_RATIO = 1.10
GPUS_PER_HOST = 8
# How often the clocks look: every 10 ms for single launches; every 50 ms in a burst, where ten clocks
# at 10 ms would themselves load a small machine (on both sides alike).
POLL = 0.01
BURST_POLL = 0.05
TIMEOUT = 180
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "9"))
# The line JupyterLab logs once it serves (just before its event loop starts).
SERVING_LINE = "Use Control-C to stop this server"
# The production settings name the session cookie __Host-sessionid (portal/settings/deployed.py).
PRODUCTION_SESSION_COOKIE = "__Host-sessionid"

_poll = threading.local()


@dataclass
class Sample:
    """One launch: seconds to the first 200, seconds of JupyterLab's own start-up, and (portal) phases."""

    total: float
    boot: float
    phases: dict = field(default_factory=dict)

    @property
    def outside_boot(self) -> float:
        return self.total - self.boot


def _wait(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(getattr(_poll, "interval", POLL))
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def _answers(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def _wait_for_serving_line(container, timeout: float = TIMEOUT) -> None:
    """Blocks until the container prints SERVING_LINE, its output ends, or `timeout` seconds pass."""
    stream = container.logs(stdout=True, stderr=True, stream=True, follow=True)
    deadline = threading.Timer(timeout, stream.close)
    deadline.start()
    tail = b""
    try:
        for chunk in stream:
            seen = tail + chunk
            if SERVING_LINE.encode() in seen:
                return
            tail = seen[-len(SERVING_LINE) :]
    except Exception:  # noqa: BLE001  (closed at the deadline: the poll that follows reports it)
        return
    finally:
        deadline.cancel()
        stream.close()


def _docker_time(text: str) -> datetime:
    # "2026-11-29T15:28:09.123456789Z": nanoseconds, which fromisoformat does not take.
    whole, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00")


def _container_times(container) -> tuple[datetime, datetime]:
    """When the container started, and when JupyterLab in it logged that it serves (engine timestamps)."""
    container.reload()
    started = _docker_time(container.attrs["State"]["StartedAt"])
    for line in container.logs(timestamps=True).decode(errors="replace").splitlines():
        if SERVING_LINE in line:
            return started, _docker_time(line.split(" ", 1)[0])
    raise RuntimeError(f"{container.name} never logged {SERVING_LINE!r}")


@contextmanager
def _portal_server(database_url: str, log: Path):
    """The portal (Django and the gateway) as the deploy kit's web unit runs it (benchmarks.start_kit_web:
    its uvicorn command line, the production settings); yields its URL."""
    from tests.gateway.helpers import free_port

    port = free_port()
    process = start_kit_web(port, database_url, log)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client() as client:
            _wait(lambda: _answers(client, f"{url}/accounts/login/"), "the portal to answer", 60)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)


class StateWatcher:
    """Tells waiting clocks when their instance runs. One thread reads the state of every instance being
    waited for in one query per look, so the clocks' own reads weigh the same on the database for one
    launch as for a burst (the gateway refuses an instance until it runs, so asking it earlier is moot).
    """

    def __init__(self):
        self.interval = POLL
        self._waiting: dict = {}
        self._ended: dict = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-state-watcher", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stopped.set()
        self._thread.join(10)

    def wait_running(self, instance_id, timeout: float = TIMEOUT) -> None:
        """Returns once the instance runs. Raises RuntimeError if it ends (failed, stopped) or times out."""
        event = threading.Event()
        with self._lock:
            self._waiting[instance_id] = event
        if not event.wait(timeout):
            raise RuntimeError(f"timed out after {timeout} s waiting for instance {instance_id} to run")
        if instance_id in self._ended:
            raise RuntimeError(f"launch {instance_id} ended: {self._ended[instance_id]}")

    def _look(self) -> None:
        """Reads the states of the instances waited for, once; wakes the clocks of those that run or ended."""
        from portal.instances.models import Instance

        with self._lock:
            ids = list(self._waiting)
        if not ids:
            return
        rows = Instance.objects.filter(id__in=ids).values_list("id", "state", "failure_reason")
        for instance_id, state, reason in rows:
            if state in (Instance.State.FAILED, Instance.State.STOPPED):
                self._ended[instance_id] = f"{state}: {reason}"
            elif state != Instance.State.RUNNING:
                continue
            with self._lock:
                self._waiting.pop(instance_id).set()

    @contextmanager
    def _pauses(self):
        """Yields what to call between two looks: here, a sleep of `interval`."""
        yield lambda: time.sleep(self.interval)

    def _run(self):
        from django.db import connection

        try:
            with self._pauses() as pause:
                while not self._stopped.is_set():
                    self._look()
                    pause()
        finally:
            connection.close()


class Portal:
    """Launches as a user clicks them and times each to its first 200 through the gateway."""

    def __init__(self, url: str, watcher: StateWatcher):
        self.url = url
        self.watcher = watcher

    def session_for(self, user) -> str:
        from django.conf import settings
        from django.test import Client

        browser = Client()
        browser.force_login(user)
        return browser.cookies[settings.SESSION_COOKIE_NAME].value

    def launch_and_time(self, user, session_key: str) -> tuple[Sample, object]:
        """Launches for `user` and returns its Sample and the instance id."""
        from django.db import close_old_connections

        from portal.instances import services

        # Made before the clock starts: building a client (its TLS context) takes tens of milliseconds,
        # which a browser that already shows the portal has long paid.
        browser = httpx.Client(cookies={PRODUCTION_SESSION_COOKIE: session_key}, timeout=5)
        try:
            clicked = _now()
            started = time.perf_counter()
            instance = services.instance_launch(user=user, size="1x", image_key="cpu")
            self.watcher.wait_running(instance.id)
            seen = time.perf_counter()
            url = f"{self.url}/instances/{instance.id}/lab/api/status"
            asked = [0.0]

            def gateway_answers():
                asked[0] = time.perf_counter()
                return _answers(browser, url)

            _wait(gateway_answers, f"the gateway to answer for {instance.short_id}")
            answered = time.perf_counter()

            def at(moment: float) -> datetime:
                return clicked + timedelta(seconds=moment - started)

            return self._sample(instance.id, clicked, at(seen), at(asked[0]), at(answered)), instance.id
        finally:
            browser.close()
            close_old_connections()

    @staticmethod
    def _sample(instance_id, clicked, seen, asked, answered) -> Sample:
        """Where one launch's time went, from its timeline (InstanceEvent rows) and the engine."""
        from portal.instances.models import Instance
        from tests.support.docker_instances import docker_client

        instance = Instance.objects.get(pk=instance_id)
        # The first event of each step: a launch waiting its turn adds more under "starting".
        steps: dict = {}
        for event in instance.events.order_by("created_at", "id"):
            steps.setdefault(event.step, event.created_at)
        container = docker_client().containers.get(instance.driver_state["container_name"])
        container_started, serving = _container_times(container)
        marks = [
            ("click -> worker claims it", clicked, instance.provisioning_at),
            ("claim -> start step", instance.provisioning_at, steps["starting"]),
            ("start step -> container started", steps["starting"], container_started),
            ("container started -> JupyterLab serves", container_started, serving),
            ("JupyterLab serves -> marked ready", serving, instance.ready_at),
            ("ready -> the clock sees it running", instance.ready_at, seen),
            ("-> gateway asked", seen, asked),
            ("gateway request that got 200", asked, answered),
        ]
        phases = {label: (end - begin).total_seconds() for label, begin, end in marks}
        return Sample(
            total=(answered - clicked).total_seconds(),
            boot=(serving - container_started).total_seconds(),
            phases=phases,
        )

    def stop(self, user, instance_id) -> None:
        from portal.instances import services
        from portal.instances.models import Instance

        services.instance_stop(user=user, instance_id=instance_id)
        _wait(
            lambda: Instance.objects.filter(pk=instance_id, state=Instance.State.STOPPED).exists(),
            "the teardown",
        )


class Plain:
    """One hardened instance by hand: its own network and workspace volume, then `docker run` of the same
    image with the portal container's hardening, timed to its first 200 from /api/status."""

    def __init__(self, reference: str, label: str):
        self.reference = reference
        self.label = label
        self.hardening: list[str] = []
        self.environment: dict[str, str] = {}
        self.publish_ip = "127.0.0.1"
        self._count = 0
        self._lock = threading.Lock()

    def copy_hardening(self, container) -> None:
        """Takes the run options from one of the portal's containers (docker inspect), so both sides run
        the same user, limits, devices and environment, whatever the driver sets today."""
        container.reload()
        config, host = container.attrs["Config"], container.attrs["HostConfig"]
        image_env = set(container.image.attrs["Config"].get("Env") or [])
        options = ["--user", config["User"]] if config.get("User") else []
        options += [arg for cap in host.get("CapDrop") or [] for arg in ("--cap-drop", cap)]
        options += [arg for cap in host.get("CapAdd") or [] for arg in ("--cap-add", cap)]
        options += [arg for opt in host.get("SecurityOpt") or [] for arg in ("--security-opt", opt)]
        if host.get("Memory"):
            options += ["--memory", str(host["Memory"]), "--memory-swap", str(host.get("MemorySwap") or -1)]
        if host.get("NanoCpus"):
            options += ["--cpus", f"{host['NanoCpus'] / 1e9:g}"]
        if host.get("PidsLimit"):
            options += ["--pids-limit", str(host["PidsLimit"])]
        if host.get("ShmSize"):
            options += ["--shm-size", str(host["ShmSize"])]
        if host.get("IpcMode"):
            options += ["--ipc", host["IpcMode"]]
        for device in host.get("Devices") or []:
            spec = f"{device['PathOnHost']}:{device['PathInContainer']}:{device['CgroupPermissions']}"
            options += ["--device", spec]
        options += [arg for group in host.get("GroupAdd") or [] for arg in ("--group-add", group)]
        log = host.get("LogConfig") or {}
        if log.get("Type"):
            options += ["--log-driver", log["Type"]]
            for key, value in (log.get("Config") or {}).items():
                options += ["--log-opt", f"{key}={value}"]
        options += ["--restart", "no"]
        self.hardening = options
        self.environment = dict(
            entry.split("=", 1)
            for entry in config.get("Env") or []
            if entry not in image_env and "=" in entry
        )
        bindings = host.get("PortBindings") or {}
        for binding in bindings.values():
            if binding and binding[0].get("HostIp"):
                self.publish_ip = binding[0]["HostIp"]
        self.ports = sorted(bindings)

    def run_and_time(self) -> Sample:
        from tests.support.docker_instances import docker_client

        with self._lock:
            self._count += 1
            number = self._count
        token, instance_id = secrets.token_hex(24), uuid.uuid4()
        base = f"/instances/{instance_id}/lab/"
        environment = {
            **self.environment,
            "JUPYTER_TOKEN": token,
            "JUPYTER_BASE_URL": base,
            "DEVCLOUD_INSTANCE_ID": str(instance_id),
        }
        name = f"{self.label.split('=')[-1]}-{number}"
        client = httpx.Client(headers={"Authorization": f"token {token}"}, timeout=5)
        clicked = _now()
        started = time.perf_counter()
        subprocess.run(
            ["docker", "network", "create", "--driver", "bridge", "--label", self.label,
             "-o", f"com.docker.network.bridge.name=dp-{instance_id.hex[:12]}", f"{name}-net"],
            check=True, capture_output=True, text=True,
        )
        subprocess.run(
            ["docker", "volume", "create", "--label", self.label, f"{name}-workspace"],
            check=True, capture_output=True, text=True,
        )
        command = ["docker", "run", "-d", "--name", name, "--label", self.label, "--network", f"{name}-net"]
        command += ["--hostname", f"plain-{number}", *self.hardening]
        command += ["--mount", f"type=volume,source={name}-workspace,target=/workspace"]
        for key, value in environment.items():
            command += ["-e", f"{key}={value}"]
        # Ports the engine picks, as the driver's are: ports picked here could collide within a burst.
        for container_port in self.ports or ["8888/tcp"]:
            command += ["-p", f"{self.publish_ip}::{container_port.split('/')[0]}"]
        run = subprocess.run([*command, self.reference], capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"docker run failed: {run.stderr.strip()}")
        published = subprocess.run(
            ["docker", "port", run.stdout.strip(), "8888/tcp"], check=True, capture_output=True, text=True
        ).stdout.split()[0]
        url = f"http://{published}{base}api/status"
        # The clock waits as the portal's readiness wait does (portal/instances/lifecycle.py): on the
        # container's output until JupyterLab says it serves, then asking /api/status. Asking from the
        # start 20 times a second would spend on the clock the CPU a burst's start-ups need, and
        # handicap this side.
        _wait_for_serving_line(docker_client().containers.get(run.stdout.strip()))
        with client:
            _wait(lambda: _answers(client, url), "plain docker run to answer")
        total = time.perf_counter() - started
        container_started, serving = _container_times(docker_client().containers.get(run.stdout.strip()))
        return Sample(
            total=total,
            boot=(serving - container_started).total_seconds(),
            phases={
                "network, volume, run -> container started": (container_started - clicked).total_seconds(),
                "JupyterLab serves -> the clock's 200": (
                    clicked + timedelta(seconds=total) - serving
                ).total_seconds(),
            },
        )

    def remove_all(self) -> None:
        def listed(*command):
            return subprocess.run(
                [*command, "--filter", f"label={self.label}"], capture_output=True, text=True, check=False
            ).stdout.split()

        containers = listed("docker", "ps", "-aq")
        if containers:
            subprocess.run(["docker", "rm", "-f", *containers], capture_output=True, check=False)
        networks = listed("docker", "network", "ls", "-q")
        if networks:
            subprocess.run(["docker", "network", "rm", *networks], capture_output=True, check=False)
        volumes = listed("docker", "volume", "ls", "-q")
        if volumes:
            subprocess.run(["docker", "volume", "rm", *volumes], capture_output=True, check=False)


def _burst(count: int, work) -> list:
    """Runs work(i) in `count` threads released together; returns their results in order."""
    results: list = [None] * count
    gate = threading.Barrier(count)

    def run(index):
        _poll.interval = BURST_POLL
        gate.wait()
        try:
            results[index] = work(index)
        except Exception as error:  # noqa: BLE001  (reported below, once every thread ended)
            results[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise RuntimeError(f"{len(errors)} of the burst failed: {errors[0]}")
    return results


def _median(values) -> float:
    return statistics.median(list(values))


def _round_lasts(samples: list[Sample], size: int) -> list[float]:
    """When each round's last instance was ready: the samples hold the rounds one after another."""
    return [max(s.total for s in samples[start : start + size]) for start in range(0, len(samples), size)]


def _report(
    label: str, portal: list[Sample], plain: list[Sample], target: float | None = None, size: int = 0
) -> dict:
    """Prints one scenario's comparison (and whether it meets `target`, a ratio); returns its figures.
    `size`, for a burst, is how many launches each round fired: the last of each round is then compared
    too, as the median over the rounds."""
    figures = {
        "portal_median_s": _median(s.total for s in portal),
        "portal_max_s": max(s.total for s in portal),
        "plain_median_s": _median(s.total for s in plain),
        "plain_max_s": max(s.total for s in plain),
        "portal_outside_boot_median_s": _median(s.outside_boot for s in portal),
        "plain_outside_boot_median_s": _median(s.outside_boot for s in plain),
    }
    figures["over_s"] = figures["portal_median_s"] - figures["plain_median_s"]
    figures["ratio"] = figures["portal_median_s"] / figures["plain_median_s"]
    figures["max_ratio"] = figures["portal_max_s"] / figures["plain_max_s"]
    if size:
        figures["portal_last_median_s"] = _median(_round_lasts(portal, size))
        figures["plain_last_median_s"] = _median(_round_lasts(plain, size))
        figures["last_ratio"] = figures["portal_last_median_s"] / figures["plain_last_median_s"]
    figures["outside_boot_over_s"] = (
        figures["portal_outside_boot_median_s"] - figures["plain_outside_boot_median_s"]
    )
    print(f"{label} (n = {len(portal)} each)")
    for side in ("portal", "plain"):
        name = "portal (through the gateway)" if side == "portal" else "plain docker run"
        print(
            f"  {name:<30} median {figures[f'{side}_median_s']:6.3f} s"
            f"   max {figures[f'{side}_max_s']:6.3f} s"
            f"   outside JupyterLab's start-up {figures[f'{side}_outside_boot_median_s']:6.3f} s (median)"
        )
    print(
        f"  portal - plain: {figures['over_s']:+.3f} s median, "
        f"{figures['portal_max_s'] - figures['plain_max_s']:+.3f} s max; "
        f"ratio {figures['ratio']:.3f} median, {figures['max_ratio']:.3f} max; "
        f"outside JupyterLab's start-up {figures['outside_boot_over_s']:+.3f} s"
    )
    if target is not None:
        verdict = "meets" if figures["ratio"] <= target else "MISSES"
        print(f"  target: portal median within {target:.2f}x plain's: {verdict} ({figures['ratio']:.3f}x)")
    if target is not None and size:
        rounds = len(portal) // size
        verdict = "meets" if figures["last_ratio"] <= target else "MISSES"
        print(
            f"  and each round's last one ready (median of {rounds} rounds: portal "
            f"{figures['portal_last_median_s']:.3f} s, plain {figures['plain_last_median_s']:.3f} s) "
            f"within {target:.2f}x plain's: {verdict} ({figures['last_ratio']:.3f}x; the slowest of all "
            f"rounds: {figures['max_ratio']:.3f}x)"
        )
    print("  where the time goes (median of each phase):")
    for sample_set, side in ((portal, "portal"), (plain, "plain")):
        for phase in sample_set[0].phases:
            print(f"    {side:<6} {phase:<40} {_median(s.phases[phase] for s in sample_set):6.3f} s")
        print(f"    {side:<6} {'(JupyterLab start-up)':<40} {_median(s.boot for s in sample_set):6.3f} s")
    return {key: round(value, 3) for key, value in figures.items()}


def main() -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if os.geteuid() != 0:
        print("skipped: the stand-in GPU device nodes need root (mknod)")
        return {}
    from django.db import connection
    from django.test import override_settings

    from portal.instances.catalog import catalog_sync
    from provisioning.models import GpuHost
    from tests.e2e.helpers import register_host, stand_in_dev_root
    from tests.support.docker_instances import docker_client, remove_portal_objects
    from tests.support.worker import celery_publishing_to, redis_url, unique_queue

    reference = ensure_cpu_image()
    portal_id = f"bench-launch-{uuid.uuid4().hex[:8]}"
    plain = Plain(reference, f"devcloud.bench={portal_id}")
    default_queue, launch_queue = unique_queue("bench-default"), unique_queue("bench-launch")
    broker = redis_url(REDIS_DB)
    largest = max(BURSTS, default=1)

    with (
        scratch_database(DATABASE),
        tempfile.TemporaryDirectory(prefix="bench-launch-") as scratch,
        override_settings(
            DEVCLOUD_PORTAL_ID=portal_id,
            DEVCLOUD_DRIVER="docker",
            CELERY_TASK_ALWAYS_EAGER=False,
            CELERY_TASK_DEFAULT_QUEUE=default_queue,
            CELERY_PROVISIONING_QUEUE=launch_queue,
        ),
    ):
        scratch = Path(scratch)
        dev_root = stand_in_dev_root(scratch / "host-dev")
        engine_cpus = docker_client().info()["NCPU"]
        for number in range(-(-largest // GPUS_PER_HOST)):
            host = register_host(f"gpu-bench-{number + 1:02d}", dev_root.path)
            # Every CPU of the engine, as plain `docker run` gets: the comparison is of the launch path,
            # not of the CPU share an operator gives each GPU (one CPU each by default).
            GpuHost.objects.filter(pk=host.pk).update(cpus_per_gpu=engine_cpus)
        catalog_sync()
        users = bench_people(largest)
        database_url = bench_database_url(connection.settings_dict)
        # What the deploy kit's environment file gives the workers, pointed at this run's database, Redis
        # and queues.
        worker_env = kit_env(
            database_url=database_url,
            broker=broker,
            default_queue=default_queue,
            launch_queue=launch_queue,
            portal_id=portal_id,
            **LOCAL_ENGINE,
            READY_TIMEOUT_SECONDS="170",
        )
        singles, single_plains = [], []
        figures: dict = {}
        failures: list[str] = []
        try:
            with (
                _portal_server(database_url, scratch / "portal.log") as portal_url,
                layout_workers(worker_env, scratch),
                celery_publishing_to(broker_url=broker, queue=default_queue),
                StateWatcher() as watcher,
            ):
                portal = Portal(portal_url, watcher)
                sessions = [portal.session_for(user) for user in users]

                # Warm-up (image layers in the page cache, the workspace volume made, connections open);
                # the plain side copies the warm-up container's hardening.
                _, warm = portal.launch_and_time(users[0], sessions[0])
                from portal.instances.models import Instance

                warm_container = Instance.objects.get(pk=warm).driver_state["container_name"]
                plain.copy_hardening(docker_client().containers.get(warm_container))
                portal.stop(users[0], warm)
                plain.run_and_time()
                plain.remove_all()
                print(f"plain docker run options (from the portal's container): {' '.join(plain.hardening)}")

                for _ in range(REPEAT):
                    sample, instance_id = portal.launch_and_time(users[0], sessions[0])
                    singles.append(sample)
                    portal.stop(users[0], instance_id)
                    single_plains.append(plain.run_and_time())
                    plain.remove_all()

                print(f"Launch to JupyterLab /api/status, CPU image {reference}", flush=True)
                figures.update(
                    {f"single_{key}": value for key, value in _report("1 launch", singles, single_plains).items()}
                )
                watcher.interval = BURST_POLL
                for size in BURSTS:
                    portal_samples, plain_samples = [], []

                    def portal_burst(size=size, portal_samples=portal_samples):
                        launched = _burst(size, lambda i: portal.launch_and_time(users[i], sessions[i]))
                        portal_samples.extend(sample for sample, _ in launched)
                        for user, (_, instance_id) in zip(users, launched):
                            portal.stop(user, instance_id)

                    def plain_burst(size=size, plain_samples=plain_samples):
                        try:
                            plain_samples.extend(_burst(size, lambda i: plain.run_and_time()))
                        finally:
                            plain.remove_all()

                    try:
                        # Alternating which side goes first, so a machine that gets busier or quieter
                        # during the run favours neither.
                        for number in range(BURST_ROUNDS):
                            for run in (portal_burst, plain_burst)[:: 1 if number % 2 == 0 else -1]:
                                run()
                    except RuntimeError as error:
                        # Reported, and the bench fails at the end; the other burst sizes still run.
                        failures.append(f"burst of {size}: {error}")
                        print(f"burst of {size} FAILED: {error}", flush=True)
                        _stop_all(portal, users)
                        continue
                    burst = _report(
                        f"burst of {size}, per instance", portal_samples, plain_samples, TARGET_RATIO, size
                    )
                    figures.update({f"burst{size}_{key}": value for key, value in burst.items()})
        finally:
            plain.remove_all()
            remove_portal_objects(portal_id)

    if failures:
        raise RuntimeError("; ".join(failures))
    figures["target_ratio"] = TARGET_RATIO
    return figures


def _stop_all(portal, users) -> None:
    """Stops whatever the users still run after a failed burst, so the next burst starts clean."""
    from portal.instances.models import Instance

    for user in users:
        for instance_id in Instance.objects.filter(user=user, state__in=Instance.LIVE_STATES).values_list(
            "id", flat=True
        ):
            try:
                portal.stop(user, instance_id)
            except Exception as error:  # noqa: BLE001 - best effort; reported
                print(f"could not stop {instance_id}: {error}")


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
