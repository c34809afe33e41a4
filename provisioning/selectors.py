"""Reads about GPU hosts: capacity per host, which instance holds which GPU, and which images the hosts in
service can start."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, FilteredRelation, Q, QuerySet

from .models import Gpu, GpuAllocation, GpuHost, HostImage, ImageJob


def hosts_with_usage() -> QuerySet:
    """All hosts, annotated with `present_count` (GPUs present) and `used_count` (held by an instance)."""
    return GpuHost.objects.annotate(
        present_gpus=FilteredRelation("gpus", condition=Q(gpus__is_present=True)),
        live=FilteredRelation(
            "present_gpus__allocations", condition=Q(present_gpus__allocations__released_at__isnull=True)
        ),
    ).annotate(present_count=Count("present_gpus"), used_count=Count("live"))


@dataclass(frozen=True)
class GpuMapRow:
    """One GPU of a host and its current holder, if any."""

    gpu: Gpu
    allocation: GpuAllocation | None

    @property
    def instance(self):
        return self.allocation.instance if self.allocation else None

    @property
    def owner_email(self) -> str:
        return self.allocation.instance.user.email if self.allocation else ""

    @property
    def held_since(self) -> datetime | None:
        return self.allocation.allocated_at if self.allocation else None


def gpu_map(host: GpuHost) -> list[GpuMapRow]:
    """Every GPU of the host by node id, with the live allocation holding it. Two queries."""
    live = (
        GpuAllocation.objects.filter(gpu__host=host, released_at__isnull=True)
        .select_related("instance", "instance__user")
    )
    by_gpu = {allocation.gpu_id: allocation for allocation in live}
    return [GpuMapRow(gpu=gpu, allocation=by_gpu.get(gpu.pk)) for gpu in host.gpus.order_by("node_id")]


def live_gpus_of(instance) -> list[Gpu]:
    """The GPUs an instance holds now, by node id (what a driver maps into its container)."""
    return list(
        Gpu.objects.filter(allocations__instance=instance, allocations__released_at__isnull=True)
        .select_related("host")
        .order_by("node_id")
    )


@dataclass(frozen=True)
class ImageAvailability:
    """Whether a catalogue image can start on a host in service.

    `state` is "ready" (a host in service has it), "preparing" (a build or pull for such a host is under
    way; `percent` says how far, when known), "missing" (every host in service that was looked at lacks
    it) or "unknown" (no host in service was ever looked at, so nothing is refused on that account).
    """

    state: str
    percent: int | None = None
    host_name: str = ""

    @property
    def launchable(self) -> bool:
        return self.state in ("ready", "unknown")


def in_service_hosts() -> QuerySet:
    """Hosts that take new placements."""
    return GpuHost.objects.filter(state=GpuHost.State.ACTIVE)


def image_availability(references) -> dict[str, ImageAvailability]:
    """Availability of each Docker reference in `references` on the hosts in service. Two queries."""
    references = list(references)
    seen = {}
    for reference, present in HostImage.objects.filter(
        host__state=GpuHost.State.ACTIVE, reference__in=references
    ).values_list("reference", "present"):
        seen[reference] = seen.get(reference, False) or present
    jobs = {}
    for job in ImageJob.objects.filter(
        host__state=GpuHost.State.ACTIVE, reference__in=references, state__in=ImageJob.ACTIVE_STATES
    ).select_related("host"):
        jobs.setdefault(job.reference, job)
    availability = {}
    for reference in references:
        if seen.get(reference):
            availability[reference] = ImageAvailability("ready")
        elif reference in jobs:
            job = jobs[reference]
            availability[reference] = ImageAvailability("preparing", percent=job.percent, host_name=job.host.name)
        elif reference in seen:
            availability[reference] = ImageAvailability("missing")
        else:
            availability[reference] = ImageAvailability("unknown")
    return availability


@dataclass(frozen=True)
class HostsInService:
    any: bool
    simulated: bool


def hosts_in_service_summary() -> HostsInService:
    """Whether any host is in service, and whether one of those has simulated GPUs. One query."""
    kinds = set(in_service_hosts().order_by().values_list("is_simulated", flat=True).distinct())
    return HostsInService(any=bool(kinds), simulated=True in kinds)


def simulated_hosts_in_service() -> bool:
    """True when a host in service has simulated GPUs (what `make run` registers on a machine without any)."""
    return in_service_hosts().filter(is_simulated=True).exists()


@dataclass(frozen=True)
class DiskLimitsNote:
    """What the host page and registration say about the host's disk limits: `ok` False when its engine
    cannot enforce one of them (or was never asked), and the words."""

    ok: bool
    text: str


def disk_limits_note(host: GpuHost, *, policy: str) -> DiskLimitsNote:
    """Whether `host`'s engine enforces the workspace and writable-layer limits, as of its last check, and
    what that means under `policy` (settings.DEVCLOUD_DISK_LIMITS: "enforce" or "warn")."""
    if host.can_limit_workspaces is None or host.can_limit_writable_layers is None:
        why = f" ({host.disk_limits_reason})" if host.disk_limits_reason else ""
        return DiskLimitsNote(
            ok=False,
            text=f"Not known whether its engine can enforce disk limits{why}: run \"Check the Docker engine "
            "connection\" once it answers.",
        )
    storage = f" ({host.engine_storage})" if host.engine_storage else ""
    missing = [
        what
        for what, can in (
            ("workspace volumes", host.can_limit_workspaces),
            ("containers' writable layers", host.can_limit_writable_layers),
        )
        if not can
    ]
    if not missing:
        return DiskLimitsNote(
            ok=True,
            text=f"Its engine{storage} enforces both disk limits: the size of workspace volumes and of "
            "containers' writable layers.",
        )
    cannot = f"Its engine{storage} cannot limit the size of {' or '.join(missing)}"
    if host.disk_limits_reason:
        cannot += f" ({host.disk_limits_reason})"
    fix = 'give its engine a data root on XFS mounted with pquota (docs/architecture.md, "Disk limits")'
    if policy == "warn":
        return DiskLimitsNote(
            ok=False,
            text=f"{cannot}. With DEVCLOUD_DISK_LIMITS=warn, instances there run without that limit, so one "
            f"of them can fill the host's disk; to enforce it, {fix}.",
        )
    return DiskLimitsNote(
        ok=False,
        text=f"{cannot}. With DEVCLOUD_DISK_LIMITS=enforce, launches on this host will be refused: {fix}, "
        "or set DEVCLOUD_DISK_LIMITS=warn to run instances there without the limit.",
    )
