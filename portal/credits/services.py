"""Operations that change credits. Every one runs in a transaction, under row locks, with an idempotency key."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.accounts.models import email_fingerprint

from .models import (
    GPU_SECONDS_PER_HOUR,
    BonusApplication,
    BonusProgram,
    CreditAccount,
    GrantedIdentity,
    LedgerEntry,
    SignupGrantProgram,
)


def bonus_cap_gpu_seconds() -> int:
    return settings.BONUS_CAP_GPU_HOURS * GPU_SECONDS_PER_HOUR


def account_for(user) -> CreditAccount:
    account, _ = CreditAccount.objects.get_or_create(user=user)
    return account


def _actor_name(actor) -> str:
    if actor is None:
        return "system"
    return actor.get_full_name() or actor.email


def ledger_post(*, user, kind: str, gpu_seconds: int, idempotency_key: str, reason: str, actor=None) -> LedgerEntry:
    """Append one entry and move the balance with it. Returns the entry.

    Idempotent: posting the same key again returns the first entry and changes nothing.
    """
    if not reason:
        raise ValidationError("Every ledger entry needs a reason.")
    account_for(user)
    with transaction.atomic():
        account = CreditAccount.objects.select_for_update().get(user=user)
        # Read after taking the lock: a concurrent post with the same key has committed by now.
        existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
        account.balance_gpu_seconds += gpu_seconds
        entry = LedgerEntry.objects.create(
            account=account,
            kind=kind,
            gpu_seconds=gpu_seconds,
            balance_after=account.balance_gpu_seconds,
            idempotency_key=idempotency_key,
            reason=reason,
            actor=actor,
            actor_name=_actor_name(actor),
        )
        account.save(update_fields=["balance_gpu_seconds", "updated_at"])
        return entry


def current_signup_program():
    return SignupGrantProgram.objects.filter(is_active=True).order_by("-id").first()


def _identities(user) -> list[tuple[str, str]]:
    found = []
    if user.email_verified:
        found.append((GrantedIdentity.Kind.EMAIL, email_fingerprint(user.email)))
    for social in user.social_auth.filter(provider="github"):
        found.append((GrantedIdentity.Kind.GITHUB, str(social.uid)))
    return found


def credits_grant_signup(*, user) -> LedgerEntry | None:
    """Give the early-registrant grant if this person has not had it and the program has room.

    Returns the ledger entry, or None when nothing was granted (no verified identity, the program is
    closed or full, or one of the person's identities already collected it). Every verified identity
    of a person who got the grant is remembered, so none of them can collect it again.
    """
    identities = _identities(user)
    if not identities:
        return None
    with transaction.atomic():
        program = SignupGrantProgram.objects.select_for_update().filter(is_active=True).order_by("-id").first()
        if program is None:
            return None
        key = f"signup:{program.pk}:{user.pk}"
        already_here = LedgerEntry.objects.filter(idempotency_key=key).exists()
        known = {
            (kind, value)
            for kind, value in GrantedIdentity.objects.filter(program=program).filter(
                value__in=[value for _, value in identities]
            ).values_list("kind", "value")
        }
        if already_here or known:
            # Remember this person's other identities too, so a new account under any of them gets nothing.
            _remember(program, identities, known)
            return None
        if program.open_until is not None and timezone.now() >= program.open_until:
            return None
        if program.granted_count >= program.max_accounts:
            return None
        _remember(program, identities, known)
        SignupGrantProgram.objects.filter(pk=program.pk).update(granted_count=program.granted_count + 1)
        return ledger_post(
            user=user,
            kind=LedgerEntry.Kind.GRANT,
            gpu_seconds=program.gpu_seconds,
            idempotency_key=key,
            reason=program.name,
        )


def _remember(program, identities, known):
    for kind, value in identities:
        if (kind, value) not in known:
            GrantedIdentity.objects.get_or_create(program=program, kind=kind, value=value)


def credits_adjust(*, user, gpu_seconds: int, reason: str, actor, idempotency_key: str) -> LedgerEntry:
    """An operator's grant (positive) or correction (negative). Returns the entry."""
    if gpu_seconds == 0:
        raise ValidationError("An adjustment of zero changes nothing.")
    kind = LedgerEntry.Kind.GRANT if gpu_seconds > 0 else LedgerEntry.Kind.ADJUSTMENT
    return ledger_post(
        user=user, kind=kind, gpu_seconds=gpu_seconds, idempotency_key=idempotency_key, reason=reason, actor=actor
    )


def bonus_apply(*, user, program: BonusProgram, evidence: str) -> BonusApplication:
    """File an application for bonus hours. Raises ValidationError with a message the applicant can act on."""
    evidence = (evidence or "").strip()
    if not user.email_verified:
        raise ValidationError("Confirm your email address before applying for bonus hours.")
    if not program.is_active:
        raise ValidationError(f"{program.name} is not taking applications right now.")
    if not evidence:
        raise ValidationError(f"Enter your {program.evidence_label.lower()}.")
    account = account_for(user)
    if account.bonus_gpu_seconds >= bonus_cap_gpu_seconds():
        raise ValidationError(
            f"You already have the maximum of {settings.BONUS_CAP_GPU_HOURS} bonus GPU-hours across all programs."
        )
    try:
        with transaction.atomic():
            return BonusApplication.objects.create(user=user, program=program, evidence=evidence)
    except IntegrityError:
        raise ValidationError(f"You already have an application for {program.name}.") from None


def bonus_approve(*, application_id: int, actor, gpu_seconds: int | None = None, reason: str = "") -> BonusApplication:
    """Approve a pending application for `gpu_seconds` (default: the program's maximum).

    The grant is clamped to the program's maximum and to what is left under the per-person cap;
    `application.clamped` tells the operator. Raises ValidationError if the application was already decided.
    """
    if gpu_seconds is not None and gpu_seconds < 0:
        raise ValidationError("Hours to grant cannot be negative.")
    application = BonusApplication.objects.select_related("program", "user").get(pk=application_id)
    account_for(application.user)
    with transaction.atomic():
        # Lock order: account, then application. Every path that changes bonus hours follows it.
        account = CreditAccount.objects.select_for_update().get(user_id=application.user_id)
        application = BonusApplication.objects.select_for_update().select_related("program").get(pk=application_id)
        if application.status != BonusApplication.Status.PENDING:
            raise ValidationError(f"This application was already {application.get_status_display().lower()}.")
        requested = application.program.max_gpu_seconds if gpu_seconds is None else gpu_seconds
        room = max(bonus_cap_gpu_seconds() - account.bonus_gpu_seconds, 0)
        granted = min(requested, application.program.max_gpu_seconds, room)
        application.status = BonusApplication.Status.APPROVED
        application.requested_gpu_seconds = requested
        application.granted_gpu_seconds = granted
        application.decided_at = timezone.now()
        application.decided_by = actor
        application.decided_by_name = _actor_name(actor)
        application.decision_reason = reason
        application.save()
        if granted > 0:
            CreditAccount.objects.filter(pk=account.pk).update(bonus_gpu_seconds=account.bonus_gpu_seconds + granted)
            ledger_post(
                user=application.user,
                kind=LedgerEntry.Kind.BONUS,
                gpu_seconds=granted,
                idempotency_key=f"bonus:{application.pk}",
                reason=f"{application.program.name} approved",
                actor=actor,
            )
        return application


def bonus_reject(*, application_id: int, actor, reason: str) -> BonusApplication:
    """Reject a pending application. The reason is shown to the applicant; it is required."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Give the applicant a reason for the rejection.")
    with transaction.atomic():
        application = BonusApplication.objects.select_for_update().get(pk=application_id)
        if application.status != BonusApplication.Status.PENDING:
            raise ValidationError(f"This application was already {application.get_status_display().lower()}.")
        application.status = BonusApplication.Status.REJECTED
        application.decided_at = timezone.now()
        application.decided_by = actor
        application.decided_by_name = _actor_name(actor)
        application.decision_reason = reason
        application.save()
        return application
