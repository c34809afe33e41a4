"""GPU placement: which host's GPUs an instance gets, decided by the database.

Rules (docs/architecture.md, "Instances"):
- An 8x instance takes all 8 GPUs of an ACTIVE host whose present GPUs are all free, and that has
  exactly 8 of them.
- A 1x instance packs onto the fullest ACTIVE host that still has a free GPU, so whole hosts stay free
  for 8x. Among hosts with equally many GPUs in use, the one with the fewest free GPUs goes first (a host
  with a missing GPU, which can never take an 8x, fills before a whole one), then by name and id.
- Draining, down and retired hosts get nothing.
- Images: a host is a candidate only when it has the instance's image, or a pull (an ImageJob) of it is
  under way there, or its images were never looked at (a host nobody surveyed is not refused on a guess).
  Hosts that have the image come first, so a launch waits on a pull only when no host has the image.
- Workspaces: among those, the host that holds the owner's workspace (Workspace) comes next, before
  packing, so a launch there starts without moving it (provisioning/workspaces.py).

Allocation is serialised by PostgreSQL, not by a process: the candidate search is one aggregate query,
the chosen host's row is locked (select_for_update) and its free GPUs re-read under that lock, and the
partial unique constraint on GpuAllocation (one live holder per GPU) is the backstop if anything slips
past; an IntegrityError moves on to the next candidate. Any number of workers may call allocate() at once.

The queue: an instance that gets no GPUs stays QUEUED. Queued launches start in FIFO order of created_at
(see next_queued for how 8x launches at the head are kept from starving).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, F, FilteredRelation, OuterRef, Q
from django.utils import timezone

from portal.instances.models import Instance
from portal.instances.sizes import SIZES

from .models import Gpu, GpuAllocation, GpuHost, HostImage, ImageJob, Workspace

GPUS_PER_WHOLE_HOST = 8
# Hosts fetched per candidate query. Each one is tried under its lock; only when all were taken by
# concurrent allocations in the meantime is the query run again.
CANDIDATE_BATCH = 8
# States an instance can be allocated GPUs in: queued (launch or queue task) or provisioning (the
# provision task allocates after claiming the instance).
ALLOCATABLE_STATES = (Instance.State.QUEUED, Instance.State.PROVISIONING)


class SchedulerError(Exception):
    """allocate() was asked for something it can never do (unknown size, an instance that has ended)."""


def _image_annotations(reference: str) -> dict:
    """has_image, pulling and surveyed flags of a host for `reference` (see the module's rules)."""
    return {
        "has_image": Exists(HostImage.objects.filter(host=OuterRef("pk"), reference=reference, present=True)),
        "pulling": Exists(
            ImageJob.objects.filter(host=OuterRef("pk"), reference=reference, state__in=ImageJob.ACTIVE_STATES)
        ),
        "surveyed": Exists(HostImage.objects.filter(host=OuterRef("pk"))),
    }


def _candidate_hosts(
    *, gpus_needed: int, exclude_ids, reserve_whole_hosts: bool, reference: str = "", user_id=None
):
    """Ids of ACTIVE hosts that can take `gpus_needed` GPUs now, best first. One aggregate query.

    `free` counts present GPUs without a live allocation. The join to allocations is filtered to live
    ones (released_at IS NULL, which the partial unique index covers), so there is at most one row per
    GPU and the allocation history never slows this down.
    """
    hosts = (
        GpuHost.objects.filter(state=GpuHost.State.ACTIVE)
        .exclude(pk__in=exclude_ids)
        .annotate(
            present_gpus=FilteredRelation("gpus", condition=Q(gpus__is_present=True)),
            live=FilteredRelation(
                "present_gpus__allocations", condition=Q(present_gpus__allocations__released_at__isnull=True)
            ),
        )
        .annotate(present=Count("present_gpus"), used=Count("live"))
        .annotate(free=F("present") - F("used"))
    )
    image_first = []
    if reference:
        hosts = hosts.annotate(**_image_annotations(reference)).filter(
            Q(has_image=True) | Q(pulling=True) | Q(surveyed=False)
        )
        image_first = ["-has_image"]
    if user_id is not None:
        hosts = hosts.annotate(
            has_workspace=Exists(Workspace.objects.filter(host=OuterRef("pk"), user_id=user_id))
        )
        image_first.append("-has_workspace")
    if gpus_needed == GPUS_PER_WHOLE_HOST:
        hosts = hosts.filter(present=GPUS_PER_WHOLE_HOST, used=0).order_by(*image_first, "name", "pk")
    else:
        hosts = hosts.filter(free__gte=gpus_needed)
        if reserve_whole_hosts:
            # An 8x launch is waiting: a host that could take it is not used for a 1x.
            hosts = hosts.exclude(present=GPUS_PER_WHOLE_HOST, used=0)
        hosts = hosts.order_by(*image_first, "-used", "free", "name", "pk")
    return list(hosts.values_list("pk", flat=True)[:CANDIDATE_BATCH])


def _take(host_id: int, instance: Instance, gpus_needed: int) -> list[GpuAllocation] | None:
    """Inside a savepoint: lock the host, re-check its free GPUs, and allocate. None if it no longer fits."""
    host = GpuHost.objects.select_for_update().filter(pk=host_id, state=GpuHost.State.ACTIVE).first()
    if host is None:
        return None
    free = list(
        Gpu.objects.filter(host_id=host_id, is_present=True)
        .filter(~Exists(GpuAllocation.objects.filter(gpu=OuterRef("pk"), released_at__isnull=True)))
        .order_by("node_id")
        .values_list("pk", flat=True)
    )
    if gpus_needed == GPUS_PER_WHOLE_HOST:
        present = Gpu.objects.filter(host_id=host_id, is_present=True).count()
        if present != GPUS_PER_WHOLE_HOST or len(free) != GPUS_PER_WHOLE_HOST:
            return None
    elif len(free) < gpus_needed:
        return None
    allocations = GpuAllocation.objects.bulk_create(
        [GpuAllocation(gpu_id=gpu_id, instance=instance) for gpu_id in free[:gpus_needed]]
    )
    Instance.objects.filter(pk=instance.pk).update(host=host)
    return allocations


def allocate(*, instance_id, reserve_whole_hosts: bool = False) -> list[GpuAllocation] | None:
    """Give the instance its GPUs on one host, in one transaction. Returns its live allocations.

    Returns None when no ACTIVE host can take it now; the instance is left QUEUED for the caller to keep
    in the queue. Idempotent: an instance that already holds GPUs gets its existing allocations back.
    Sets instance.host; does not change the instance's state (the caller moves it on).
    `reserve_whole_hosts` (1x only) keeps entirely free 8-GPU hosts for a waiting 8x; see next_queued.

    Raises SchedulerError for an unknown size or an instance that is not queued or provisioning, and
    Instance.DoesNotExist for an unknown id.
    """
    with transaction.atomic():
        # Locking the instance makes a duplicate call (a redelivered task) wait, then see the first
        # call's allocations instead of allocating twice.
        instance = Instance.objects.select_for_update(of=("self",)).select_related("image").get(pk=instance_id)
        if instance.state not in ALLOCATABLE_STATES:
            raise SchedulerError(
                f"Instance {instance.short_id} is {instance.state}; only a live launch gets GPUs."
            )
        size = SIZES.get(instance.size)
        if size is None:
            raise SchedulerError(f"Unknown instance size {instance.size!r}.")
        held = list(GpuAllocation.objects.filter(instance=instance, released_at__isnull=True))
        if held:
            return held

        tried = set()
        while True:
            candidates = _candidate_hosts(
                gpus_needed=size.gpus,
                exclude_ids=tried,
                reserve_whole_hosts=reserve_whole_hosts,
                reference=instance.image.reference,
                user_id=instance.user_id,
            )
            if not candidates:
                return None
            for host_id in candidates:
                tried.add(host_id)
                try:
                    with transaction.atomic():
                        allocations = _take(host_id, instance, size.gpus)
                except IntegrityError:
                    # Another transaction took one of these GPUs between our read and our insert.
                    allocations = None
                if allocations:
                    instance.host_id = host_id
                    return allocations


def release(*, instance_id) -> int:
    """Free every GPU the instance holds. Returns how many were freed; 0 when it held none (idempotent)."""
    return GpuAllocation.objects.filter(instance_id=instance_id, released_at__isnull=True).update(
        released_at=timezone.now()
    )


def _queued():
    return Instance.objects.filter(state=Instance.State.QUEUED).order_by("created_at", "id")


def queue_position(instance: Instance) -> int | None:
    """1-based place of a queued instance among all queued launches, oldest first; None if not queued."""
    if instance.state != Instance.State.QUEUED:
        return None
    ahead = Instance.objects.filter(state=Instance.State.QUEUED).filter(
        Q(created_at__lt=instance.created_at) | Q(created_at=instance.created_at, id__lt=instance.id)
    )
    return ahead.count() + 1


@dataclass(frozen=True)
class QueuedLaunch:
    """A queued instance to try now, and how: pass reserve_whole_hosts on to allocate()."""

    instance: Instance
    reserve_whole_hosts: bool


def eightx_max_wait() -> timedelta:
    """How long the oldest queued 8x may wait before launches behind it are held back for it."""
    return timedelta(seconds=getattr(settings, "SCHEDULER_8X_MAX_WAIT_SECONDS", 600))


def next_queued(*, limit: int = 100, now=None) -> list[QueuedLaunch]:
    """The queued launches the "start queued launches" task should try, in the order to try them.

    FIFO by created_at, with bounded backfill so that neither size starves:
    - Launches ahead of the oldest queued 8x are tried normally.
    - Behind a waiting 8x, 1x launches may still start, but only on partly used hosts
      (reserve_whole_hosts=True): a host that frees up entirely is kept for the 8x. Later 8x launches
      are listed too; they can only ever take a whole free host, after the older 8x has had its try.
    - Once the oldest queued 8x has waited longer than SCHEDULER_8X_MAX_WAIT_SECONDS (default 600),
      nothing behind it is listed: strict FIFO until it starts, so partly used hosts drain as their
      instances stop instead of being refilled by 1x backfill forever.
    Returns at most `limit` entries.
    """
    now = now or timezone.now()
    launches = []
    waiting_8x = None
    for instance in _queued()[:limit]:
        if waiting_8x is not None and now - waiting_8x.created_at > eightx_max_wait():
            break
        launches.append(QueuedLaunch(instance=instance, reserve_whole_hosts=waiting_8x is not None))
        size = SIZES.get(instance.size)
        if waiting_8x is None and size is not None and size.gpus == GPUS_PER_WHOLE_HOST:
            waiting_8x = instance
    return launches
