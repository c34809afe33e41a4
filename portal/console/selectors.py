"""Reads for the console: the audit log, the fleet now, and the dashboard's series. Nothing here writes.

Series are computed with date-truncated aggregate queries, so a range costs a few grouped queries
whatever the number of users or entries; missing buckets are filled in Python.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import (
    Avg,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Trunc
from django.utils import timezone
from social_django.models import UserSocialAuth

from portal.accounts.models import User
from portal.audit.models import AuditEntry
from portal.credits.models import LedgerEntry
from portal.instances.models import Instance
from provisioning.models import Gpu, GpuAllocation, GpuHost

from .models import CapacitySample
from .timeranges import TimeRange, buckets

# --- audit log ----------------------------------------------------------------------------------------


def audit_entries(
    *, query: str = "", action: str = "", start: datetime | None = None, end: datetime | None = None
) -> QuerySet[AuditEntry]:
    """Audit entries, newest first, matching every given filter.

    `query` matches (case-insensitively, anywhere) the actor's recorded name, the action code, the
    target's type, id or description, and the reason. `start` is inclusive, `end` exclusive.
    """
    entries = AuditEntry.objects.all()
    query = query.strip()
    if query:
        entries = entries.filter(
            Q(actor_name__icontains=query)
            | Q(action__icontains=query)
            | Q(target_type__icontains=query)
            | Q(target_id__iexact=query)
            | Q(target_repr__icontains=query)
            | Q(reason__icontains=query)
        )
    if action:
        entries = entries.filter(action=action)
    if start is not None:
        entries = entries.filter(created_at__gte=start)
    if end is not None:
        entries = entries.filter(created_at__lt=end)
    return entries.order_by("-created_at", "-id")


def audit_actions_used() -> list[str]:
    """Every action code that appears in the log, sorted."""
    return sorted(AuditEntry.objects.values_list("action", flat=True).distinct().order_by())


def audit_for_target(target, *, limit: int = 50) -> QuerySet[AuditEntry]:
    """The latest entries about one model instance (e.g. for a user's or host's admin page), newest first."""
    return AuditEntry.objects.filter(target_type=target._meta.label_lower, target_id=str(target.pk))[:limit]


# --- the fleet now ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    gpus_total: int
    gpus_allocated: int
    queue_length: int
    oldest_queued_wait_seconds: int
    running_instances: int


def fleet_now(*, now: datetime | None = None) -> Fleet:
    """GPUs in service and held, the launch queue and running instances at this moment.

    GPUs in service are the present GPUs of hosts that are not retired; allocated ones are those of them
    with a live allocation (released_at null), so allocated never exceeds total.
    """
    now = now or timezone.now()
    in_service = Gpu.objects.filter(is_present=True).exclude(host__state=GpuHost.State.RETIRED)
    queue = Instance.objects.filter(state=Instance.State.QUEUED).aggregate(
        length=Count("id"), oldest=Min("created_at")
    )
    oldest_wait = (now - queue["oldest"]).total_seconds() if queue["oldest"] else 0
    return Fleet(
        gpus_total=in_service.count(),
        gpus_allocated=GpuAllocation.objects.filter(released_at__isnull=True, gpu__in=in_service).count(),
        queue_length=queue["length"],
        oldest_queued_wait_seconds=max(int(oldest_wait), 0),
        running_instances=Instance.objects.filter(state=Instance.State.RUNNING).count(),
    )


# --- dashboard series ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityPoint:
    at: datetime
    gpus_total: float
    gpus_allocated: float
    peak_allocated: int
    queue_length: int
    oldest_queued_wait_seconds: int


def capacity_series(time_range: TimeRange) -> list[CapacityPoint]:
    """Samples in the range, one point per time_range.sample_bucket, oldest first.

    GPU counts are averaged over the bucket, with the most allocated at once as `peak_allocated`; the
    queue's length and wait are its worst moment.
    Buckets without a sample are left out (the chart shows a gap rather than inventing zeros).
    """
    rows = (
        CapacitySample.objects.filter(taken_at__gte=time_range.start, taken_at__lt=time_range.end)
        .annotate(bucket=Trunc("taken_at", time_range.sample_bucket))
        .values("bucket")
        .annotate(
            total=Avg("gpus_total"),
            allocated=Avg("gpus_allocated"),
            peak=Max("gpus_allocated"),
            queue=Max("queue_length"),
            wait=Max("oldest_queued_wait_seconds"),
        )
        .order_by("bucket")
    )
    return [
        CapacityPoint(
            row["bucket"],
            float(row["total"]),
            float(row["allocated"]),
            row["peak"],
            row["queue"],
            row["wait"],
        )
        for row in rows
    ]


def _filled(time_range: TimeRange, bucket: str, totals: dict) -> list[tuple[datetime, int]]:
    return [(start, totals.get(start, 0)) for start in buckets(time_range, bucket)]


@dataclass(frozen=True)
class CreditFlow:
    """GPU-seconds per bucket: `burned` by usage (positive numbers), `granted` by grants and bonuses."""

    bucket: str
    burned: list[tuple[datetime, int]]
    granted: list[tuple[datetime, int]]


def credit_flow(time_range: TimeRange) -> CreditFlow:
    bucket = time_range.period_bucket
    rows = (
        LedgerEntry.objects.filter(
            created_at__gte=time_range.start,
            created_at__lt=time_range.end,
            kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.GRANT, LedgerEntry.Kind.BONUS],
        )
        .annotate(bucket=Trunc("created_at", bucket))
        .values("bucket", "kind")
        .annotate(total=Sum("gpu_seconds"))
        .order_by()
    )
    burned, granted = {}, {}
    for row in rows:
        if row["kind"] == LedgerEntry.Kind.USAGE:
            # Usage entries are negative: they spend credit.
            burned[row["bucket"]] = burned.get(row["bucket"], 0) - row["total"]
        else:
            granted[row["bucket"]] = granted.get(row["bucket"], 0) + row["total"]
    return CreditFlow(bucket, _filled(time_range, bucket, burned), _filled(time_range, bucket, granted))


@dataclass(frozen=True)
class Signups:
    bucket: str
    by_email: list[tuple[datetime, int]]
    by_github: list[tuple[datetime, int]]


def signups(time_range: TimeRange) -> Signups:
    """Accounts created per bucket, split by whether the account has a GitHub login. A project's CI bot
    account (portal/api/robots.py) is nobody signing up and is left out."""
    bucket = time_range.period_bucket
    rows = (
        User.objects.filter(date_joined__gte=time_range.start, date_joined__lt=time_range.end, project_bot=False)
        .annotate(
            bucket=Trunc("date_joined", bucket),
            github=Exists(UserSocialAuth.objects.filter(user=OuterRef("pk"), provider="github")),
        )
        .values("bucket", "github")
        .annotate(count=Count("id"))
        .order_by()
    )
    email, github = {}, {}
    for row in rows:
        (github if row["github"] else email)[row["bucket"]] = row["count"]
    return Signups(bucket, _filled(time_range, bucket, email), _filled(time_range, bucket, github))


@dataclass(frozen=True)
class QueueWait:
    at: datetime
    launches: int
    average_seconds: float
    longest_seconds: float


def queue_waits(time_range: TimeRange) -> tuple[str, list[QueueWait]]:
    """How long launches requested in each bucket waited in the queue: from created_at to their first GPU.

    The first allocation, not provisioning_at, marks the end of the wait: provisioning_at is set on the
    first attempt and kept when a launch goes back to the queue for lack of GPUs. Launches that never got
    GPUs are left out (the capacity samples show the queue as it stands). Returns (bucket, waits).
    """
    bucket = time_range.period_bucket
    first_gpu = (
        GpuAllocation.objects.filter(instance=OuterRef("pk"))
        .order_by("allocated_at")
        .values("allocated_at")[:1]
    )
    rows = (
        Instance.objects.filter(created_at__gte=time_range.start, created_at__lt=time_range.end)
        .annotate(first_gpu_at=Subquery(first_gpu))
        .filter(first_gpu_at__isnull=False)
        .annotate(
            bucket=Trunc("created_at", bucket),
            wait=ExpressionWrapper(F("first_gpu_at") - F("created_at"), output_field=DurationField()),
        )
        .values("bucket")
        .annotate(launches=Count("id"), average=Avg("wait"), longest=Max("wait"))
        .order_by("bucket")
    )
    found = {row["bucket"]: row for row in rows}
    waits = []
    for start in buckets(time_range, bucket):
        row = found.get(start)
        if row is None:
            waits.append(QueueWait(start, 0, 0.0, 0.0))
        else:
            waits.append(
                QueueWait(start, row["launches"], _seconds(row["average"]), _seconds(row["longest"]))
            )
    return bucket, waits


def _seconds(value) -> float:
    # PostgreSQL returns intervals as timedelta; SQLite returns the average as microseconds.
    if isinstance(value, timedelta):
        return max(value.total_seconds(), 0.0)
    return max(float(value or 0) / 1_000_000, 0.0)


@dataclass(frozen=True)
class Burner:
    user_id: int
    email: str
    gpu_seconds: int


def top_burners(time_range: TimeRange, *, limit: int = 10) -> list[Burner]:
    """The users who burned the most GPU-seconds of their own credit in the range, most first (projects'
    pools, which have no user, are not among them)."""
    rows = (
        LedgerEntry.objects.filter(
            created_at__gte=time_range.start,
            created_at__lt=time_range.end,
            kind=LedgerEntry.Kind.USAGE,
            account__user__isnull=False,
        )
        .values("account__user_id", "account__user__email")
        .annotate(spent=Sum("gpu_seconds"))
        .order_by("spent", "account__user_id")[:limit]
    )
    return [
        Burner(row["account__user_id"], row["account__user__email"], -row["spent"])
        for row in rows
        if row["spent"] < 0
    ]


# --- what keeps everyone from launching ----------------------------------------------------------------


@dataclass(frozen=True)
class LaunchBlocker:
    """A reason launches cannot go ahead that only an operator can remove: what is wrong, what to do, and
    the console page where it is done."""

    problem: str
    fix: str
    url: str


def launch_blockers() -> list[LaunchBlocker]:
    """Every operator-side reason a launch cannot go ahead now, most basic first. A few queries."""
    from django.urls import reverse

    from portal.instances.models import Image
    from provisioning.selectors import image_availability, in_service_hosts

    hosts_url = reverse("admin:provisioning_gpuhost_changelist")
    images_url = reverse("admin:instances_image_changelist")
    blockers = []
    images = list(Image.objects.filter(is_enabled=True))
    if not images:
        blockers.append(
            LaunchBlocker(
                problem="No image is enabled, so nobody can launch.",
                fix="Load the catalogue with `manage.py sync_images`, then enable an image.",
                url=images_url,
            )
        )
    if not in_service_hosts().exists():
        blockers.append(
            LaunchBlocker(
                problem="No GPU host is in service, so launches wait in the queue.",
                fix="Add a GPU host, or reactivate a drained one.",
                url=hosts_url,
            )
        )
    availability = image_availability(image.reference for image in images)
    for image in images:
        if availability[image.reference].state == "missing":
            blockers.append(
                LaunchBlocker(
                    problem=f"The {image.name} image ({image.reference}) is on no GPU host in service, so "
                    "its launches are refused.",
                    fix="Build or pre-pull it from a host's page, or switch the image off in the catalogue.",
                    url=hosts_url,
                )
            )
    return blockers
