"""The open-source CI programme: owners apply, operators approve a monthly GPU-hour grant to the project's
pool (or reject with a reason), and beat renews every grant on a fixed day of the month.

The rules (docs/architecture.md, "The open-source CI programme"):

* A period runs from one renewal day (settings.CI_GRANT_RENEWAL_DAY, 00:00 UTC) to the next and is
  named by the month it starts in, e.g. "2026-12".
* Each period's grant is one GRANT entry on the pool, key "ci-grant:<project id>:<period>". Approval
  posts the current period's at once; renewal posts the next one's.
* The grant is spent first. At renewal, what is left of the previous period's grant (its amount minus
  the pool's usage since it, net of reversals; never more than the balance) expires: one EXPIRY entry,
  key "ci-grant-expiry:<project id>:<period>". Hours added to the pool otherwise stay.
* An ended grant (an operator's decision) renews no more: its period's leftover still expires on the
  renewal day.

Every change of a project's grant runs under the pool's CreditAccount row lock (the lock metering and
launches take; a project's grant takes no other account), and re-reads the project after taking it, so
two renewals, or a renewal and an approval, serialise and the second finds the work done. The ledger's
idempotency keys make a repeat a no-op even without that.
"""

from datetime import UTC, datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from portal.audit.services import audit_record
from portal.credits.models import GPU_SECONDS_PER_HOUR, CreditAccount, LedgerEntry, hours
from portal.credits.services import ledger_post
from portal.notifications.services import notify_ci_grant_decided

from .models import CIGrantApplication, Project, ProjectMembership
from .services import _require_owner

Status = CIGrantApplication.Status
# Ledger kinds that are the pool's use of GPUs: usage (negative) and its reversals (positive).
USE_KINDS = (LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REVERSAL)


# --- Periods ---------------------------------------------------------------------------------------


def period_of(moment: datetime) -> str:
    """The name ("2026-12") of the grant period `moment` falls in: the month of the last renewal day at
    or before it, in UTC."""
    moment = moment.astimezone(UTC)
    year, month = moment.year, moment.month
    if moment.day < settings.CI_GRANT_RENEWAL_DAY:
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)
    return f"{year:04d}-{month:02d}"


def period_start(period: str) -> datetime:
    """When `period` ("2026-12") begins: its renewal day, 00:00 UTC."""
    year, month = (int(part) for part in period.split("-"))
    return datetime(year, month, settings.CI_GRANT_RENEWAL_DAY, tzinfo=UTC)


def period_end(period: str) -> datetime:
    """When `period` ends and the next begins: the grant's renewal date."""
    year, month = (int(part) for part in period.split("-"))
    year, month = (year, month + 1) if month < 12 else (year + 1, 1)
    return datetime(year, month, settings.CI_GRANT_RENEWAL_DAY, tzinfo=UTC)


def grant_key(project_id: int, period: str) -> str:
    return f"ci-grant:{project_id}:{period}"


def expiry_key(project_id: int, period: str) -> str:
    return f"ci-grant-expiry:{project_id}:{period}"


def default_gpu_seconds() -> int:
    return settings.CI_GRANT_DEFAULT_HOURS * GPU_SECONDS_PER_HOUR


def grant_used(entry: LedgerEntry) -> int:
    """GPU-seconds the pool used after the grant `entry` was posted (usage net of reversals, >= 0)."""
    net = (
        LedgerEntry.objects.filter(
            account_id=entry.account_id, id__gt=entry.id, kind__in=USE_KINDS
        ).aggregate(total=Sum("gpu_seconds"))["total"]
        or 0
    )
    return max(-net, 0)


# --- Applying --------------------------------------------------------------------------------------


def _check_https(url: str) -> str:
    url = (url or "").strip()
    try:
        URLValidator(schemes=["https"])(url)
    except ValidationError:
        raise ValidationError(
            "Give the repository's https:// address, e.g. https://github.com/vllm-project/vllm.",
            code="repository_url",
        ) from None
    return url


