"""Reads for project pages and the API. Nothing here writes.

Every read of a project goes through the caller's membership: a project someone is not in is a 404,
exactly like one that does not exist.
"""

from dataclasses import dataclass, field
from datetime import date, datetime

from django.db.models import F, Sum
from django.db.models.functions import TruncDate
from django.http import Http404
from django.utils import timezone

from portal.credits.models import CreditAccount, LedgerEntry, hours
from portal.instances.models import Instance

from . import ci_grants
from .models import CIGrantApplication, Project, ProjectInvitation, ProjectMembership

Role = ProjectMembership.Role


def projects_of(user) -> list[Project]:
    """The user's projects, by slug, each with `my_role`, and `balance_gpu_seconds` and `balance_hours`
    (its pool)."""
    if not getattr(user, "is_authenticated", False):
        return []
    rows = (
        Project.objects.filter(memberships__user=user)
        .annotate(
            my_role=F("memberships__role"), balance_gpu_seconds=F("credit_account__balance_gpu_seconds")
        )
        .order_by("slug")
    )
    found = list(rows)
    for project in found:
        project.balance_hours = hours(project.balance_gpu_seconds or 0)
    return found


def project_of_member(user, slug: str) -> Project:
    """The project `slug` if `user` is in it, with `my_role` and `pool` (its CreditAccount) set. Raises
    Http404 otherwise, whether or not it exists."""
    membership = (
        ProjectMembership.objects.select_related("project")
        .filter(project__slug=slug, user_id=user.pk)
        .first()
        if getattr(user, "is_authenticated", False)
        else None
    )
    if membership is None:
        raise Http404("No such project.")
    project = membership.project
    project.my_role = membership.role
    project.pool = CreditAccount.objects.filter(project=project).first()
    return project


def is_owner(project: Project) -> bool:
    """Whether the caller project_of_member read it for is an owner."""
    return getattr(project, "my_role", None) == Role.OWNER


def members_of(project: Project) -> list[ProjectMembership]:
    """The project's people, oldest first; its bot account (robot tokens, CI sign-in) is not one."""
    return list(
        project.memberships.select_related("user").filter(user__project_bot=False).order_by("created_at", "id")
    )


def pending_invitations(project: Project) -> list[ProjectInvitation]:
    """Open invitations that have not expired, newest first."""
    return list(
        project.invitations.filter(
            accepted_at=None, declined_at=None, revoked_at=None, expires_at__gt=timezone.now()
        ).order_by("-created_at")
    )


def live_instances_of(project: Project) -> list[Instance]:
    """The project's live instances, newest first, with who launched them."""
    return list(
        Instance.objects.filter(project=project, state__in=Instance.LIVE_STATES)
        .select_related("user", "image")
        .order_by("-created_at")
    )


@dataclass
class ProjectUsage:
    """GPU-seconds the pool paid (usage net of reversals) since `since`, per member and per UTC day."""

    since: datetime | None
    # [(user id, email, GPU-seconds)], most first
    by_member: list = field(default_factory=list)
    # [(date, GPU-seconds)], oldest first
    by_day: list = field(default_factory=list)
    # [(date, email, GPU-seconds)], by day then member
    by_day_and_member: list = field(default_factory=list)
    total: int = 0


def project_usage(project: Project, *, since: datetime | None = None) -> ProjectUsage:
    """What the project's pool paid for, by member and by day, from its ledger's usage entries (each
    names its instance, and so who launched it). Usage written before entries named their instance
    counts under no member."""
    entries = LedgerEntry.objects.filter(
        account__project=project, kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REVERSAL]
    )
    if since is not None:
        entries = entries.filter(created_at__gte=since)
    usage = ProjectUsage(since=since)
    rows = (
        entries.annotate(day=TruncDate("created_at"))
        .values("day", "instance__user_id", "instance__user__email")
        .annotate(spent=Sum("gpu_seconds"))
        .order_by("day", "instance__user__email")
    )
    members: dict = {}
    days: dict[date, int] = {}
    for row in rows:
        spent = -row["spent"]
        key = (row["instance__user_id"], row["instance__user__email"] or "(unknown)")
        members[key] = members.get(key, 0) + spent
        days[row["day"]] = days.get(row["day"], 0) + spent
        usage.by_day_and_member.append((row["day"], key[1], spent))
        usage.total += spent
    usage.by_member = sorted(
        ((uid, email, spent) for (uid, email), spent in members.items()), key=lambda r: -r[2]
    )
    usage.by_day = sorted(days.items())
    return usage


def project_or_none(user, slug: str) -> Project | None:
    """project_of_member, or None instead of Http404 (after a member left)."""
    try:
        return project_of_member(user, slug)
    except Http404:
        return None


# --- The open-source CI programme --------------------------------------------------------------------


@dataclass
class CIGrantUse:
    """A project's grant this period: the monthly amount, what the pool used of it since it was posted
    (usage net of reversals; the grant is spent first) and what is left, and when it renews. All
    GPU-seconds; `granted` is 0 when no grant is on the pool."""

    project: Project
    period: str
    monthly: int
    granted: int
    used: int
    left: int
    renews_at: datetime
    # Whether the grant renews then (False once an operator ended it).
    renews: bool

    @property
    def monthly_hours(self) -> str:
        return hours(self.monthly)

    @property
    def granted_hours(self) -> str:
        return hours(self.granted)

    @property
    def used_hours(self) -> str:
        return hours(min(self.used, self.granted))

    @property
    def left_hours(self) -> str:
        return hours(self.left)


def ci_grant_use(project: Project) -> CIGrantUse | None:
    """The project's CI programme grant on its pool now (CIGrantUse); None when it has none."""
    if not project.ci_grant_period:
        return None
    entry = LedgerEntry.objects.filter(
        idempotency_key=ci_grants.grant_key(project.pk, project.ci_grant_period)
    ).first()
    granted = entry.gpu_seconds if entry else 0
    used = ci_grants.grant_used(entry) if entry else 0
    return CIGrantUse(
        project=project,
        period=project.ci_grant_period,
        monthly=project.ci_grant_gpu_seconds,
        granted=granted,
        used=used,
        left=max(granted - used, 0),
        renews_at=ci_grants.period_end(project.ci_grant_period),
        renews=project.ci_grant_gpu_seconds > 0,
    )


def ci_programme() -> list[CIGrantUse]:
    """Every project with a CI programme grant on its pool, by slug, with its use this period."""
    projects = Project.objects.exclude(ci_grant_period="").order_by("slug")
    return [use for use in (ci_grant_use(project) for project in projects) if use is not None]


def ci_grant_application_of(project: Project) -> CIGrantApplication | None:
    """The project's latest CI programme application, or None."""
    return project.ci_grant_applications.order_by("-created_at", "-id").first()
