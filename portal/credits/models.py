import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

GPU_SECONDS_PER_HOUR = 3600


def hours(gpu_seconds: int) -> str:
    """GPU-seconds shown as GPU-hours with two decimals, e.g. 90000 -> '25.00'.

    An amount too small to show in two (under 18 GPU-seconds, such as the few seconds a meter tick or a
    quick stop charges) gets four, e.g. -10 -> '-0.0028': '-0.00' would read as nothing charged.
    """
    if 0 < abs(gpu_seconds) < GPU_SECONDS_PER_HOUR / 200:
        return f"{gpu_seconds / GPU_SECONDS_PER_HOUR:.4f}"
    return f"{gpu_seconds / GPU_SECONDS_PER_HOUR:.2f}"


class CreditAccount(models.Model):
    """The balance of one user, or the shared pool of one project (exactly one of the two is set).
    Changed only together with a LedgerEntry, under select_for_update()."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="credit_account"
    )
    project = models.OneToOneField(
        "projects.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="credit_account"
    )
    balance_gpu_seconds = models.BigIntegerField(default=0)
    # Bonus seconds collected across all bonus programs; capped at BONUS_CAP_GPU_HOURS.
    bonus_gpu_seconds = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(bonus_gpu_seconds__gte=0), name="credits_bonus_nonnegative"),
            models.CheckConstraint(
                condition=Q(user__isnull=False, project__isnull=True) | Q(user__isnull=True, project__isnull=False),
                name="credits_account_user_xor_project",
            ),
        ]

    def __str__(self):
        return f"{self.user or self.project} {hours(self.balance_gpu_seconds)} GPU-h"

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

    # No index of its own: the (account, -created_at, -id) index below serves lookups by account too.
    account = models.ForeignKey(
        CreditAccount, on_delete=models.PROTECT, related_name="entries", db_index=False
    )
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
    # The instance a usage (or its reversal) is for; through it, who launched it. Empty on other kinds
    # and on usage written before the column existed (the ledger is never rewritten).
    instance = models.ForeignKey(
        "instances.Instance", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        # A user's latest entries (the dashboard, the console's user page) in the order shown, read
        # straight from the index with no sort, however long their history.
        indexes = [
            models.Index(fields=["account", "-created_at", "-id"], name="credits_ledger_account_latest")
        ]

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

    class ApprovalBasis(models.TextChoices):
        """What an approval rests on. Only OPERATOR and HOLDER vouch for the person (VOUCHED_BASES)."""

        OPERATOR = "operator", "An operator reviewed it"
        HOLDER = "holder", "Certificate list: ID and holder's identity matched"
        BARE_ID = "bare_id", "Certificate list: ID alone (operator trusted bare IDs)"

    # Approvals that open the bonus launch tier (8x): anyone who learns or guesses a listed ID can get a
    # BARE_ID approval, so it grants hours but vouches for nobody.
    VOUCHED_BASES = (ApprovalBasis.OPERATOR, ApprovalBasis.HOLDER)

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bonus_applications"
    )
    program = models.ForeignKey(BonusProgram, on_delete=models.PROTECT, related_name="applications")
    evidence = models.CharField(max_length=500)
    # The one certificate ID the evidence names, normalised (certificate_id_in_evidence); blank only for
    # applications filed before the rule, whose evidence named none or several.
    certificate_id = models.CharField("certificate ID", max_length=200, blank=True, default="", db_index=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    # Set with the approval, empty otherwise (see the constraint).
    approval_basis = models.CharField(max_length=10, choices=ApprovalBasis.choices, blank=True, default="")
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
            ),
            models.CheckConstraint(
                condition=(Q(status="approved") & ~Q(approval_basis=""))
                | (~Q(status="approved") & Q(approval_basis="")),
                name="credits_approval_has_basis",
            ),
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
# A program (e.g. ROCm Star) can send the operators the IDs of the certificates it issued, ideally with
# each holder's email address or GitHub login. The matching rule:
#
# * An application names exactly one certificate ID (certificate_id_in_evidence), compared in normal
#   form: surrounding whitespace removed, case folded ("ROCM-Star-42 " and "rocm-star-42" are the same).
#   The evidence is the ID itself, or an http(s) link whose ID parameter (?id=, ?cert=, ...; see
#   ID_PARAMETERS) or, without one, last path segment is the ID. Other query values are ignored, and a
#   link with several ID values is refused: one application is one guess, however long the link.
# * A listed ID with a holder approves an application only when the applicant is that holder: the
#   applicant's verified email address, or the login of a GitHub account linked to theirs, equals the
#   listed one (case aside). Such an approval vouches for the person (ApprovalBasis.HOLDER).
# * A listed ID without a holder approves an application only when the operator who imported the list
#   chose to trust bare IDs (CertificateImport.trust_bare_ids, allowed only for a list without holders).
#   Whoever knows the ID gets the hours then, so the approval vouches for nobody (ApprovalBasis.BARE_ID)
#   and does not open the bonus launch tier.
# * A listed ID approves one application only (IssuedCertificate.claimed_by): another account giving
#   the same ID waits for an operator, who sees every application that named it.
# * Everything else waits for an operator.

CERTIFICATE_ID_MAX_LENGTH = 200
# Query parameters that carry the certificate ID in a verification link, compared case-insensitively.
ID_PARAMETERS = frozenset(
    {"id", "cert", "cert_id", "certid", "certificate", "certificate_id", "credential", "credential_id"}
)
# Separators of a list of IDs: an ID never contains them.
_SEVERAL_IDS = re.compile(r"[\s,;|]")


def normalise_certificate_id(value: str) -> str:
    """The form in which certificate IDs are stored and compared: stripped and case-folded."""
    return (value or "").strip().casefold()


def normalise_holder_email(value: str) -> str:
    """A listed holder's address in the form compared with an applicant's: stripped, lower-case. No
    +tag or dot folding: only the exact mailbox the applicant proved they own counts."""
    return (value or "").strip().lower()


def normalise_github_login(value: str) -> str:
    """A GitHub login in compared form: without a leading "@" or profile URL, case-folded (GitHub logins
    are case-insensitive)."""
    value = (value or "").strip()
    for prefix in ("https://github.com/", "http://github.com/", "github.com/", "@"):
        if value.lower().startswith(prefix):
            value = value[len(prefix) :]
    return value.strip("/").casefold()


def _is_link(evidence: str) -> bool:
    return evidence.lower().startswith(("http://", "https://"))


def certificate_id_in_evidence(evidence: str) -> str:
    """The one normalised certificate ID the evidence names, under the matching rule above.

    Raises ValidationError, with a message for the applicant, when the evidence is blank, names several
    IDs (a list, or a link with several ID values), is a link that names none, or the ID is too long.
    """
    evidence = (evidence or "").strip()
    if not _is_link(evidence):
        if _SEVERAL_IDS.search(evidence):
            raise ValidationError(
                "Enter one certificate ID (without spaces or commas), or the link to your certificate.",
                code="several_ids",
            )
        found = normalise_certificate_id(evidence)
    else:
        try:
            parts = urlsplit(evidence)
        except ValueError:  # e.g. an unbalanced "[" in the host
            raise ValidationError("That link is not a valid web address.", code="invalid_url") from None
        values = {
            normalise_certificate_id(value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
            if name.strip().lower().replace("-", "_") in ID_PARAMETERS
        }
        values.discard("")
        if not values:
            segments = [segment for segment in parts.path.split("/") if segment]
            values = {normalise_certificate_id(unquote(segments[-1]))} if segments else set()
            values.discard("")
        if len(values) > 1 or any(_SEVERAL_IDS.search(value) for value in values):
            raise ValidationError(
                "This link names several certificate IDs. Give the link to your own certificate, or just "
                "its ID.",
                code="several_ids",
            )
        if not values:
            raise ValidationError(
                "This link does not show a certificate ID. Enter the ID printed on your certificate instead.",
                code="no_id",
            )
        [found] = values
    if not found:
        raise ValidationError("Enter your certificate ID or the link to your certificate.", code="required")
    if len(found) > CERTIFICATE_ID_MAX_LENGTH:
        raise ValidationError(
            f"A certificate ID has at most {CERTIFICATE_ID_MAX_LENGTH} characters.", code="too_long"
        )
    return found


def certificate_id_or_blank(evidence: str) -> str:
    """certificate_id_in_evidence, or "" for evidence it refuses (applications filed before the rule)."""
    try:
        return certificate_id_in_evidence(evidence)
    except ValidationError:
        return ""


@dataclass(frozen=True)
class CertificateRow:
    """One row of a program's certificate list: the ID and, when the list has them, its holder."""

    certificate_id: str
    email: str = ""
    github: str = ""

    def normalised(self) -> "CertificateRow":
        return CertificateRow(
            normalise_certificate_id(self.certificate_id),
            normalise_holder_email(self.email),
            normalise_github_login(self.github),
        )

    @property
    def has_holder(self) -> bool:
        return bool(self.email or self.github)


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
    # Distinct IDs of the file that came with a holder (email or GitHub login).
    with_holders = models.PositiveIntegerField("IDs with a holder", default=0)
    # The operator's explicit choice, for a list without holders, to approve on the ID alone.
    trust_bare_ids = models.BooleanField("approves on the ID alone", default=False)
    # Pending applications naming a listed ID that this import left for an operator: the applicant is not
    # the listed holder, or the ID has no holder and its list was not trusted.
    needs_review_count = models.PositiveIntegerField("left pending (not the holder / ID alone)", default=0)

    class Meta:
        ordering = ["-imported_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(trust_bare_ids=False) | Q(with_holders=0),
                name="credits_bare_trust_only_without_holders",
            )
        ]

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
    # Who the program issued it to, when the list says (normalise_holder_email, normalise_github_login).
    holder_email = models.CharField(max_length=254, blank=True, default="")
    holder_github = models.CharField("holder's GitHub login", max_length=100, blank=True, default="")
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

    @property
    def has_holder(self) -> bool:
        return bool(self.holder_email or self.holder_github)

    @property
    def holder(self) -> str:
        """The listed holder for operators, e.g. "alice@example.com / GitHub alice-gh"; "" without one."""
        parts = [self.holder_email] + ([f"GitHub {self.holder_github}"] if self.holder_github else [])
        return " / ".join(part for part in parts if part)
