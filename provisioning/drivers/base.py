"""The contract every backend keeps, in the spirit of JupyterHub's Spawner.

A driver runs instances on one place: a Docker host, a Slurm partition, or this machine. It is built
with the place's row (its connection settings; `driver_for` builds it) and handed everything else in
plain values: a StartSpec to start an instance, an InstanceRef for everything after. It reads no row of
the apps above it (accounts, SSH keys, workspaces, the catalogue) and writes none: the instance lifecycle
(portal/instances/lifecycle.py) reads those and hands the driver what they say.

Where DevCloud places (Docker hosts), the spec names the GPUs DevCloud's scheduler allocated. Where the
backend places (Slurm), the spec gives only the GPU count, and the driver reports where the work landed.
"""

import uuid
from dataclasses import dataclass, field
from datetime import datetime


class DriverError(Exception):
    """A backend failure. `permanent` says whether retrying can help (healthchecks' TransportError)."""

    def __init__(self, message: str, *, permanent: bool):
        super().__init__(message)
        self.message = message
        self.permanent = permanent


class NotPlacedYet(Exception):
    """The backend accepted the instance but has not given it resources yet (a Slurm job that pends).

    `reason` says why, in words for the instance's page ("waiting for GPUs to free up"). The caller asks
    again later with the same spec: start is idempotent, so the second call finds the same submission.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class GpuDevice:
    """One GPU DevCloud's scheduler allocated: its render node's minor and the group that owns it."""

    render_minor: int
    render_gid: int | None = None


@dataclass(frozen=True)
class StartSpec:
    """Everything a driver needs to start one instance, built by the lifecycle (start_spec_for)."""

    instance_id: uuid.UUID
    owner_id: int
    # The image to run ("devcloud/cpu:abc" or a registry reference) and its name for messages.
    image_reference: str
    image_name: str
    # The GPUs DevCloud allocated (Docker hosts), or empty where the backend places them (gpu_count).
    gpus: tuple[GpuDevice, ...]
    gpu_count: int
    # The instance's share of its host.
    cpus: float
    memory_bytes: int
    shm_bytes: int
    pids_limit: int
    # The public keys sshd inside trusts, one per line ("" for none).
    authorized_keys: str
    # The path JupyterLab serves under (the gateway forwards it unchanged) and its only credential.
    lab_base_path: str
    jupyter_token: str
    # The owner's workspace: a volume name on Docker, a directory name under the shared workspace root on
    # Slurm and on this machine.
    workspace: str
    # The longest the instance may run; the backend enforces it too where it can (a Slurm time limit).
    time_limit_seconds: int
    # Whose workspace may be mounted: the owner's never-reused key (accounts.User.workspace_key, hex) and
    # this install's id (provisioning/identity.py). A volume labelled otherwise is refused. Empty: looked up.
    owner_key: str = ""
    install_id: str = ""
    # Disk limits, in bytes (0: none): what a workspace volume made for this start may hold, and what the
    # instance may write outside /workspace. A backend that cannot enforce them says so
    # (settings.DEVCLOUD_DISK_LIMITS decides whether it refuses or starts without them).
    workspace_limit_bytes: int = 0
    disk_limit_bytes: int = 0

    @property
    def short_id(self) -> str:
        return self.instance_id.hex[:8]


@dataclass(frozen=True)
class InstanceRef:
    """Which instance a call is about, after start: its id, owner, token and the driver's own state."""

    id: uuid.UUID
    owner_id: int
    jupyter_token: str = ""
    state: dict = field(default_factory=dict)


@dataclass
class PollResult:
    """What a backend sees of an instance right now."""

    # "running", "pending" (accepted, not yet given resources), "exited" or "missing" (never started,
    # or removed).
    status: str
    exit_code: int | None = None
    detail: str = ""
    # For an exited instance: "" when it ended on its own, "host_down" when its node died under it,
    # "max_length" when the backend ended it at its time limit; and when it was last seen running (how far
    # it is charged then).
    ended_because: str = ""
    last_seen_at: datetime | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass
