from django.conf import settings
from django.db import models
from django.db.models import Q

GPU_SECONDS_PER_HOUR = 3600


def hours(gpu_seconds: int) -> str:
    """GPU-seconds shown as GPU-hours with two decimals, e.g. 90000 -> '25.00'."""
    return f"{gpu_seconds / GPU_SECONDS_PER_HOUR:.2f}"


class CreditAccount(models.Model):
    """The balance of one user. Changed only together with a LedgerEntry, under select_for_update()."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="credit_account")
    balance_gpu_seconds = models.BigIntegerField(default=0)
    # Bonus seconds collected across all bonus programs; capped at BONUS_CAP_GPU_HOURS.
    bonus_gpu_seconds = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(bonus_gpu_seconds__gte=0), name="credits_bonus_nonnegative")]

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
            models.UniqueConstraint(fields=["program", "kind", "value"], name="credits_identity_once_per_program")
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
        constraints = [models.CheckConstraint(condition=Q(max_gpu_seconds__gt=0), name="credits_bonus_max_positive")]

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

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bonus_applications")
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
        return self.requested_gpu_seconds is not None and self.granted_gpu_seconds < self.requested_gpu_seconds

    @property
    def granted_hours(self) -> str:
        return hours(self.granted_gpu_seconds)
