"""The contract every backend keeps, in the spirit of JupyterHub's Spawner.

A driver is bound to one GPU host. It knows nothing about credits or the database beyond what it is
handed: the instance (for its id, image, size, owner and token) and the GPUs it was allocated.
"""

from dataclasses import dataclass, field


class DriverError(Exception):
    """A backend failure. `permanent` says whether retrying can help (healthchecks' TransportError)."""

    def __init__(self, message: str, *, permanent: bool):
        super().__init__(message)
        self.message = message
        self.permanent = permanent


@dataclass
class PollResult:
    """What a backend sees of an instance right now."""

    # "running", "exited" or "missing" (never started, or removed).
    status: str
    exit_code: int | None = None
    detail: str = ""

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
    """One backend on one host.

    start(instance, gpus, progress=None, turn=None) -> StartResult
        Creates and starts the instance's container (or process) with exactly `gpus`, and returns once
        it is started (not necessarily answering). `progress(message)`, when given, gets lines for the
        instance's timeline about slow steps (a workspace moving from another host). `turn()`, when
        given, is called once everything is made and just before the container starts: it returns when
        the instance may start (its start slot, provisioning/start_slots.py) and may raise to call the
        start off, leaving what was made for stop() to remove. Idempotent: the
        container name derives from the instance id, so a retry finds the existing one and returns its
        endpoint instead of making a second. Raises DriverError(permanent=True) for a bad image or a device that does not exist,
        DriverError(permanent=False) when the engine cannot be reached.
    stop(instance) -> None
        Stops and removes the container, keeping the workspace volume. Returns only once it is gone.
        "Already gone" is success. Idempotent.
    poll(instance) -> PollResult
        Safe before start and after stop ("missing"). Never raises for a missing container; raises
        DriverError(permanent=False) only when the engine cannot be reached.
    managed_instance_ids() -> set[str]
        Instance ids (from labels) of every container this portal manages on the host, running or not;
        the reconciler compares them with the database.
    logs(instance, tail) -> str
        The last `tail` lines the instance printed, for the operator console, with its Jupyter token
        blanked out. "" when there is nothing (never started, or removed).
    wait_for_output(instance, text, deadline, cancelled) -> bool
        Blocks until the instance prints a line containing `text` (True), or its output ends (it exited
        or was removed), time.monotonic() passes `deadline` or `cancelled` (a threading.Event) is set
        (False). Only when `watches_output`; the readiness wait uses it to learn when JupyterLab
        listens without asking it many times a second. Raises DriverError like poll.
    authorized_keys_set(instance, text) -> bool
        Makes `text` the public keys the instance's sshd trusts. False when the instance has nothing
        running to put them in, or the driver runs no sshd (the default). Raises DriverError like poll.
    remove_workspace(instance) -> None
        Removes the workspace of the instance's owner on this host; the teardown calls it, after stop,
        when the owner deleted their account. "Already gone" is success. Idempotent. A driver that keeps
        no workspace of its own has nothing to remove.
    """

    name = "base"
    # Whether containers see only their own GPUs. The local driver cannot promise that.
    isolates_gpus = True
    # Whether wait_for_output can follow what an instance prints.
    watches_output = False

    def __init__(self, host):
        self.host = host

    def start(self, instance, gpus, progress=None, turn=None) -> StartResult:
        raise NotImplementedError

    def stop(self, instance) -> None:
        raise NotImplementedError

    def poll(self, instance) -> PollResult:
        raise NotImplementedError

    def managed_instance_ids(self) -> set[str]:
        raise NotImplementedError

    def logs(self, instance, tail: int = 100) -> str:
        return ""

    def wait_for_output(self, instance, text: str, deadline: float, cancelled) -> bool:
        raise NotImplementedError

    def authorized_keys_set(self, instance, text: str) -> bool:
        return False

    def start_line(self):
        return None

    def remove_workspace(self, instance) -> None:
        return None


def jupyter_base_url(instance) -> str:
    """The path JupyterLab serves under, which the gateway forwards unchanged: /instances/<uuid>/lab/."""
    from portal.gateway import lab_path

    return lab_path(instance.id)


def authorized_keys_text(user_id) -> str:
    """The public keys an instance of this person trusts over SSH: their account keys, one per line."""
    from portal.sshgateway.services import authorized_keys_text as text_of

    return text_of(user_id)


def hide_token(text: str, token: str) -> str:
    """`text` with the instance's Jupyter token blanked out (JupyterLab prints it in its banner)."""
    return text.replace(token, "[token hidden]") if token else text
