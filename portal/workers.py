"""The Celery process layout: which workers run, on which queues, with which pool and concurrency.

This module is the one place those options live. `make run` (scripts/run.py) starts every process listed
in PROCESSES through `command()`, and the systemd units in deploy/systemd/ run the same thing with
`python -m portal.workers <name>`, so production, `make run` and the benchmarks run one layout.

    python -m portal.workers default        the default queue: metering, stops, emails, beat work
    python -m portal.workers provisioning   launches: waits on Docker engines and JupyterLab
    python -m portal.workers beat           the one Celery beat
    python -m portal.workers --print NAME   prints the command instead of running it

Why two workers: a launch holds its worker slot until JupyterLab answers (seconds to minutes), and
nearly all of that time it sleeps on the network. On the default prefork pool (one process per core) a
burst of launches would take every slot, and the meter tick, stops and emails would wait behind it.
Launches therefore go to their own queue (CELERY_PROVISIONING_QUEUE, routed by `route_task`), served by
a thread pool sized for waiting rather than for cores. The thread pool cannot enforce Celery's time
limits; a launch ends on its own deadline (READY_TIMEOUT_SECONDS) and the reconciler fails one stuck for
longer than twice STUCK_TRANSITION_SECONDS.

Queue names come from the settings (CELERY_QUEUE, CELERY_PROVISIONING_QUEUE), so a second portal
sharing a Redis sets those and nothing else.
"""

import os
import sys
from dataclasses import dataclass

# Tasks that wait on engines and JupyterLab. Image builds (provisioning.ensure_image) stay on the default
# queue: they need the hard time limit only the prefork pool enforces (provisioning/images.py).
# The engine questions a page waits for (an instance's log, the console's engine check, GPU discovery and
# a host's images) go here too: its threads are free within seconds, while the default worker's few
# processes may all be busy with builds for an hour.
PROVISIONING_TASKS = frozenset(
    {
        "provisioning.provision_instance",
        "instances.log_read",
        "provisioning.console_engine_ping",
        "provisioning.console_host_check",
        "provisioning.console_host_discover",
        "provisioning.console_host_images",
    }
)

# Threads of the provisioning worker, i.e. launches that may wait on JupyterLab at once. Each holds a
# database connection only while it touches the database (CONN_MAX_AGE applies per thread).
DEFAULT_PROVISIONING_CONCURRENCY = 32


@dataclass(frozen=True)
class Process:
    """One Celery process of the layout."""

    name: str
    # "worker" or "beat".
    kind: str
    # The setting naming the queue it consumes (workers only).
    queue_setting: str = ""
    pool: str = ""
    # Environment variable that overrides the concurrency, and its default (None: Celery's, one per core).
    concurrency_env: str = ""
    concurrency_default: int | None = None


PROCESSES = {
    "default": Process(
        name="default",
        kind="worker",
        queue_setting="CELERY_TASK_DEFAULT_QUEUE",
        # prefork: CPU-bound work (metering in bulk, reconciling) and the only pool with time limits.
        pool="prefork",
        concurrency_env="DEVCLOUD_WORKER_CONCURRENCY",
    ),
    "provisioning": Process(
        name="provisioning",
        kind="worker",
        queue_setting="CELERY_PROVISIONING_QUEUE",
        pool="threads",
        concurrency_env="DEVCLOUD_PROVISIONING_CONCURRENCY",
        concurrency_default=DEFAULT_PROVISIONING_CONCURRENCY,
    ),
    "beat": Process(name="beat", kind="beat"),
}


def queue_for(process: Process) -> str:
    """The queue `process` consumes, from the Django settings. Raises LookupError when it has none."""
    from django.conf import settings

    queue = getattr(settings, process.queue_setting, "") if process.queue_setting else ""
    if not queue:
        raise LookupError(
            f"{process.queue_setting} is empty, so there is no separate {process.name} queue to consume"
        )
    return queue


def concurrency_for(process: Process, environ=os.environ) -> int | None:
    """Threads or processes of a worker: its environment variable, else its default (None: Celery's)."""
    value = environ.get(process.concurrency_env, "") if process.concurrency_env else ""
    if value:
        return int(value)
    return process.concurrency_default


def celery_args(name: str, *, environ=os.environ, beat_schedule: str = "") -> list[str]:
    """The arguments after `python -m celery` that run process `name` of the layout.

    Raises KeyError for an unknown name and LookupError for a worker whose queue setting is empty.
    """
    process = PROCESSES[name]
    if process.kind == "beat":
        args = ["-A", "portal", "beat", "-l", "info"]
        if beat_schedule:
            args += ["-s", beat_schedule]
        return args
    args = ["-A", "portal", "worker", "-l", "info", "-n", f"{process.name}@%h", "-Q", queue_for(process)]
    args += ["-P", process.pool]
    concurrency = concurrency_for(process, environ)
    if concurrency:
        args += ["-c", str(concurrency)]
    return args


def command(
    name: str, *, python: str = sys.executable, environ=os.environ, beat_schedule: str = ""
) -> list[str]:
    """The whole command line of process `name` (see celery_args)."""
    return [python, "-m", "celery", *celery_args(name, environ=environ, beat_schedule=beat_schedule)]


def route_task(name, args, kwargs, options, task=None, **kw):
    """Celery router (CELERY_TASK_ROUTES): launches to CELERY_PROVISIONING_QUEUE when that is set.

    Returns the route, or None for the default queue. Read at publish time, so settings overrides apply.
    """
    from django.conf import settings

    queue = getattr(settings, "CELERY_PROVISIONING_QUEUE", "")
    if queue and name in PROVISIONING_TASKS:
        return {"queue": queue}
    return None


def main(argv: list[str]) -> int:
    """`python -m portal.workers [--print] NAME [--schedule PATH]`: replaces this process with Celery."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")
    show = "--print" in argv
    argv = [arg for arg in argv if arg != "--print"]
    schedule = ""
    if "--schedule" in argv:
        index = argv.index("--schedule")
        schedule = argv[index + 1]
        del argv[index : index + 2]
    if len(argv) != 1 or argv[0] not in PROCESSES:
        print(
            f"usage: python -m portal.workers [--print] {{{','.join(PROCESSES)}}} [--schedule PATH]",
            file=sys.stderr,
        )
        return 2
    try:
        cmd = command(argv[0], beat_schedule=schedule)
    except LookupError as error:
        print(f"portal.workers: {error}", file=sys.stderr)
        return 2
    if show:
        print(" ".join(cmd))
        return 0
    # exec: the service manager's signals (SIGTERM: warm shutdown) reach Celery itself.
    os.execv(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
