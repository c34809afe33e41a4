"""GPU efficiency: how much of the GPU-time an instance was billed for its GPUs were busy.

The idle culler reads each running instance's GPU utilisation every IDLE_CULL_SECONDS (one number per
instance: above IDLE_GPU_BUSY_PERCENT on any of its GPUs is busy). gpu_samples_record adds the time since
the previous reading, capped at MAX_SAMPLE_GAP_INTERVALS intervals, times the instance's GPU count, to
`gpu_seconds_sampled`, and to `gpu_seconds_busy` when the reading was busy. The busy share of the
sampled time is then applied to what the instance was charged: idle credit = charged × (1 − busy share).

An instance with no reading at all (the local and fake drivers, a host whose engine does not answer,
instances the culler skips because their size is never culled) is "not measured", never idle.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import BigIntegerField, Case, Count, F, Q, Sum, Value, When
from django.db.models.functions import Coalesce

from .models import Instance
from .sizes import SIZES

# The windows the reports offer, in days; the first is the default.
REPORT_WINDOW_DAYS = (30, 7, 90)

# A reading counts the time since the previous one, but no more than this many culler intervals: a
# missed round (a slow worker, a restart) must not count an hour as busy or idle on one reading.
MAX_SAMPLE_GAP_INTERVALS = 2


def gpu_samples_record(*, readings: dict, instances: list, now: datetime) -> int:
    """Add one culler round's readings to the instances' sampled and busy GPU-seconds, in one UPDATE.

    `readings` maps instance id -> True (GPUs busy) or False (idle); instances without an entry had no
    reading and are left alone. `instances` are the rows the culler loaded (their `gpu_sampled_at`,
    `ready_at` and `size` as read). A row another round updated meanwhile is not counted twice: each row
    is claimed by the `gpu_sampled_at` this round read. Returns the number of rows updated.
    """
    cap = timedelta(seconds=settings.IDLE_CULL_SECONDS * MAX_SAMPLE_GAP_INTERVALS)
    claims = Q(pk__in=[])
    sampled, busy = [], []
    for instance in instances:
        if instance.id not in readings:
            continue
        since = instance.gpu_sampled_at or instance.ready_at or now
        gap = min(max(now - since, timedelta(0)), cap)
        gpu_seconds = int(gap.total_seconds()) * SIZES[instance.size].gpus
        claims |= Q(pk=instance.id, gpu_sampled_at=instance.gpu_sampled_at)
        sampled.append(When(pk=instance.id, then=Value(gpu_seconds, output_field=BigIntegerField())))
        if readings[instance.id]:
            busy.append(When(pk=instance.id, then=Value(gpu_seconds, output_field=BigIntegerField())))
    if not sampled:
        return 0
    zero = Value(0, output_field=BigIntegerField())
    return Instance.objects.filter(claims).update(
        gpu_seconds_sampled=F("gpu_seconds_sampled") + Case(*sampled, default=zero),
        gpu_seconds_busy=F("gpu_seconds_busy") + (Case(*busy, default=zero) if busy else zero),
        gpu_sampled_at=now,
    )


def _hours(gpu_seconds: int) -> str:
    return f"{gpu_seconds / 3600:,.2f}"


def report_window_days(value) -> int:
    """The window a report's ?days= asks for, when it is one of REPORT_WINDOW_DAYS; else the default."""
    return int(value) if str(value) in {str(days) for days in REPORT_WINDOW_DAYS} else REPORT_WINDOW_DAYS[0]


@dataclass(frozen=True)
class Efficiency:
    """GPU use against what was charged, for one instance or a group of them. GPU-seconds throughout."""

    charged: int
    # Charged to instances with GPU readings, and the part of it estimated idle.
    measured_charged: int
    idle_charged: int
    # Charged to instances with no reading: neither busy nor idle.
    unmeasured_charged: int
    instances: int = 1

    @property
    def busy_charged(self) -> int:
        return self.measured_charged - self.idle_charged

    @property
    def charged_hours(self) -> str:
        return _hours(self.charged)

    @property
    def idle_hours(self) -> str:
        return _hours(self.idle_charged)

    @property
    def measured_hours(self) -> str:
        return _hours(self.measured_charged)

    @property
    def unmeasured_hours(self) -> str:
        return _hours(self.unmeasured_charged)

    @property
    def idle_percent(self) -> int | None:
        """Share of the measured charge that was idle, in whole percent; None when nothing was measured."""
        if not self.measured_charged:
            return None
        return round(100 * self.idle_charged / self.measured_charged)


