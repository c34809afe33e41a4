"""GPU health: each heartbeat reads every present GPU's health on its host, and drains a GPU that turned
unhealthy on its own, until an operator returns it.

A GPU is unhealthy when (checked in this order, the first reason is recorded):
  - the KFD topology no longer lists it: the driver lost it, it does not answer;
  - its device node dev/dri/renderD<minor> is gone;
  - its uncorrectable RAS error count (the sum of the "ue:" lines of amdgpu's ras/*_err_count files)
    rose since the previous reading.
Correctable errors ("ce:") alone never drain a GPU: ECC corrected them, and MI300X hosts report a
trickle of them in normal service; they are recorded and shown. The first reading of a GPU (or one after
the counters went down, a driver reload) is only a baseline. A host that shows no KFD topology or no
dev/dri at all, or whose engine cannot run the reader, has its GPUs left as they were: that is a
host-level fault (discovery and the host's own heartbeat deal with it), not a verdict on one GPU.

A drained GPU (Gpu.is_drained) takes no new placements: the host's GPU counts leave it out (migration
0008) and the scheduler takes no drained GPU. Its holder keeps running; the instance lifecycle tells
the owner (portal/instances/lifecycle.py). Draining and returning are in the audit log ("gpu.drain",
actor: the system; "gpu.return", actor: the operator).
"""

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from portal.audit.services import audit_record

from . import hostfs
from .inventory import InventoryError
from .models import Gpu

logger = logging.getLogger(__name__)


class GpuReturnError(Exception):
    """A GPU cannot be returned to service; the message says why."""


@dataclass(frozen=True)
class HostReading:
    """One host's GPU health as read this beat: readings by render minor, or the error that kept them."""

    host_id: int
    readings: dict
    error: str = ""


def host_gpus_read(host, gpus) -> HostReading:
    """Read the health of `gpus`, the host's present GPUs (no database access: heartbeat threads call it)."""
    minors = [gpu.render_minor for gpu in gpus]
    if not minors:
        return HostReading(host.pk, {})
    try:
        return HostReading(host.pk, hostfs.gpu_health(host, minors))
    except InventoryError as error:
        return HostReading(host.pk, {}, error=str(error))


def unhealthy_reason(gpu: Gpu, reading: hostfs.GpuHealthReading) -> str:
    """Why `reading` makes the GPU unhealthy, or "" when it does not (the rules of the module docstring)."""
    if not reading.listed:
        return (
            f"GPU renderD{gpu.render_minor} stopped answering: the KFD topology no longer lists it "
            "(check dmesg for amdgpu errors, e.g. a ring timeout)."
        )
    if not reading.device_node:
        return f"Its device node /dev/dri/renderD{gpu.render_minor} is gone."
    before, now = gpu.ras_uncorrectable, reading.ras_uncorrectable
    if before is not None and now is not None and now > before:
        return f"Uncorrectable RAS errors rose from {before} to {now} since the last reading."
    return ""


def host_gpus_judge(host, gpus, reading: HostReading, *, now: datetime) -> list[int]:
    """Record the reading on the host's GPUs and drain the ones it shows unhealthy. Returns the ids of
    the GPUs this call drained (a GPU drained already, or by a concurrent beat, is not counted twice)."""
    if reading.error:
        logger.warning("GPU health of host %s is unknown this beat: %s", host.name, reading.error)
        return []
    drained = []
    for gpu in gpus:
        found = reading.readings.get(gpu.render_minor)
        if found is None:
            continue
        reason = unhealthy_reason(gpu, found)
        with transaction.atomic():
            Gpu.objects.filter(pk=gpu.pk).update(
                ras_uncorrectable=found.ras_uncorrectable,
                ras_correctable=found.ras_correctable,
                health_checked_at=now,
            )
            if reason and Gpu.objects.filter(pk=gpu.pk, is_drained=False).update(
                is_drained=True, drained_reason=reason, drained_at=now
            ):
                audit_record(
                    actor=None,
                    action="gpu.drain",
                    target=gpu,
                    reason=reason,
                    details={
                        "host": host.name,
                        "render_minor": gpu.render_minor,
                        "ras_uncorrectable": found.ras_uncorrectable,
                        "ras_correctable": found.ras_correctable,
                        "listed": found.listed,
                        "device_node": found.device_node,
                    },
                )
                drained.append(gpu.pk)
    return drained


def gpu_return(*, gpu_id: int, actor, reason: str) -> Gpu:
    """Return a drained GPU to service: it takes placements again and counts as free once unheld. The
    latest reading stays its baseline, so only errors that rise after this count. Audited.

    Raises GpuReturnError when the reason is empty or the GPU is not drained.
    """
    reason = (reason or "").strip()
    if not reason:
        raise GpuReturnError("Say why the GPU is fit for service again (e.g. what was checked or replaced).")
    with transaction.atomic():
        gpu = Gpu.objects.select_related("host").select_for_update(of=("self",)).get(pk=gpu_id)
        if not gpu.is_drained:
            raise GpuReturnError(f"{gpu} is not drained.")
        previous = gpu.drained_reason
        Gpu.objects.filter(pk=gpu.pk).update(is_drained=False, drained_reason="", drained_at=None)
        audit_record(
            actor=actor,
            action="gpu.return",
            target=gpu,
            reason=reason,
            details={"host": gpu.host.name, "render_minor": gpu.render_minor, "drained_because": previous},
        )
    gpu.refresh_from_db()
    return gpu
