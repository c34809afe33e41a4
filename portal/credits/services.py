"""Operations that change credits. Every one runs in a transaction, under row locks, with an idempotency key."""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from portal.accounts.models import email_fingerprint
from portal.audit.services import audit_record
from portal.notifications.services import notify_bonus_decided

from .models import (
    CERTIFICATE_ID_MAX_LENGTH,
    GPU_SECONDS_PER_HOUR,
    BonusApplication,
    BonusProgram,
    CertificateImport,
    CertificateRow,
    CreditAccount,
    GrantedIdentity,
    IssuedCertificate,
    LedgerEntry,
    SignupGrantProgram,
    certificate_id_in_evidence,
    hours,
    normalise_github_login,
    normalise_holder_email,
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


def ledger_post(
    *,
    user=None,
    account: CreditAccount | None = None,
    kind: str,
    gpu_seconds: int,
    idempotency_key: str,
    reason: str,
    actor=None,
    instance=None,
) -> LedgerEntry:
    """Append one entry to `user`'s account (or to `account`, e.g. a project's pool) and move the balance
    with it. `instance` names the instance a usage or reversal is for. Returns the entry.

    Idempotent: posting the same key again returns the first entry and changes nothing.
    """
    if not reason:
        raise ValidationError("Every ledger entry needs a reason.")
    if account is None:
        account = account_for(user)
    with transaction.atomic():
        account = CreditAccount.objects.select_for_update().get(pk=account.pk)
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
            instance=instance,
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
        program = (
            SignupGrantProgram.objects.select_for_update().filter(is_active=True).order_by("-id").first()
        )
        if program is None:
            return None
        key = f"signup:{program.pk}:{user.pk}"
        already_here = LedgerEntry.objects.filter(idempotency_key=key).exists()
        known = {
            (kind, value)
            for kind, value in GrantedIdentity.objects.filter(program=program)
            .filter(value__in=[value for _, value in identities])
            .values_list("kind", "value")
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
    """An operator's grant (positive) or correction (negative), recorded in the audit log. Returns the entry.

    Idempotent like ledger_post: posting the same key again returns the first entry and records nothing
    more. Raises ValidationError for zero GPU-seconds or an empty reason.
    """
    if gpu_seconds == 0:
        raise ValidationError("An adjustment of zero changes nothing.")
    kind = LedgerEntry.Kind.GRANT if gpu_seconds > 0 else LedgerEntry.Kind.ADJUSTMENT
    account_for(user)
    with transaction.atomic():
        # Under the account lock, so that of two identical submissions the second finds the first
        # committed and is not audited a second time.
        CreditAccount.objects.select_for_update().get(user=user)
        existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
        entry = ledger_post(
            user=user,
            kind=kind,
            gpu_seconds=gpu_seconds,
            idempotency_key=idempotency_key,
            reason=reason,
            actor=actor,
        )
        audit_record(
            actor=actor,
            action="credits.adjust",
            target=user,
            reason=reason,
            details={
                "user": user.email,
                "gpu_seconds": gpu_seconds,
                "hours": hours(gpu_seconds),
                "balance_after_hours": entry.balance_after_hours,
                "ledger_entry": entry.pk,
            },
        )
        return entry


# --- Bonus applications and decisions ------------------------------------------------------------------

# decided_by_name of applications approved at once because their certificate ID was listed.
CERTIFICATE_LIST_DECIDER = "system (certificate list)"


def bonus_apply(*, user, program: BonusProgram, evidence: str) -> BonusApplication:
    """File an application for bonus hours and return it.

    The application names one certificate ID (models.certificate_id_in_evidence). It is pending, or
    already approved when the program listed that ID, no other application used it, and either the
    applicant is its listed holder or the list has no holders and the operator trusted bare IDs (see the
    matching rule in models.py): then the program's full hours are granted at once (within the
    per-person cap) and the applicant is emailed.

    Raises ValidationError with a message the applicant can act on, also when the person or the program
    is over its application rate (BONUS_APPLICATIONS_PER_PERSON_PER_DAY, ..._PER_PROGRAM_PER_HOUR).
    """
    evidence = (evidence or "").strip()
    if not user.email_verified:
        raise ValidationError("Confirm your email address before applying for bonus hours.")
    if user.is_suspended:
        raise ValidationError(user.suspension_notice)
    if not program.is_active:
        raise ValidationError(f"{program.name} is not taking applications right now.")
    if not evidence:
        raise ValidationError(f"Enter your {program.evidence_label.lower()}.")
    certificate_id = certificate_id_in_evidence(evidence)
    account = account_for(user)
    if account.bonus_gpu_seconds >= bonus_cap_gpu_seconds():
        raise ValidationError(
            f"You already have the maximum of {settings.BONUS_CAP_GPU_HOURS} bonus GPU-hours across all programs."
        )
    with transaction.atomic():
        _share_program(program)
        # One person's applications take turns on their account row, so the person's count is exact.
        # After the program, as in an import (program, then the accounts it approves): no deadlock.
        CreditAccount.objects.select_for_update().get(pk=account.pk)
        _check_application_rates(user=user, program=program)
        try:
            with transaction.atomic():
                application = BonusApplication.objects.create(
                    user=user, program=program, evidence=evidence, certificate_id=certificate_id
                )
        except IntegrityError:
            raise ValidationError(f"You already have an application for {program.name}.") from None
        certificate = (
            IssuedCertificate.objects.filter(
                program=program, certificate_id=certificate_id, claimed_by__isnull=True
            )
            .select_related("batch")
            .first()
        )
        basis = certificate and _list_basis(certificate=certificate, user=user)
        if basis:
            approved = _approve_from_list(
                application_id=application.pk,
                certificate=certificate,
                source=certificate.batch,
                actor=None,
                basis=basis,
            )
            if approved is not None:
                application = approved
        return application


def _wait_text(delta: timedelta) -> str:
    minutes = max(1, -(-int(delta.total_seconds()) // 60))
    if minutes < 90:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{-(-minutes // 60)} hours"


def _check_application_rates(*, user, program) -> None:
    """Refuse an application over the per-person or per-program rate; raises ValidationError saying when
    to try again. Counted from the applications themselves, rejected ones included, so a guess that an
    operator rejected still counts. The per-program count can be exceeded by the applications filed at
    the very same moment (they share the program's lock); that is fine for a rate.
    """
    now = timezone.now()
    per_person = settings.BONUS_APPLICATIONS_PER_PERSON_PER_DAY
    day = BonusApplication.objects.filter(user=user, created_at__gt=now - timedelta(days=1))
    filed = list(day.order_by("created_at").values_list("created_at", flat=True)[:per_person])
    if len(filed) >= per_person:
        wait = filed[0] + timedelta(days=1) - now
        raise ValidationError(
            f"You have filed {per_person} bonus applications in the last 24 hours, the most we take from one "
            f"person. Try again in {_wait_text(wait)}; what you entered is kept below.",
            code="rate_person",
        )
    per_program = settings.BONUS_APPLICATIONS_PER_PROGRAM_PER_HOUR
    hour = BonusApplication.objects.filter(program=program, created_at__gt=now - timedelta(hours=1))
    taken = list(hour.order_by("-created_at").values_list("created_at", flat=True)[:per_program])
    if len(taken) >= per_program:
        wait = taken[-1] + timedelta(hours=1) - now
        raise ValidationError(
            f"{program.name} is taking many applications right now. Try again in {_wait_text(wait)}; what "
            "you entered is kept below.",
            code="rate_program",
        )


def _github_logins(user) -> set[str]:
    return {
        normalise_github_login((social.extra_data or {}).get("login", ""))
        for social in user.social_auth.all()
        if social.provider == "github"
    } - {""}


def is_listed_holder(*, certificate: IssuedCertificate, user) -> bool:
    """Whether `user` is the holder the list names for `certificate`: their verified address or a
    linked GitHub login equals the listed one. False for a certificate listed without a holder."""
    if certificate.holder_email and user.email_verified:
        if normalise_holder_email(user.email) == certificate.holder_email:
            return True
    return bool(certificate.holder_github) and certificate.holder_github in _github_logins(user)


def _list_basis(*, certificate: IssuedCertificate, user) -> str | None:
    """What the list lets `certificate` approve for `user` on: HOLDER, BARE_ID, or None (an operator
    decides). `certificate.batch` must be loaded: the trust in bare IDs is that of the import that
    listed the ID."""
    if certificate.has_holder:
        if is_listed_holder(certificate=certificate, user=user):
            return BonusApplication.ApprovalBasis.HOLDER
        return None
    if certificate.batch.trust_bare_ids:
        return BonusApplication.ApprovalBasis.BARE_ID
    return None


def _share_program(program) -> None:
    """Hold a key-share lock on the program's row until the transaction ends.

    Applications to a program and imports of its certificate list take turns on this row: applications
    share it (they do not wait for each other), an import holds it FOR UPDATE. So an applicant either
    applied before an import (which then sees the pending application) or after it committed (and finds
    the ID listed); nobody falls in between, approved by neither. The INSERT of the application does
    not take this lock itself: Django's foreign keys are checked only at commit, too late.

    PostgreSQL only: SQLite lets one transaction write at a time, which gives the same guarantee.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {BonusProgram._meta.db_table} WHERE id = %s FOR KEY SHARE", [program.pk]
        )


def bonus_approve(
    *, application_id: int, actor, gpu_seconds: int | None = None, reason: str = ""
) -> BonusApplication:
    """Approve a pending application for `gpu_seconds` (default: the program's maximum). Returns it.

    The grant is clamped to the program's maximum and to what is left under the per-person cap;
    `application.clamped` tells the operator. The decision is written to the audit log in the same
    transaction, and the applicant is emailed once it commits. Raises ValidationError if the application
    was already decided or `gpu_seconds` is negative.
    """
    return _approve(application_id=application_id, actor=actor, gpu_seconds=gpu_seconds, reason=reason)


def _approve(
    *,
    application_id: int,
    actor,
    gpu_seconds: int | None = None,
    reason: str = "",
    decided_by_name: str | None = None,
    approved_via: CertificateImport | None = None,
    basis: str = BonusApplication.ApprovalBasis.OPERATOR,
) -> BonusApplication:
    if gpu_seconds is not None and gpu_seconds < 0:
        raise ValidationError("Hours to grant cannot be negative.")
    application = BonusApplication.objects.select_related("program", "user").get(pk=application_id)
    account_for(application.user)
    with transaction.atomic():
        # Lock order: account, then application. Every path that changes bonus hours follows it.
        account = CreditAccount.objects.select_for_update().get(user_id=application.user_id)
        # of=self: locking the joined program row too would make approvals queue behind an import
        # (which holds it) while holding the account the import needs next: a deadlock.
        application = (
            BonusApplication.objects.select_for_update(of=("self",))
            .select_related("program", "user")
            .get(pk=application_id)
        )
        if application.status != BonusApplication.Status.PENDING:
            raise ValidationError(f"This application was already {application.get_status_display().lower()}.")
        program = application.program
        requested = program.max_gpu_seconds if gpu_seconds is None else gpu_seconds
        room = max(bonus_cap_gpu_seconds() - account.bonus_gpu_seconds, 0)
        granted = min(requested, program.max_gpu_seconds, room)
        application.status = BonusApplication.Status.APPROVED
        application.requested_gpu_seconds = requested
        application.granted_gpu_seconds = granted
        application.decided_at = timezone.now()
        application.decided_by = actor
        application.decided_by_name = decided_by_name or _actor_name(actor)
        application.decision_reason = reason
        application.approved_via = approved_via
        application.approval_basis = basis
        application.save()
        if granted > 0:
            CreditAccount.objects.filter(pk=account.pk).update(
                bonus_gpu_seconds=account.bonus_gpu_seconds + granted
            )
            ledger_post(
                user=application.user,
                kind=LedgerEntry.Kind.BONUS,
                gpu_seconds=granted,
                idempotency_key=f"bonus:{application.pk}",
                reason=f"{program.name} approved",
                actor=actor,
            )
        audit_record(
            actor=actor,
            action="bonus.approve",
            target=application,
            reason=reason or f"Approved {hours(requested)} of {program.max_hours} GPU-hours",
            details={
                "applicant": application.user.email,
                "program": program.name,
                "evidence": application.evidence,
                "requested_hours": hours(requested),
                "granted_hours": hours(granted),
                "clamped_by_cap": application.clamped,
                "certificate_import": approved_via.pk if approved_via else None,
                "basis": basis,
            },
        )
        notify_bonus_decided(application=application)
        return application


def bonus_reject(*, application_id: int, actor, reason: str) -> BonusApplication:
    """Reject a pending application and return it. The reason is shown to the applicant; it is required.

    The decision is written to the audit log in the same transaction, and the applicant is emailed once
    it commits. Raises ValidationError for a blank reason or an application that was already decided.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Give the applicant a reason for the rejection.")
    with transaction.atomic():
        application = (
            BonusApplication.objects.select_for_update(of=("self",))
            .select_related("program", "user")
            .get(pk=application_id)
        )
        if application.status != BonusApplication.Status.PENDING:
            raise ValidationError(f"This application was already {application.get_status_display().lower()}.")
        application.status = BonusApplication.Status.REJECTED
        application.decided_at = timezone.now()
        application.decided_by = actor
        application.decided_by_name = _actor_name(actor)
        application.decision_reason = reason
        application.save()
        audit_record(
            actor=actor,
            action="bonus.reject",
            target=application,
            reason=reason,
            details={
                "applicant": application.user.email,
                "program": application.program.name,
                "evidence": application.evidence,
            },
        )
        notify_bonus_decided(application=application)
        return application


@dataclass(frozen=True)
class BulkDecision:
    """What a bulk approval or rejection did: the applications it decided, oldest first, and how many of
    those selected were already decided (by someone else, or before)."""

    decided: list[BonusApplication]
    skipped: int


def _oldest_first(application_ids) -> list[int]:
    return list(
        BonusApplication.objects.filter(pk__in=list(application_ids))
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)
    )


def bonus_approve_many(*, application_ids, actor) -> BulkDecision:
    """Approve each pending application among `application_ids` for its program's full hours, oldest first
    (so the cap treats applicants in the order they applied). Returns a BulkDecision.

    Each approval is its own transaction, audited and emailed like bonus_approve: one that another
    operator decided meanwhile is skipped and the others still go through.
    """
    decided, skipped = [], 0
    for application_id in _oldest_first(application_ids):
        try:
            decided.append(bonus_approve(application_id=application_id, actor=actor))
        except ValidationError:
            skipped += 1
    return BulkDecision(decided, skipped)


def bonus_reject_many(*, application_ids, actor, reason: str) -> BulkDecision:
    """Reject each pending application among `application_ids` with the same reason. Returns a BulkDecision.

    Each rejection is its own transaction, audited and emailed like bonus_reject; already decided ones
    are skipped. Raises ValidationError for a blank reason, before rejecting anything.
    """
    if not (reason or "").strip():
        raise ValidationError("Give the applicants a reason for the rejection.")
    decided, skipped = [], 0
    for application_id in _oldest_first(application_ids):
        try:
            decided.append(bonus_reject(application_id=application_id, actor=actor, reason=reason))
        except ValidationError:
            skipped += 1
    return BulkDecision(decided, skipped)


# --- Certificate lists -----------------------------------------------------------------------------------

# Rows per INSERT when importing, and IDs per lookup: a few dozen queries for a 100k-ID file, each far
# below PostgreSQL's (and SQLite's) limit on query parameters.
IMPORT_BATCH_SIZE = 5000
LOOKUP_BATCH_SIZE = 1000


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _listed(program, certificate_ids) -> dict[str, IssuedCertificate]:
    """The program's listed certificates among `certificate_ids`, by ID, with their import."""
    found = {}
    for chunk in _chunks(sorted(certificate_ids), LOOKUP_BATCH_SIZE):
        for certificate in IssuedCertificate.objects.filter(
            program=program, certificate_id__in=chunk
        ).select_related("batch"):
            found[certificate.certificate_id] = certificate
    return found


_BASIS_REASON = {
    BonusApplication.ApprovalBasis.HOLDER: "Certificate ID and holder listed in {label}",
    BonusApplication.ApprovalBasis.BARE_ID: "Certificate ID listed in {label}, trusted without a holder",
}


def _approve_from_list(
    *, application_id: int, certificate, source: CertificateImport, actor, basis: str
) -> BonusApplication | None:
    """Approve a pending application for its program's full hours because `certificate` is listed and
    `basis` (HOLDER or BARE_ID) says the list may approve it.

    Returns the approved application, or None when another application already used that certificate
    (this one then waits for an operator). Raises ValidationError when it was decided meanwhile.
    `source` is the import named in the decision: the one being run, or the one that listed the ID.
    """
    with transaction.atomic():
        # A conditional UPDATE is the claim: of two applications naming one ID, only one gets a row.
        claimed = IssuedCertificate.objects.filter(pk=certificate.pk, claimed_by__isnull=True).update(
            claimed_by_id=application_id
        )
        if not claimed:
            return None
        return _approve(
            application_id=application_id,
            actor=actor,
            reason=_BASIS_REASON[basis].format(label=source.label),
            decided_by_name=None if actor is not None else CERTIFICATE_LIST_DECIDER,
            approved_via=source,
            basis=basis,
        )


def _distinct_rows(rows) -> list[CertificateRow]:
    """The file's rows normalised, blank IDs dropped, each ID once (first row wins). Raises
    ValidationError when an ID repeats with another holder: one of the rows is wrong."""
    distinct, conflicts = {}, []
    for row in rows:
        row = (row if isinstance(row, CertificateRow) else CertificateRow(row)).normalised()
        if not row.certificate_id:
            continue
        first = distinct.setdefault(row.certificate_id, row)
        if first != row:
            conflicts.append(row.certificate_id)
    if conflicts:
        raise ValidationError(
            f"{len(set(conflicts))} ID(s) are listed twice with different holders (e.g. {conflicts[0]}); "
            "nothing was imported. Fix the file and upload it again."
        )
    return list(distinct.values())


def certificates_import(
    *,
    program: BonusProgram,
    rows,
    actor,
    filename: str = "",
    note: str = "",
    trust_bare_ids: bool = False,
) -> CertificateImport:
    """Add the certificates a program issued to its list, and approve the pending applications that the
    list proves (see the matching rule in models.py).

    `rows` is the file, row by row: a CertificateRow (ID and holder's email or GitHub login) or just the
    ID as a string. Repeats and any case are allowed; they are normalised. `trust_bare_ids` is the
    operator's explicit choice, for a list without holders, to approve on the ID alone. IDs already listed
    stay with the import that listed them first (holder and trust included), so importing the same file
    again adds nothing and approves nothing twice.

    Then every pending application of the program naming a listed, unused ID is approved for the program's
    full hours (clamped by the per-person cap as usual) when its applicant is the listed holder, or the ID
    has no holder and its import trusted bare IDs; decided by `actor`, audited and emailed. The others are
    left for an operator (`needs_review_count`, or `left_pending_count` when the ID was already used).
    Applications an operator approved by hand first claim the IDs they name (an ID with a holder only
    for that holder), and an ID approves one application only.

    Returns the CertificateImport with its counts. Raises ValidationError when there is no ID, an ID is
    longer than CERTIFICATE_ID_MAX_LENGTH, an ID repeats with different holders, or bare IDs are to be
    trusted in a list that has holders; nothing is imported then.
    """
    rows = [row if isinstance(row, CertificateRow) else CertificateRow(row) for row in rows]
    if not any(row.certificate_id.strip() for row in rows):
        raise ValidationError("There are no certificate IDs to import.")
    too_long = sum(len(row.certificate_id.strip()) > CERTIFICATE_ID_MAX_LENGTH for row in rows)
    if too_long:
        raise ValidationError(
            f"{too_long} ID(s) are longer than {CERTIFICATE_ID_MAX_LENGTH} characters; nothing was imported."
        )
    distinct = _distinct_rows(rows)
    rows_read = sum(1 for row in rows if row.certificate_id.strip())
    with_holders = sum(row.has_holder for row in distinct)
    if trust_bare_ids and with_holders:
        raise ValidationError(
            "This list names holders, so it approves their holders only; approving on the ID alone is for "
            "lists without holders. Untick it and import again."
        )
    with transaction.atomic():
        # Excludes applications to this program until the import commits (see _share_program).
        program = BonusProgram.objects.select_for_update().get(pk=program.pk)
        batch = CertificateImport.objects.create(
            program=program,
            filename=(filename or "")[:255],
            imported_by=actor,
            imported_by_name=_actor_name(actor),
            rows_read=rows_read,
            duplicate_rows=rows_read - len(distinct),
            with_holders=with_holders,
            trust_bare_ids=trust_bare_ids,
        )
        for chunk in _chunks(distinct, IMPORT_BATCH_SIZE):
            IssuedCertificate.objects.bulk_create(
                # Ids rather than instances: a third of the time of a 100k-row import went to
                # setting related objects on each row.
                [
                    IssuedCertificate(
                        program_id=program.pk,
                        certificate_id=row.certificate_id,
                        holder_email=row.email,
                        holder_github=row.github,
                        batch_id=batch.pk,
                    )
                    for row in chunk
                ],
                ignore_conflicts=True,
            )
        batch.new_ids = IssuedCertificate.objects.filter(batch=batch).count()
        batch.already_listed = len(distinct) - batch.new_ids
        _claim_for_approved(program)
        _approve_pending(
            program=program, batch=batch, file_ids={row.certificate_id for row in distinct}, actor=actor
        )
        batch.save(
            update_fields=[
                "new_ids",
                "already_listed",
                "approved_count",
                "clamped_count",
                "left_pending_count",
                "needs_review_count",
            ]
        )
        audit_record(
            actor=actor,
            action="bonus.import",
            target=batch,
            reason=(note or "").strip()
            or f"Certificate IDs issued by {program.name} ({batch.filename or 'no file name'})",
            details={
                "program": program.name,
                "filename": batch.filename,
                "rows_read": batch.rows_read,
                "duplicate_rows": batch.duplicate_rows,
                "new_ids": batch.new_ids,
                "already_listed": batch.already_listed,
                "with_holders": batch.with_holders,
                "trust_bare_ids": batch.trust_bare_ids,
                "approved": batch.approved_count,
                "clamped": batch.clamped_count,
                "left_pending": batch.left_pending_count,
                "needs_review": batch.needs_review_count,
            },
        )
        return batch


def _applications(program, status, **filters):
    """The program's applications in `status` that name a certificate ID, oldest first, with the
    applicant and their GitHub links (for is_listed_holder)."""
    return list(
        BonusApplication.objects.filter(program=program, status=status, **filters)
        .exclude(certificate_id="")
        .select_related("user")
        .prefetch_related("user__social_auth")
        .order_by("created_at", "pk")
    )


def _claim_for_approved(program) -> None:
    """Let applications approved by hand (before their ID was listed) claim the unused IDs they name,
    so that the same ID cannot approve a second account automatically. An ID with a holder is claimed
    only by its holder's application: someone else's approval must not keep the holder waiting."""
    approved = _applications(program, BonusApplication.Status.APPROVED, certificate__isnull=True)
    approved.sort(key=lambda application: (application.decided_at, application.pk))
    if not approved:
        return
    listed = _listed(program, {application.certificate_id for application in approved})
    claims = []
    for application in approved:
        certificate = listed.get(application.certificate_id)
        if certificate is None or certificate.claimed_by_id is not None:
            continue
        if certificate.has_holder and not is_listed_holder(certificate=certificate, user=application.user):
            continue
        certificate.claimed_by_id = application.pk
        claims.append(certificate)
    IssuedCertificate.objects.bulk_update(claims, ["claimed_by"], batch_size=LOOKUP_BATCH_SIZE)


def _approve_pending(*, program, batch: CertificateImport, file_ids: set[str], actor) -> None:
    """Approve the program's pending applications that the list proves; count on `batch`."""
    pending = _applications(program, BonusApplication.Status.PENDING)
    if not pending:
        return
    listed = _listed(program, {application.certificate_id for application in pending})
    for application in pending:
        certificate = listed.get(application.certificate_id)
        if certificate is None:
            continue
        if certificate.claimed_by_id is not None:
            batch.left_pending_count += 1
            continue
        basis = _list_basis(certificate=certificate, user=application.user)
        if basis is None:
            batch.needs_review_count += 1
            continue
        source = batch if certificate.certificate_id in file_ids else certificate.batch
        try:
            approved = _approve_from_list(
                application_id=application.pk,
                certificate=certificate,
                source=source,
                actor=actor,
                basis=basis,
            )
        except ValidationError:
            continue  # an operator decided it while the import ran
        if approved is None:
            batch.left_pending_count += 1
            continue
        certificate.claimed_by_id = application.pk
        batch.approved_count += 1
        batch.clamped_count += approved.clamped


# --- Programs --------------------------------------------------------------------------------------------


def program_save(*, program: BonusProgram | SignupGrantProgram, actor, reason: str):
    """Create or change a bonus or signup-grant program, recording in the audit log what changed and why.

    Only the fields an operator edits are written, so a count the system keeps (granted_count) is never
    overwritten with a stale value. Returns the saved program. Raises ValidationError for a blank reason.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Say why; the reason is recorded in the audit log.")
    model = type(program)
    editable = [
        field.attname for field in model._meta.concrete_fields if field.editable and not field.primary_key
    ]
    with transaction.atomic():
        if program.pk is None:
            program.save()
            details = {"created": True, "values": {name: getattr(program, name) for name in editable}}
        else:
            before = model.objects.select_for_update().filter(pk=program.pk).values(*editable).get()
            changes = {
                name: {"from": before[name], "to": getattr(program, name)}
                for name in editable
                if before[name] != getattr(program, name)
            }
            if changes:
                program.save(update_fields=list(changes))
            details = {"created": False, "changes": changes}
        audit_record(actor=actor, action="program.change", target=program, reason=reason, details=details)
        return program
