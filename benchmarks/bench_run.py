"""`devcloud run` against the steps it replaces: from starting the command to the first line the remote
command prints, next to `devcloud launch --wait` followed by `devcloud ssh`, measured in the same run.

- run: `devcloud run --size 1x --image cpu -- echo first-line` as a subprocess; the clock runs from
  starting it to the first line of its stdout (`first-line`, printed in the instance and carried back
  through the SSH gateway), and on to its exit, which includes its stop request.
- baseline: what a person or a CI script did before `run` existed: `devcloud launch --size 1x --image
  cpu --wait --json`, then `devcloud ssh <short id> -- echo first-line` with the short id the launch
  printed; the clock runs from starting the launch to the ssh's first line of stdout. Then `devcloud
  stop <short id>`; the time to its exit is printed beside run's, for the whole job.

Both sides share the launch and the wait for the instance to run, which are most of either figure (a
container starting and JupyterLab coming up; benchmarks/bench_launch.py times those): what the ratio
shows is whether `run`'s single step costs anything over the manual steps (after the wait, `run` goes
straight to ssh, where the baseline starts a second CLI process that looks the short id up again before
it execs the same ssh through the same gateway). Both wait by polling the instance every POLL_SECONDS
(2 s, portal/cli/main.py), so each sample's wait ends anywhere up to 2 s after the portal marks the
instance ready: that quantisation, not either side's own work, dominates the difference between
individual samples, so every sample is printed with the moment the instance was ready and the time from
there to its first line.

Everything is the configuration that ships: a scratch PostgreSQL database, Redis, the real Celery workers
(the layout of portal/workers.py, benchmarks.layout_workers), the portal with the deploy kit's web
command line and production settings (benchmarks.start_kit_web), the real SSH gateway process
(`manage.py ssh_gateway`, production settings, on a loopback port the portal's SSH_GATEWAY_HOST and
SSH_GATEWAY_PORT name), and a simulated 8x MI300X host (the KFD fixture sysfs and stand-in device nodes)
on the local Docker engine, launching the built CPU image (with DEVCLOUD_DISK_LIMITS=warn: this machine's
engine keeps its data on ext4, which cannot enforce the kit's disk limits). The CLI runs as a CI job runs
it: `python -m portal.cli` in a fresh process with no TTY, DEVCLOUD_URL and DEVCLOUD_TOKEN (a
launch-scope API token) in its environment, its own XDG_CONFIG_HOME and an empty HOME. OpenSSH reads the
passwd entry's home, not HOME, so the account's key (made by ssh-keygen) reaches the CLI's ssh through an
`ssh` first on PATH that adds -F with a config naming it, as tests/cli/test_cli_run_real.py does.

After one warm-up of each, the two alternate, REPEAT times each (BENCH_RUN_REPEAT, default 5); each
instance's teardown finishes before the next launch. Prints the median, min and max of each side and the
ratio run / baseline of the medians. Needs root (mknod for the stand-in device nodes) and the CPU image
(built first when missing). Everything the bench made under its portal id is removed at the end.
"""

import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
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

DATABASE = "devcloud_bench_run"
REPEAT = int(os.environ.get("BENCH_RUN_REPEAT", "5"))
REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "9"))
REPO = Path(__file__).resolve().parent.parent
FIRST_LINE = "first-line"
IMAGE_KEY = "cpu"
# Longest a sample may take (a launch, the wait and the command) before the bench gives up on it.
TIMEOUT = 300


@dataclass
class Sample:
    """Seconds from starting the first command to the remote command's first line, and to the last
    command's exit; `ready` is when the portal marked the instance ready, on the same clock."""

    first_line: float
    exit: float
    ready: float

    @property
    def after_ready(self) -> float:
        return self.first_line - self.ready


