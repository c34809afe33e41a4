from urllib.parse import parse_qsl, unquote, urlsplit

from django.conf import settings
from django.db import models
from django.db.models import Q

GPU_SECONDS_PER_HOUR = 3600


def hours(gpu_seconds: int) -> str:
    """GPU-seconds shown as GPU-hours with two decimals, e.g. 90000 -> '25.00'."""
    return f"{gpu_seconds / GPU_SECONDS_PER_HOUR:.2f}"


class CreditAccount(models.Model):
    """The balance of one user. Changed only together with a LedgerEntry, under select_for_update()."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="credit_account"
    )
    balance_gpu_seconds = models.BigIntegerField(default=0)
    # Bonus seconds collected across all bonus programs; capped at BONUS_CAP_GPU_HOURS.
    bonus_gpu_seconds = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(bonus_gpu_seconds__gte=0), name="credits_bonus_nonnegative")
        ]

    def __str__(self):
        return f"{self.user} {hours(self.balance_gpu_seconds)} GPU-h"

    @property
    def balance_hours(self) -> str:
        return hours(self.balance_gpu_seconds)


class LedgerEntry(models.Model):
    """One change to a balance. Append-only: the database refuses UPDATE and DELETE (migration 0002)."""

    class Kind(models.TextChoices):
        GRANT = "grant", "Grant"
        BONUS = "bonus", "Bonus"
        USAGE = "usage", "Usage"
        ADJUSTMENT = "adjustment", "Adjustment"
        REVERSAL = "reversal", "Reversal"
        EXPIRY = "expiry", "Expiry"

    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="entries")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    gpu_seconds = models.BigIntegerField(help_text="Signed: positive adds credit, negative spends it.")
    balance_after = models.BigIntegerField()
    idempotency_key = models.CharField(max_length=200, unique=True)
    reason = models.TextField()
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The operator's name as it was when they acted, so the record reads right after renames.
    actor_name = models.CharField(max_length=254, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["account", "-created_at"])]

    def __str__(self):
        return f"{self.kind} {hours(self.gpu_seconds)} ({self.reason})"

    @property
    def hours(self) -> str:
        return hours(self.gpu_seconds)

    @property
    def balance_after_hours(self) -> str:
        return hours(self.balance_after)


class SignupGrantProgram(models.Model):
    """The early-registrant grant: given once per person, to the first `max_accounts`, while open."""

    name = models.CharField(max_length=100, unique=True)
    gpu_seconds = models.BigIntegerField()
    max_accounts = models.PositiveIntegerField()
    open_until = models.DateTimeField(null=True, blank=True, help_text="Empty: open until turned off.")
    is_active = models.BooleanField(default=True)
    granted_count = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(gpu_seconds__gt=0), name="credits_signup_positive")]

    def __str__(self):
        return self.name


class GrantedIdentity(models.Model):
    """An identity (normalised-email digest or GitHub user id) that already collected a signup grant.

    Kept when the account is deleted, so the same person cannot collect the grant twice.
    """

    class Kind(models.TextChoices):
        EMAIL = "email", "Email (SHA-256 of normalised address)"
        GITHUB = "github", "GitHub user id"

    program = models.ForeignKey(SignupGrantProgram, on_delete=models.PROTECT, related_name="identities")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    value = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["program", "kind", "value"], name="credits_identity_once_per_program"
            )
        ]

    def __str__(self):
        return f"{self.kind}:{self.value[:12]}"


class BonusProgram(models.Model):
    """A program (e.g. the ROCm Star developer certificate) under which developers apply for bonus hours."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(unique=True)
    description = models.TextField(blank=True)
    evidence_label = models.CharField(max_length=100, default="Certificate ID or URL")
    max_gpu_seconds = models.BigIntegerField()
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(max_gpu_seconds__gt=0), name="credits_bonus_max_positive")
        ]

    def __str__(self):
        return self.name

    @property
    def max_hours(self) -> str:
        return hours(self.max_gpu_seconds)


class BonusApplication(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending review"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bonus_applications"
    )
    program = models.ForeignKey(BonusProgram, on_delete=models.PROTECT, related_name="applications")
    evidence = models.CharField(max_length=500)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_by_name = models.CharField(max_length=254, blank=True, default="")
    decision_reason = models.TextField(blank=True, default="")
    # What the operator asked to grant, and what was granted after the per-person cap.
    requested_gpu_seconds = models.BigIntegerField(null=True, blank=True)
    granted_gpu_seconds = models.BigIntegerField(default=0)
    # Set when a certificate list approved it (no operator looked at it): the import holding its ID.
    approved_via = models.ForeignKey(
        "CertificateImport",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="approved_applications",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One open or successful application per person and program; a rejected one may be retried.
            models.UniqueConstraint(
                fields=["user", "program"],
                condition=Q(status__in=["pending", "approved"]),
                name="credits_one_live_application",
            )
        ]

    def __str__(self):
        return f"{self.user} / {self.program} ({self.status})"

    @property
    def clamped(self) -> bool:
        return (
            self.requested_gpu_seconds is not None and self.granted_gpu_seconds < self.requested_gpu_seconds
        )

    @property
    def granted_hours(self) -> str:
        return hours(self.granted_gpu_seconds)