def ci_grant_apply(
    *, user, project: Project, repository_url: str, maintainers: str, purpose: str
) -> CIGrantApplication:
    """An owner applies for the programme for `project`. Returns the pending application.

    Raises Http404 for someone not in the project, PermissionDenied for a member who is not an owner,
    and ValidationError for a repository that is not an https URL, blank maintainers or purpose, a
    project already in the programme, or one with an application still pending.
    """
    _require_owner(user=user, project=project)
    repository_url = _check_https(repository_url)
    maintainers, purpose = (maintainers or "").strip(), (purpose or "").strip()
    if not maintainers:
        raise ValidationError("Name the maintainers (GitHub logins or email addresses).", code="maintainers")
    if not purpose:
        raise ValidationError("Say what the GPUs are for.", code="purpose")
    if Project.objects.filter(pk=project.pk, ci_grant_gpu_seconds__gt=0).exists():
        raise ValidationError(f"{project.name} is already in the CI programme.", code="in_programme")
    try:
        with transaction.atomic():
            return CIGrantApplication.objects.create(
                project=project,
                applicant=user,
                repository_url=repository_url,
                maintainers=maintainers,
                purpose=purpose,
            )
    except IntegrityError:
        raise ValidationError(
            f"{project.name} already has an application waiting for review.", code="open_application"
        ) from None


# --- Operators' decisions --------------------------------------------------------------------------


def _actor_name(actor) -> str:
    return (actor.get_full_name() or actor.email) if actor is not None else "system"


def _locked(application_id: int) -> tuple[CreditAccount, CIGrantApplication]:
    """Inside transaction.atomic(): lock the application's pool, then the application (house order:
    accounts first). Raises ValidationError when the application is no longer pending."""
    project_id = CIGrantApplication.objects.values_list("project_id", flat=True).get(pk=application_id)
    pool = CreditAccount.objects.select_for_update().get(project_id=project_id)
    application = (
        CIGrantApplication.objects.select_for_update(of=("self",))
        .select_related("project")
        .get(pk=application_id)
    )
    if application.status != Status.PENDING:
        raise ValidationError(f"This application was already {application.get_status_display().lower()}.")
    return pool, application


def _tell_owners(application: CIGrantApplication) -> None:
    owners = ProjectMembership.objects.filter(
        project_id=application.project_id, role=ProjectMembership.Role.OWNER
    ).select_related("user")
    for membership in owners:
        notify_ci_grant_decided(application=application, user=membership.user)


def ci_grant_approve(
    *, application_id: int, actor, gpu_seconds: int | None = None, reason: str = "", now=None
) -> CIGrantApplication:
    """Admit the application's project to the programme with `gpu_seconds` a period (default:
    CI_GRANT_DEFAULT_HOURS) and post this period's grant at once. Returns the application.

    Audited in the same transaction; the owners are told once it commits. Raises ValidationError for an
    application already decided or an amount that is not positive.
    """
    gpu_seconds = default_gpu_seconds() if gpu_seconds is None else gpu_seconds
    if gpu_seconds <= 0:
        raise ValidationError("Grant more than zero hours, or reject the application instead.")
    now = now or timezone.now()
    with transaction.atomic():
        pool, application = _locked(application_id)
        application.status = Status.APPROVED
        application.granted_gpu_seconds = gpu_seconds
        application.decided_at = now
        application.decided_by = actor
        application.decided_by_name = _actor_name(actor)
        application.decision_reason = (reason or "").strip()
        application.save()
        Project.objects.filter(pk=application.project_id).update(ci_grant_gpu_seconds=gpu_seconds)
        _renew_locked(pool=pool, project_id=application.project_id, now=now, actor=actor)
        audit_record(
            actor=actor,
            action="ci_grant.approve",
            target=application.project,
            reason=application.decision_reason or f"{hours(gpu_seconds)} GPU-hours a month",
            details={
                "project": application.project.slug,
                "application": application.pk,
                "repository_url": application.repository_url,
                "monthly_hours": hours(gpu_seconds),
            },
        )
        _tell_owners(application)
    return application