def _wait_for(predicate, what: str, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _listens(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _end(process: subprocess.Popen, timeout: float = 15) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextmanager
def _portal_server(port: int, database_url: str, log: Path, env: dict):
    """The portal as the deploy kit's web unit runs it, with `env` added; yields its URL."""
    process = start_kit_web(port, database_url, log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _answers(f"{url}/accounts/login/") or process.poll() is not None, "the portal", 60)
        if process.poll() is not None:
            raise RuntimeError(f"the portal exited: {log.read_text(errors='replace')[-2000:]}")
        yield url
    finally:
        _end(process)


@contextmanager
def _ssh_gateway(port: int, env: dict, scratch: Path):
    """`manage.py ssh_gateway` (what the kit's devcloud-sshgateway unit runs) on 127.0.0.1:`port` with a
    host key it makes in `scratch`; yields once it listens."""
    log = scratch / "ssh-gateway.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "ssh_gateway", "--bind", "127.0.0.1", "--port", str(port),
             "--host-key", env["SSH_GATEWAY_HOST_KEY"]],
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(lambda: _listens(port) or process.poll() is not None, "the SSH gateway", 30)
        if process.poll() is not None:
            raise RuntimeError(f"the SSH gateway exited: {log.read_text(errors='replace')[-2000:]}")
        yield
    finally:
        _end(process)


class Cli:
    """`python -m portal.cli` as a CI job runs it: no TTY, the portal's URL and token in the environment,
    its own XDG_CONFIG_HOME and an empty HOME, and an `ssh` first on PATH that gives OpenSSH the
    account's key through -F (mirrors tests/cli/test_cli_run_real.py's Job)."""

    def __init__(self, root: Path, url: str, token: str, private_key: Path):
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        config = root / "ssh_config"
        config.write_text(
            f"Host *\n  IdentityFile {private_key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {config} "$@"\n')
        wrapper.chmod(0o755)
        self.env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(root / "config"),
            "DEVCLOUD_URL": url,
            "DEVCLOUD_TOKEN": token,
            "PYTHONPATH": str(REPO),
        }
        self._stderr_count = 0

    def start(self, *args: str) -> tuple[subprocess.Popen, Path]:
        """Starts the CLI with stdout piped (text); returns the process and the file its stderr goes to."""
        self._stderr_count += 1
        stderr_path = self.root / f"stderr-{self._stderr_count:03d}-{args[0]}.txt"
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "portal.cli", *args],
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        return process, stderr_path

    def run(self, *args: str) -> str:
        """Runs the CLI to its end; returns its stdout. Raises RuntimeError when it fails."""
        process, stderr_path = self.start(*args)
        try:
            out, _ = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise RuntimeError(
                f"devcloud {args[0]} took over {TIMEOUT} s: {stderr_path.read_text()}"
            ) from None
        if process.returncode != 0:
            raise RuntimeError(f"devcloud {args[0]} exited {process.returncode}: {stderr_path.read_text()}")
        return out


def _first_line(process: subprocess.Popen, stderr_path: Path) -> None:
    """Returns once `process` prints FIRST_LINE on stdout. Raises RuntimeError when it prints something
    else first, ends first, or TIMEOUT passes (the process is then killed)."""
    guard = threading.Timer(TIMEOUT, process.kill)
    guard.start()
    try:
        line = process.stdout.readline()
    finally:
        guard.cancel()
    if line.strip() != FIRST_LINE:
        process.kill()
        process.wait()
        raise RuntimeError(
            f"expected {FIRST_LINE!r} first, got {line!r} (exit {process.returncode}): {stderr_path.read_text()}"
        )


def _finish(process: subprocess.Popen, stderr_path: Path) -> None:
    """Waits for `process` to exit 0, reading the rest of its stdout. Raises RuntimeError otherwise."""
    try:
        process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{process.args[3]} exited {process.returncode}: {stderr_path.read_text()}")


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def _ready_after(instance, started_at: datetime) -> float:
    """Seconds from `started_at` to the moment the portal marked `instance` ready."""
    instance.refresh_from_db()
    if instance.ready_at is None:
        raise RuntimeError(f"instance {instance.short_id} was never ready ({instance.state})")
    return (instance.ready_at - started_at).total_seconds()


def time_run(cli: Cli, user) -> Sample:
    """One `devcloud run`, timed to its first line and to its exit."""
    from portal.instances.models import Instance

    started_at, started = _now(), time.perf_counter()
    process, stderr_path = cli.start("run", "--size", "1x", "--image", IMAGE_KEY, "--", "echo", FIRST_LINE)
    _first_line(process, stderr_path)
    first_line = time.perf_counter() - started
    _finish(process, stderr_path)
    exited = time.perf_counter() - started
    instance = Instance.objects.filter(user=user, created_at__gte=started_at).latest("created_at")
    return Sample(first_line=first_line, exit=exited, ready=_ready_after(instance, started_at))