# --- Certificate lists ------------------------------------------------------------------------------------
#
# A program (e.g. ROCm Star) can send the operators the IDs of the certificates it issued. Applications
# whose evidence names a listed ID are approved without a human looking at them. The matching rule:
#
# * An ID is compared in normal form: surrounding whitespace removed, case folded ("ROCM-Star-42 " and
#   "rocm-star-42" are the same ID).
# * Evidence matches when its normal form equals a listed ID, or, for an http(s) link, when the link's last
#   path segment (percent-decoded) or the value of any query parameter does. So "ROCM-STAR-42",
#   "https://certs.example.com/verify/ROCM-STAR-42" and "https://certs.example.com/v?id=rocm-star-42" all
#   match the listed ID "rocm-star-42".
# * A listed ID approves one application only (IssuedCertificate.claimed_by): a second account giving
#   the same ID waits for an operator, because certificate IDs are personal and a shared one is suspect.

CERTIFICATE_ID_MAX_LENGTH = 200


def normalise_certificate_id(value: str) -> str:
    """The form in which certificate IDs are stored and compared: stripped and case-folded."""
    return (value or "").strip().casefold()


def certificate_ids_in_evidence(evidence: str) -> set[str]:
    """The normalised IDs a piece of evidence could be naming, under the matching rule above.

    Returns an empty set for blank evidence. Never raises on odd input: evidence is user text.
    """
    evidence = (evidence or "").strip()
    found = {normalise_certificate_id(evidence)}
    if evidence.lower().startswith(("http://", "https://")):
        try:
            parts = urlsplit(evidence)
        except ValueError:  # e.g. an unbalanced "[" in the host; the whole text is still a candidate
            parts = None
        if parts is not None:
            segments = [segment for segment in parts.path.split("/") if segment]
            if segments:
                found.add(normalise_certificate_id(unquote(segments[-1])))
            found.update(normalise_certificate_id(value) for _, value in parse_qsl(parts.query))
    found.discard("")
    return {candidate for candidate in found if len(candidate) <= CERTIFICATE_ID_MAX_LENGTH}


class CertificateImport(models.Model):
    """One CSV of certificate IDs an operator imported for a program, with what the import did."""

    program = models.ForeignKey(BonusProgram, on_delete=models.PROTECT, related_name="certificate_imports")
    filename = models.CharField(max_length=255, blank=True, default="")
    imported_at = models.DateTimeField(auto_now_add=True, db_index=True)
    imported_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The operator's name as it was when they imported, so the record reads right after renames.
    imported_by_name = models.CharField("imported by", max_length=254, blank=True, default="")
    # Rows holding an ID (blank lines and the header are not counted), and of those, repeats of an ID
    # earlier in the same file.
    rows_read = models.PositiveIntegerField(default=0)
    duplicate_rows = models.PositiveIntegerField("repeated rows", default=0)
    # Distinct IDs of the file: added to the program's list, or already on it from an earlier import.
    new_ids = models.PositiveIntegerField("new IDs", default=0)
    already_listed = models.PositiveIntegerField(default=0)
    # Pending applications this import approved, and how many of those the per-person cap cut.
    approved_count = models.PositiveIntegerField("approved", default=0)
    clamped_count = models.PositiveIntegerField("cut by the cap", default=0)
    # Pending applications naming a listed ID that another application had already used.
    left_pending_count = models.PositiveIntegerField("left pending (ID already used)", default=0)

    class Meta:
        ordering = ["-imported_at", "-id"]

    def __str__(self):
        return f"Import #{self.pk} of {self.filename or 'certificate IDs'} for {self.program}"

    @property
    def label(self) -> str:
        """How decisions name the import, e.g. "import #3 (rocm-star-may.csv) by Olivia Operator"."""
        source = f" ({self.filename})" if self.filename else ""
        return f"import #{self.pk}{source} by {self.imported_by_name or 'system'}"


class IssuedCertificate(models.Model):
    """A certificate ID a program says it issued. Listed once per program, whatever the number of imports."""

    program = models.ForeignKey(BonusProgram, on_delete=models.PROTECT, related_name="issued_certificates")
    # Normalised (normalise_certificate_id).
    certificate_id = models.CharField(max_length=CERTIFICATE_ID_MAX_LENGTH)
    # The import that first listed it; a later import of the same ID leaves it there.
    batch = models.ForeignKey(CertificateImport, on_delete=models.PROTECT, related_name="certificates")
    # The application this ID approved (or that an operator approved with it before the list arrived).
    claimed_by = models.OneToOneField(
        BonusApplication, null=True, blank=True, on_delete=models.PROTECT, related_name="certificate"
    )

    class Meta:
        constraints = [
            # Also the index that every match looks up (program, certificate_id).
            models.UniqueConstraint(
                fields=["program", "certificate_id"], name="credits_certificate_once_per_program"
            ),
            models.CheckConstraint(condition=~Q(certificate_id=""), name="credits_certificate_id_not_blank"),
        ]

    def __str__(self):
        return self.certificate_id
