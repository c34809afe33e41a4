"""Reads about GPU hosts: capacity per host, and which instance holds which GPU."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, FilteredRelation, Q, QuerySet

from .models import Gpu, GpuAllocation, GpuHost


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