def time_baseline(cli: Cli) -> Sample:
    """`devcloud launch --wait --json`, `devcloud ssh <short id> -- echo first-line`, `devcloud stop`,
    timed from starting the launch to the ssh's first line and to the stop's exit."""
    from portal.instances.models import Instance

    started_at, started = _now(), time.perf_counter()
    launched = json.loads(cli.run("launch", "--size", "1x", "--image", IMAGE_KEY, "--wait", "--json"))
    process, stderr_path = cli.start("ssh", launched["short_id"], "--", "echo", FIRST_LINE)
    _first_line(process, stderr_path)
    first_line = time.perf_counter() - started
    _finish(process, stderr_path)
    cli.run("stop", launched["short_id"])
    exited = time.perf_counter() - started
    instance = Instance.objects.get(pk=launched["id"])
    return Sample(first_line=first_line, exit=exited, ready=_ready_after(instance, started_at))


def _wait_torn_down(user) -> None:
    """Returns once none of the user's instances is live (the last one's teardown has finished)."""
    from portal.instances.models import Instance

    _wait_for(
        lambda: not Instance.objects.filter(user=user, state__in=Instance.LIVE_STATES).exists(),
        "the teardown",
        TIMEOUT,
    )


def _stop_all(cli: Cli, user) -> None:
    """Stops, through the portal, whatever the user still runs (after a failed sample); best effort."""
    from portal.instances.models import Instance

    for instance in Instance.objects.filter(user=user, state__in=Instance.LIVE_STATES):
        try:
            cli.run("stop", instance.short_id)
        except RuntimeError as error:
            print(f"could not stop {instance.short_id}: {error}")
    try:
        _wait_torn_down(user)
    except RuntimeError as error:
        print(f"cleanup: {error}")


def _print_sample(side: str, label: str, sample: Sample) -> None:
    print(
        f"  {side:<8} {label:<7} first line {sample.first_line:6.2f} s"
        f"  (ready at {sample.ready:6.2f} s, then {sample.after_ready:5.2f} s)   exit {sample.exit:6.2f} s",
        flush=True,
    )


MEASURES = {"first_line": "to the first line", "exit": "to exit", "after_ready": "ready -> first line"}
SIDES = {"run": "devcloud run", "baseline": "launch --wait + ssh (+ stop)"}


def _report(runs: list[Sample], baselines: list[Sample]) -> dict:
    """Prints each side's median, min and max of every measure and the ratios of the medians; returns
    the figures the runner's summary shows."""
    spread = {}
    for side, samples in (("run", runs), ("baseline", baselines)):
        for measure in MEASURES:
            values = [getattr(sample, measure) for sample in samples]
            spread[side, measure] = (statistics.median(values), min(values), max(values))
    print(f"medians (min - max), n = {len(runs)} each:")
    print((f"  {'':<30}" + "".join(f"{label:<26}" for label in MEASURES.values())).rstrip())
    for side, name in SIDES.items():
        cells = (f"{spread[side, measure][0]:6.2f} s ({spread[side, measure][1]:.2f} - "
                 f"{spread[side, measure][2]:.2f})" for measure in MEASURES)  # fmt: skip
        print((f"  {name:<30}" + "".join(f"{cell:<26}" for cell in cells)).rstrip())
    figures = {}
    for side in SIDES:
        median, low, high = spread[side, "first_line"]
        figures |= {f"{side}_first_line_median_s": median, f"{side}_first_line_min_s": low}
        figures |= {f"{side}_first_line_max_s": high, f"{side}_exit_median_s": spread[side, "exit"][0]}
        figures[f"{side}_after_ready_median_s"] = spread[side, "after_ready"][0]
    figures["ratio"] = figures["run_first_line_median_s"] / figures["baseline_first_line_median_s"]
    figures["exit_ratio"] = figures["run_exit_median_s"] / figures["baseline_exit_median_s"]
    print(
        f"  run / baseline of the medians: to the first line {figures['ratio']:.3f} "
        f"({figures['run_first_line_median_s'] - figures['baseline_first_line_median_s']:+.2f} s), "
        f"to exit {figures['exit_ratio']:.3f} "
        f"({figures['run_exit_median_s'] - figures['baseline_exit_median_s']:+.2f} s)"
    )
    return {key: round(value, 3) for key, value in figures.items()}


