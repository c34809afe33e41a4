"""An instance's last log lines, read by a worker: the web process never talks to an engine for them.

The web unit has no Docker socket (deploy/systemd/devcloud-web.service), so a page or the API asks the
provisioning worker (the instances.log_read task, routed to its queue by portal/workers.py) and waits for
its answer at most REPLY_SECONDS (portal/lib/worker_calls.py). Under eager Celery (tests, a portal without
workers) the read runs in this process.
"""

from portal.lib.worker_calls import NoAnswer, ask_worker, reply
from provisioning.drivers import driver_for
from provisioning.drivers.base import DriverError, hide_token

from .models import Instance
from .start_spec import instance_ref

# How long a page waits for a worker to read the log.
REPLY_SECONDS = 10


def _no_container(instance: Instance) -> str:
    """Why the instance has no container to read, in words; "" when it has one."""
    if instance.host_id is None:
        return "No container: the instance never got a host."
    if instance.state not in (Instance.State.PROVISIONING, Instance.State.RUNNING, Instance.State.STOPPING):
        return "No container: it is removed when the instance ends (the workspace volume is kept)."
    return ""


def log_lines_read(instance: Instance, *, lines: int) -> tuple[list[str], str]:
    """The last `lines` lines the instance printed, read from its engine in this process, with its Jupyter
    token hidden. Returns (lines, note), where note says why there are none ("" when there are some)."""
    note = _no_container(instance)
    if note:
        return [], note
    try:
        text = driver_for(instance.host, instance.driver).logs(instance_ref(instance), tail=lines)
    except DriverError as error:
        return [], f"Could not read the log: {error.message}"
    # The drivers hide the token already; hiding it again costs nothing and survives a careless driver.
    text = hide_token(text or "", instance.jupyter_token)
    if not text.strip():
        return [], "The container has printed nothing yet."
    return text.splitlines()[-lines:], ""


def log_lines(instance: Instance, *, lines: int) -> tuple[list[str], str]:
    """log_lines_read, done by a worker: what pages and the API call. Says so when no worker answers."""
    from .tasks import instance_log_read

    note = _no_container(instance)
    if note:
        return [], note
    try:
        found = ask_worker(instance_log_read, args=[str(instance.id), lines], seconds=REPLY_SECONDS)
    except NoAnswer as silence:
        if not silence.published:
            return [], "Could not ask a worker for the log: the task queue does not answer. Try again in a minute."
        return [], (
            f"No worker read the log within {REPLY_SECONDS} s. Try again; if it keeps happening, the "
            "operators should check that the workers run (Console, Dashboard)."
        )
    return found["lines"], found["note"]


def log_reply(instance_id, lines: int, reply_to: str) -> dict:
    """The worker's half: read the log and answer {"lines", "note"} to the waiting request (reply_to)."""
    instance = Instance.objects.select_related("host").filter(pk=instance_id).first()
    if instance is None:
        found, note = [], "No such instance."
    else:
        found, note = log_lines_read(instance, lines=lines)
    return reply(reply_to, {"lines": found, "note": note})