def ci_grant_reject(*, application_id: int, actor, reason: str) -> CIGrantApplication:
    """Reject a pending application with a reason the owners read. Returns it.

    Audited in the same transaction; the owners are told once it commits. Raises ValidationError for a
    blank reason or an application already decided.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Give the owners a reason for the rejection.")
    with transaction.atomic():
        _, application = _locked(application_id)
        application.status = Status.REJECTED
        application.decided_at = timezone.now()
        application.decided_by = actor
        application.decided_by_name = _actor_name(actor)
        application.decision_reason = reason
        application.save()
        audit_record(
            actor=actor,
            action="ci_grant.reject",
            target=application.project,
            reason=reason,
            details={
                "project": application.project.slug,
                "application": application.pk,
                "repository_url": application.repository_url,
            },
        )
        _tell_owners(application)
    return application


def ci_grant_end(*, project_id: int, actor, reason: str) -> Project:
    """End a project's grant: it renews no more (this period's leftover still expires on the renewal
    day). Returns the project. Audited in the same transaction.

    Raises ValidationError for a blank reason or a project whose grant is not running.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Say why the grant ends; it is recorded in the audit log.")
    with transaction.atomic():
        CreditAccount.objects.select_for_update().get(project_id=project_id)
        project = Project.objects.get(pk=project_id)
        if project.ci_grant_gpu_seconds == 0:
            raise ValidationError(f"{project.name} has no CI programme grant to end.")
        ended = project.ci_grant_gpu_seconds
        Project.objects.filter(pk=project_id).update(ci_grant_gpu_seconds=0)
        project.ci_grant_gpu_seconds = 0
        audit_record(
            actor=actor,
            action="ci_grant.end",
            target=project,
            reason=reason,
            details={
                "project": project.slug,
                "monthly_hours": hours(ended),
                "period": project.ci_grant_period,
            },
        )
    return project


# --- Renewal ---------------------------------------------------------------------------------------


def _renew_locked(*, pool: CreditAccount, project_id: int, now: datetime, actor=None) -> bool:
    """With the pool locked: expire the leftover of the grant on it if its period is over, and post the
    current period's grant if the project is in the programme. Returns whether anything was due."""
    period = period_of(now)
    # Read under the lock: a renewal that held it before us has committed its period by now.
    project = Project.objects.get(pk=project_id)
    if project.ci_grant_period >= period or (
        not project.ci_grant_period and not project.ci_grant_gpu_seconds
    ):
        # Done already, or a worker whose clock is behind the one that renewed ("2026-12" < "2027-01").
        return False
    if project.ci_grant_period:
        previous = LedgerEntry.objects.filter(
            idempotency_key=grant_key(project_id, project.ci_grant_period)
        ).first()
        if previous is not None:
            pool.refresh_from_db(fields=["balance_gpu_seconds"])
            left = max(previous.gpu_seconds - grant_used(previous), 0)
            expiring = min(left, max(pool.balance_gpu_seconds, 0))
            if expiring:
                ledger_post(
                    account=pool,
                    kind=LedgerEntry.Kind.EXPIRY,
                    gpu_seconds=-expiring,
                    idempotency_key=expiry_key(project_id, project.ci_grant_period),
                    reason=f"CI programme: the unused grant of {project.ci_grant_period} expired",
                )
    if project.ci_grant_gpu_seconds:
        ledger_post(
            account=pool,
            kind=LedgerEntry.Kind.GRANT,
            gpu_seconds=project.ci_grant_gpu_seconds,
            idempotency_key=grant_key(project_id, period),
            reason=f"CI programme: grant for {period} (renews {period_end(period):%Y-%m-%d})",
            actor=actor,
        )
    Project.objects.filter(pk=project_id).update(
        ci_grant_period=period if project.ci_grant_gpu_seconds else ""
    )
    return True


def ci_grant_renew(*, project_id: int, now: datetime | None = None) -> bool:
    """Renew one project's grant if its period is over (see the module's rules). Returns whether anything
    was due; running it again, or at once on another worker, changes nothing more."""
    now = now or timezone.now()
    with transaction.atomic():
        pool = CreditAccount.objects.select_for_update().get(project_id=project_id)
        return _renew_locked(pool=pool, project_id=project_id, now=now)


def ci_grants_due(now: datetime | None = None) -> list[int]:
    """Ids of the projects whose grant has a period to close or a new one to post."""
    period = period_of(now or timezone.now())
    in_programme = Project.objects.filter(ci_grant_gpu_seconds__gt=0) | Project.objects.exclude(
        ci_grant_period=""
    )
    return list(in_programme.exclude(ci_grant_period=period).order_by("id").values_list("id", flat=True))


def ci_grants_renew(*, now: datetime | None = None) -> int:
    """Renew every grant that is due, each project in its own transaction. Returns how many were."""
    now = now or timezone.now()
    return sum(ci_grant_renew(project_id=project_id, now=now) for project_id in ci_grants_due(now))