class StartResult:
    """What `start` returns: where JupyterLab answers, and the driver's own state to keep."""

    # Base URL of JupyterLab as the portal reaches it, e.g. "http://127.0.0.1:49153".
    endpoint: str
    state: dict = field(default_factory=dict)


class Driver:
    """One backend on one place (a host, a partition).

    start(spec, progress=None, turn=None) -> StartResult
        Starts the instance `spec` describes and returns once it is started (not necessarily answering).
        `progress(message)`, when given, gets lines for the instance's timeline about slow steps.
        `turn()`, when given, is called once everything is made and just before the instance starts: it
        returns when the instance may start (its start slot, provisioning/start_slots.py) and may raise
        to call the start off, leaving what was made for stop() to remove. Idempotent: the names the
        driver gives derive from the instance id, so a retry finds what the first call made and returns
        its endpoint instead of making a second. Raises DriverError(permanent=True) for a bad image or a
        device that does not exist, DriverError(permanent=False) when the backend cannot be reached, and
        NotPlacedYet when the backend queued the instance without resources yet (ask again later).
    stop(ref) -> None
        Stops the instance and removes what start made, keeping the workspace. Returns only once it is
        gone. "Already gone" is success. Idempotent.
    poll(ref) -> PollResult
        Safe before start and after stop ("missing"). Never raises for a missing instance; raises
        DriverError(permanent=False) only when the backend cannot be reached.
    managed_instance_ids() -> set[str]
        Instance ids of everything this portal manages on the place, running or not, named or labelled as
        ours; the reconciler compares them with the database.
    logs(ref, tail) -> str
        The last `tail` lines the instance printed, for the operator console, with its Jupyter token
        blanked out. "" when there is nothing (never started, or removed).
    wait_for_output(ref, text, deadline, cancelled) -> bool
        Blocks until the instance prints a line containing `text` (True), or its output ends (it exited
        or was removed), time.monotonic() passes `deadline` or `cancelled` (a threading.Event) is set
        (False). Only when `watches_output`; the readiness wait uses it to learn when JupyterLab
        listens without asking it many times a second. Raises DriverError like poll.
    authorized_keys_set(ref, text) -> bool
        Makes `text` the public keys the instance's sshd trusts. False when the instance has nothing
        running to put them in, or the driver runs no sshd (the default). Raises DriverError like poll.
    remove_workspace(owner_id) -> None
        Removes the owner's workspace on this place; the teardown calls it, after stop, when the owner
        deleted their account. "Already gone" is success. Idempotent.
    start_line() -> provisioning.start_slots.Line | None
        The line of start slots this place's starts queue on (how many may start at once), or None when
        starts need no turn (the backend queues them itself).
    """

    name = "base"
    # Whether instances see only their own GPUs. The local driver cannot promise that.
    isolates_gpus = True
    # Whether wait_for_output can follow what an instance prints.
    watches_output = False
    # Whether DevCloud's scheduler allocates this place's GPUs (True), or the backend places (False).
    places_with_scheduler = True
    # Whether the owner's workspace lives on one host at a time and moves to where the instance starts
    # (provisioning/workspaces.py); False where storage is shared (Slurm) or local.
    workspace_moves = False

    def __init__(self, host):
        self.host = host

    def start(self, spec: StartSpec, progress=None, turn=None) -> StartResult:
        raise NotImplementedError

    def stop(self, ref: InstanceRef) -> None:
        raise NotImplementedError

    def poll(self, ref: InstanceRef) -> PollResult:
        raise NotImplementedError

    def managed_instance_ids(self) -> set[str]:
        raise NotImplementedError

    def logs(self, ref: InstanceRef, tail: int = 100) -> str:
        return ""

    def wait_for_output(self, ref: InstanceRef, text: str, deadline: float, cancelled) -> bool:
        raise NotImplementedError

    def authorized_keys_set(self, ref: InstanceRef, text: str) -> bool:
        return False

    def start_line(self):
        return None

    def remove_workspace(self, owner_id) -> None:
        return None


def hide_token(text: str, token: str) -> str:
    """`text` with the instance's Jupyter token blanked out (JupyterLab prints it in its banner)."""
    return text.replace(token, "[token hidden]") if token else text