def instance_efficiency(instance: Instance) -> dict | None:
    """What the instance page shows: busy percent of the measured time, and GPU-hours billed and idle.

    Returns None when the culler never had a reading for it (not measured)."""
    if not instance.gpu_seconds_sampled:
        return None
    busy_share = instance.gpu_seconds_busy / instance.gpu_seconds_sampled
    idle = round(instance.charged_gpu_seconds * (1 - busy_share))
    return {
        "busy_percent": round(100 * busy_share),
        "billed_gpu_hours": f"{instance.charged_gpu_seconds / 3600:.1f}",
        "idle_gpu_hours": f"{idle / 3600:.1f}",
        "idle_gpu_seconds": idle,
    }


def _idle_charged_expression():
    """Per row: charged × (sampled − busy) / sampled for measured instances, else 0 (integer division)."""
    return Case(
        When(
            gpu_seconds_sampled__gt=0,
            then=F("charged_gpu_seconds")
            * (F("gpu_seconds_sampled") - F("gpu_seconds_busy"))
            / F("gpu_seconds_sampled"),
        ),
        default=Value(0, output_field=BigIntegerField()),
        output_field=BigIntegerField(),
    )


def _sums():
    zero = Value(0, output_field=BigIntegerField())
    return {
        "charged": Coalesce(Sum("charged_gpu_seconds"), zero),
        "measured_charged": Coalesce(
            Sum(Case(When(gpu_seconds_sampled__gt=0, then=F("charged_gpu_seconds")), default=zero)), zero
        ),
        "idle_charged": Coalesce(Sum(_idle_charged_expression()), zero),
        "unmeasured_charged": Coalesce(
            Sum(Case(When(gpu_seconds_sampled=0, then=F("charged_gpu_seconds")), default=zero)), zero
        ),
    }


def billed_in_window(queryset, *, start: datetime):
    """The instances of `queryset` that ran during the window from `start`: still running, or stopped
    since. Each counts with everything it was charged (an instance is not split at the window's edge)."""
    return queryset.filter(ready_at__isnull=False).filter(
        Q(stopped_at__isnull=True) | Q(stopped_at__gte=start)
    )


def efficiency_total(instances) -> Efficiency:
    """The Efficiency of all of `instances` (a queryset) together, in one query."""
    row = instances.aggregate(**_sums(), count=Count("pk"))
    return Efficiency(instances=row.pop("count"), **row)


def efficiency_by(instances, *, field: str, label: str) -> list[tuple[str, Efficiency]]:
    """(label, Efficiency) per value of `field` (e.g. "image__name"), most idle credit first, in one
    query. A null value (a personal instance's project) is labelled `label`."""
    rows = (
        instances.order_by()
        .values(field)
        .annotate(**_sums(), count=Count("pk"))
        .order_by("-idle_charged", "-charged", field)
    )
    return [
        (
            str(row[field]) if row[field] is not None else label,
            Efficiency(
                charged=row["charged"],
                measured_charged=row["measured_charged"],
                idle_charged=row["idle_charged"],
                unmeasured_charged=row["unmeasured_charged"],
                instances=row["count"],
            ),
        )
        for row in rows
    ]


def efficiency_per_instance(instances, *, limit: int) -> list[tuple[Instance, Efficiency]]:
    """(instance, its Efficiency) for the `limit` of `instances` with the most idle credit (then the most
    charged), in one query."""
    rows = instances.select_related("image").annotate(idle_charged=_idle_charged_expression())
    return [
        (
            instance,
            Efficiency(
                charged=instance.charged_gpu_seconds,
                measured_charged=instance.charged_gpu_seconds if instance.gpu_seconds_sampled else 0,
                idle_charged=instance.idle_charged,
                unmeasured_charged=0 if instance.gpu_seconds_sampled else instance.charged_gpu_seconds,
            ),
        )
        for instance in rows.order_by("-idle_charged", "-charged_gpu_seconds", "-created_at")[:limit]
    ]