def main() -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if os.geteuid() != 0:
        print("skipped: the stand-in GPU device nodes need root (mknod)")
        return {}
    from django.db import connection
    from django.test import override_settings

    from portal.accounts import services as accounts
    from portal.api import services as api
    from portal.instances.catalog import catalog_sync
    from tests.e2e.helpers import register_host, stand_in_dev_root
    from tests.gateway.helpers import free_port
    from tests.support.docker_instances import remove_portal_objects
    from tests.support.worker import redis_url, unique_queue

    reference = ensure_cpu_image()
    portal_id = f"bench-run-{uuid.uuid4().hex[:8]}"
    default_queue, launch_queue = unique_queue("bench-run-default"), unique_queue("bench-run-launch")
    broker = redis_url(REDIS_DB)
    web_port, gateway_port = free_port(), free_port()

    with (
        scratch_database(DATABASE),
        tempfile.TemporaryDirectory(prefix="bench-run-") as scratch,
        # The workers' command lines name their queues from these (portal.workers.command).
        override_settings(
            DEVCLOUD_PORTAL_ID=portal_id,
            DEVCLOUD_DRIVER="docker",
            CELERY_TASK_DEFAULT_QUEUE=default_queue,
            CELERY_PROVISIONING_QUEUE=launch_queue,
        ),
    ):
        scratch = Path(scratch)
        register_host("gpu-bench-01", stand_in_dev_root(scratch / "host-dev").path)
        catalog_sync()
        user = bench_people(1)[0]
        private_key = scratch / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", str(private_key)], check=True
        )
        accounts.sshkey_add(user=user, name="bench", public_key=private_key.with_suffix(".pub").read_text())
        token = api.token_create(user=user, name="bench", scope="launch", days=1)[1]

        # What the deploy kit's environment file gives every unit, pointed at this run's database, Redis,
        # queues and SSH gateway.
        env = kit_env(
            database_url=bench_database_url(connection.settings_dict),
            broker=broker,
            default_queue=default_queue,
            launch_queue=launch_queue,
            portal_id=portal_id,
            **LOCAL_ENGINE,
            SSH_GATEWAY_HOST="127.0.0.1",
            SSH_GATEWAY_PORT=str(gateway_port),
            # Where the gateway writes its host key and the web reads it, to publish it to the CLI.
            SSH_GATEWAY_HOST_KEY=str(scratch / "gateway_host_key"),
        )
        runs: list[Sample] = []
        baselines: list[Sample] = []
        try:
            with (
                layout_workers(env, scratch),
                _ssh_gateway(gateway_port, env, scratch),
                _portal_server(web_port, env["DATABASE_URL"], scratch / "portal.log", env) as url,
            ):
                cli = Cli(scratch / "cli", url, token, private_key)
                try:
                    print(f"devcloud run vs launch --wait + ssh, CPU image {reference}", flush=True)
                    # Warm-up: image layers in the page cache, the workspace volume made, the CLI's
                    # imports in the page cache.
                    sides = (("run", lambda: time_run(cli, user)), ("baseline", lambda: time_baseline(cli)))
                    for side, measure in sides:
                        sample = measure()
                        _wait_torn_down(user)
                        _print_sample(side, "warm-up", sample)
                    for number in range(1, REPEAT + 1):
                        for (side, measure), samples in zip(sides, (runs, baselines), strict=True):
                            sample = measure()
                            samples.append(sample)
                            _wait_torn_down(user)
                            _print_sample(side, f"#{number}", sample)
                finally:
                    _stop_all(cli, user)
        finally:
            remove_portal_objects(portal_id)

    figures = _report(runs, baselines)
    figures["repeat"] = REPEAT
    return figures


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
