"""The console's engine calls, run on the provisioning worker: the engine check (with what it can limit),
GPU discovery and a host's image tags.

The web process has no Docker socket and drives no engine (deploy/systemd/devcloud-web.service), so the
host pages ask the provisioning worker (tasks in tasks.py, routed to its queue by portal/workers.py) and
wait for its answer a few seconds (portal/lib/worker_calls.py). Each function here is the web's half and
raises what the service it stands for raises, plus WorkerSilent when no worker answered in time; each
`*_answer` function is the worker's half, turning the service's outcome into JSON.
"""

import logging
from dataclasses import asdict

from portal.lib.sealed import seal, unseal
from portal.lib.worker_calls import NoAnswer, ask_worker

from . import services
from .drivers.base import DriverError
from .drivers.docker_engine import DockerEngine
from .inventory import InventoryError
from .models import GpuHost

log = logging.getLogger(__name__)

# How long a console page waits for the worker: an engine check is a ping (ENGINE_TIMEOUT_SECONDS) and a
# tiny volume; discovery may run a helper container on the host (provisioning/hostfs.py).
CHECK_SECONDS = 20
DISCOVER_SECONDS = 60
IMAGES_SECONDS = 20
# The kit's unit of the provisioning worker (deploy/systemd/).
WORKER_UNIT = "devcloud-provisioning"


class WorkerSilent(services.HostError):
    """The provisioning worker did not answer (or the task queue did not take the question)."""


def silence_message(silence: NoAnswer) -> str:
    """What the console says when the worker did not answer, and what to look at."""
    if not silence.published:
        return (
            "Could not ask the provisioning worker: the task queue (Redis) does not answer. Check "
            "`systemctl status redis-server`, then try again."
        )
    return (
        f"The provisioning worker did not answer within {silence.seconds:g} s: is it running? "
        f"`systemctl status {WORKER_UNIT}` (under make run: its output in the terminal)."
    )


def _ask(task, args, seconds: float) -> dict:
    try:
        return ask_worker(task, args=args, seconds=seconds)
    except NoAnswer as silence:
        raise WorkerSilent(silence_message(silence)) from silence


def _raise_for(answer: dict) -> None:
    # The service's error, raised again on this side of the queue.
    if "error" in answer:
        kind = {
            "unreachable": services.HostUnreachable,
            "inventory": InventoryError,
        }.get(answer.get("kind"), services.HostError)
        raise kind(answer["error"])


def _answering(work) -> dict:
    # An unexpected failure still answers, so the page says it instead of waiting out the timeout.
    try:
        return work()
    except Exception as error:
        log.exception("A console engine call failed on the worker")
        return {"error": f"the provisioning worker failed: {type(error).__name__}: {error}", "kind": "bug"}


# --- The engine check of the host form (nothing saved yet) ------------------------------------------


def engine_ping(**engine) -> dict:
    """services.engine_ping of the form's engine fields, on the worker. Returns the engine's /version.

    The client key travels sealed (portal/lib/sealed.py), like it is stored. Raises HostUnreachable,
    HostError, or WorkerSilent.
    """
    from .tasks import console_engine_ping

    fields = dict(engine)
    fields["tls_client_key"] = seal(fields["tls_client_key"]) if fields.get("tls_client_key") else ""
    answer = _ask(console_engine_ping, [fields], CHECK_SECONDS)
    _raise_for(answer)
    return answer["version"]


def engine_ping_answer(fields: dict) -> dict:
    def work():
        engine = dict(fields)
        if engine.get("tls_client_key"):
            engine["tls_client_key"] = unseal(engine["tls_client_key"])
        try:
            return {"version": services.engine_ping(**engine)}
        except services.HostError as error:
            return _error_answer(error)

    return _answering(work)


def _error_answer(error: services.HostError) -> dict:
    kind = "unreachable" if isinstance(error, services.HostUnreachable) else "host"
    return {"error": error.message, "kind": kind}


# --- A saved host: check, discover, images -------------------------------------------------------------


def host_check(*, host_id: int) -> dict:
    """services.host_check on the worker: pings the engine, asks what disk limits it can enforce and
    records both on the host. Returns the engine's /version. Raises HostUnreachable, HostError or
    WorkerSilent."""
    from .tasks import console_host_check

    answer = _ask(console_host_check, [host_id], CHECK_SECONDS)
    _raise_for(answer)
    return answer["version"]


def host_check_answer(host_id: int) -> dict:
    def work():
        try:
            return {"version": services.host_check(host_id=host_id)}
        except services.HostError as error:
            return _error_answer(error)

    return _answering(work)


def host_discover(*, host_id: int) -> services.DiscoverySummary:
    """services.host_discover on the worker. Returns what changed. Raises InventoryError or WorkerSilent."""
    from .tasks import console_host_discover

    answer = _ask(console_host_discover, [host_id], DISCOVER_SECONDS)
    _raise_for(answer)
    return services.DiscoverySummary(**answer["summary"])


def host_discover_answer(host_id: int) -> dict:
    def work():
        try:
            return {"summary": asdict(services.host_discover(host_id=host_id))}
        except InventoryError as error:
            return {"error": str(error), "kind": "inventory"}

    return _answering(work)


def host_image_tags(host: GpuHost) -> list[str]:
    """Every image tag on the host's engine, read by the worker. Raises HostError (the engine's reason)
    or WorkerSilent."""
    from .tasks import console_host_images

    answer = _ask(console_host_images, [host.pk], IMAGES_SECONDS)
    _raise_for(answer)
    return answer["tags"]


def host_image_tags_answer(host_id: int) -> dict:
    def work():
        host = GpuHost.objects.get(pk=host_id)
        try:
            # Pinged first (a few seconds at most), so a host gone silent does not hold the page for the
            # longer timeout of an ordinary API call.
            services.engine_ping(docker_url=host.docker_url, **services.engine_tls(host))
            return {"tags": DockerEngine(host).images()}
        except services.HostError as error:
            return _error_answer(error)
        except DriverError as error:
            return {"error": error.message, "kind": "host"}

    return _answering(work)
