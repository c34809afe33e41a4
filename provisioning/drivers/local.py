"""Instances as JupyterLab processes on the worker's own machine, for `make run` without Docker.

It runs the same entrypoint as the images (containers/entrypoint/start-jupyter.sh) with the portal's own
virtualenv, on a free loopback port, with the user's workspace under <root>/workspaces/<user id>/.
There is no isolation of any kind: every instance sees every GPU, the machine's files and each other.
The portal says so (isolates_gpus = False); use the docker driver for anything shared.

Each instance has a run directory <root>/local-instances/<uuid>/ holding state.json ({pid, port, ...},
written before start returns, so a retry after a crash finds the process instead of starting another),
JupyterLab's log, and its config and runtime directories (kept apart from the user's ~/.jupyter, whose
settings could otherwise change how JupyterLab authenticates).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings

from .base import Driver, DriverError, InstanceRef, PollResult, StartResult, StartSpec, hide_token

ENTRYPOINT = Path(settings.BASE_DIR) / "containers" / "entrypoint" / "start-jupyter.sh"
# Seconds JupyterLab gets to shut its kernels down on SIGTERM before everything left is killed.
STOP_GRACE_SECONDS = 5


def local_root() -> Path:
    # Where workspaces and run directories live; a temporary directory in tests.
    return Path(getattr(settings, "DEVCLOUD_LOCAL_ROOT", Path(settings.BASE_DIR) / "var"))


class LocalDriver(Driver):
    """Runs each instance as a JupyterLab subprocess. See base.Driver for the contract of each method."""

    name = "local"
    isolates_gpus = False

    def run_dir(self, instance_id) -> Path:
        return local_root() / "local-instances" / str(instance_id)

    def workspace(self, owner_id) -> Path:
        return local_root() / "workspaces" / str(owner_id)

    def start(self, spec: StartSpec, progress=None, turn=None) -> StartResult:
        """Starts JupyterLab for the instance and returns its endpoint and state ({pid, port, ...}).

        Idempotent: when the recorded process is still alive it is reused. Raises
        DriverError(permanent=True) when JupyterLab is not installed in the portal's environment.
        """
        state = self._recorded_state(spec.instance_id)
        if state and _alive(state):
            return StartResult(endpoint=f"http://127.0.0.1:{state['port']}", state=state)

        jupyter = Path(sys.executable).parent / "jupyter"
        if not jupyter.exists():
            raise DriverError(
                f"JupyterLab is not installed in the portal's environment ({jupyter} is missing); "
                "run `pip install jupyterlab` in the portal's virtualenv.",
                permanent=True,
            )
        run_dir = self.run_dir(spec.instance_id)
        workspace = self.workspace(spec.owner_id)
        for directory in (run_dir / "config", run_dir / "runtime", workspace):
            directory.mkdir(parents=True, exist_ok=True)
        port = _free_loopback_port()
        env = {
            **os.environ,
            "PATH": f"{jupyter.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "JUPYTER_TOKEN": spec.jupyter_token,
            "JUPYTER_BASE_URL": spec.lab_base_path,
            "JUPYTER_IP": "127.0.0.1",
            "JUPYTER_PORT": str(port),
            "JUPYTER_ROOT_DIR": str(workspace),
            "JUPYTER_BIN": str(jupyter),
            "JUPYTER_CONFIG_DIR": str(run_dir / "config"),
            "JUPYTER_RUNTIME_DIR": str(run_dir / "runtime"),
            # The worker may run as root (in a container, in CI); JupyterLab refuses to unless told.
            "JUPYTER_ALLOW_ROOT": "True" if os.geteuid() == 0 else "False",
            "DEVCLOUD_INSTANCE_ID": str(spec.instance_id),
        }
        if turn is not None:
            turn()
        with open(run_dir / "jupyter.log", "ab") as log:
            process = subprocess.Popen(
                ["bash", str(ENTRYPOINT)],
                env=env,
                cwd=workspace,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group, so stop can signal JupyterLab without touching the worker.
                start_new_session=True,
            )
        # Reap it when it exits, so a stopped JupyterLab does not linger as a zombie of the worker.
        threading.Thread(target=process.wait, name=f"reap-jupyter-{process.pid}", daemon=True).start()
        state = {
            "pid": process.pid,
            "port": port,
            "started": _start_time(process.pid),
            "run_dir": str(run_dir),
            "workspace": str(workspace),
        }
        _write_json(run_dir / "state.json", state)
        return StartResult(endpoint=f"http://127.0.0.1:{port}", state=state)

    def stop(self, ref: InstanceRef) -> None:
        """Stops JupyterLab and its kernels; returns once they are gone. Keeps the workspace. Idempotent."""
        state = self._recorded_state(ref.id)
        if state and _alive(state):
            pid = state["pid"]
            # Kernels run in process groups of their own; note them before JupyterLab is told to go.
            children = _descendants(pid)
            _signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while _alive(state) and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal_group(pid, signal.SIGKILL)
            for child in children:
                _signal(child, signal.SIGKILL)
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while _alive(state):
                if time.monotonic() > deadline:
                    raise DriverError(f"JupyterLab (pid {pid}) did not exit after SIGKILL.", permanent=False)
                time.sleep(0.02)
        (self.run_dir(ref.id) / "state.json").unlink(missing_ok=True)

    def poll(self, ref: InstanceRef) -> PollResult:
        """running while the recorded process lives, exited once it died on its own, missing otherwise."""
        state = self._recorded_state(ref.id)
        if not state:
            return PollResult(status="missing")
        if _alive(state):
            return PollResult(status="running")
        return PollResult(
            status="exited", detail=f"JupyterLab exited; see {state.get('run_dir')}/jupyter.log"
        )

    def managed_instance_ids(self) -> set[str]:
        """Instance ids with a run directory that records a process (alive or not)."""
        root = local_root() / "local-instances"
        if not root.is_dir():
            return set()
        return {path.parent.name for path in root.glob("*/state.json")}

    def logs(self, ref: InstanceRef, tail: int = 100) -> str:
        """The last `tail` lines of JupyterLab's output (run_dir/jupyter.log), token blanked out."""
        path = self.run_dir(ref.id) / "jupyter.log"
        try:
            lines = path.read_text(errors="replace").splitlines()[-tail:]
        except FileNotFoundError:
            return ""
        return hide_token("\n".join(lines), ref.jupyter_token)

    def _recorded_state(self, instance_id) -> dict | None:
        """The instance's state file, or None. Deliberately not the InstanceRef's state: after a stop that
        still names the old pid, and poll must then say "missing"."""
        try:
            return json.loads((self.run_dir(instance_id) / "state.json").read_text())
        except (FileNotFoundError, ValueError):
            return None


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may contain spaces), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    fields = _proc_stat(pid)
    # Field 22 of stat, the start time in clock ticks since boot; index 19 after the command name.
    return int(fields[19]) if fields else None


def _alive(state: dict) -> bool:
    """Whether the recorded process still runs: same pid and start time (pids are reused), not a zombie."""
    fields = _proc_stat(state.get("pid", 0))
    if not fields or fields[0] in ("Z", "X"):
        return False
    return state.get("started") is None or int(fields[19]) == state["started"]


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields:
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _write_json(path: Path, data: dict) -> None:
    # Written whole then renamed, so a reader never sees half a file.
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)
