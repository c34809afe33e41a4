"""Projects: a group of people (owners and members) who launch instances paid from one shared pool.

The pool is a CreditAccount of its own (portal/credits/models.py, CreditAccount.project), with its own
ledger. The limits here are set by the project's owners, except `entitled_8x`, which only operators set.
"""

import hashlib

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

# A slug is what the URL, the API and `devcloud launch --project` name a project by.
SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$"
DEFAULT_MAX_LIVE_INSTANCES = 2
DEFAULT_MAX_RUN_SECONDS = 4 * 3600
# Sizes a new project allows; 8x also needs entitled_8x.
DEFAULT_ALLOWED_SIZES = ["1x"]


def default_allowed_sizes() -> list[str]:
    return list(DEFAULT_ALLOWED_SIZES)


def token_digest(token: str) -> str:
    """How an invitation's token is stored: its SHA-256, hex. The token itself is only in the email."""
    return hashlib.sha256(token.encode()).hexdigest()


class Project(models.Model):
    """An open-source project's shared GPU-hour pool, its people and the limits its owners set."""

    slug = models.CharField(
        max_length=50,
        unique=True,
        validators=[RegexValidator(SLUG_PATTERN, "Use lower-case letters, digits and dashes, e.g. “vllm”.")],
    )
    name = models.CharField(max_length=100)
    repository_url = models.URLField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Queued, provisioning and running instances of the project at once, whoever launched them.
    max_live_instances = models.PositiveIntegerField(default=DEFAULT_MAX_LIVE_INSTANCES)
    # The longest one session may run, from ready; the size's own limit applies too (the smaller wins).
    max_run_seconds = models.PositiveIntegerField(default=DEFAULT_MAX_RUN_SECONDS)
    # Size keys members may launch, e.g. ["1x"]; "8x" counts only while entitled_8x.
    allowed_sizes = models.JSONField(default=default_allowed_sizes, blank=True)
    # Set by operators only (the console): whether the project may run 8x at all.
    entitled_8x = models.BooleanField(default=False)
    # GPU-seconds one member may spend from the pool per calendar month (UTC); 0 = no cap.
    member_monthly_cap_gpu_seconds = models.BigIntegerField(default=0)
    # The account the project's robot tokens and CI sign-ins act as (portal/api/robots.py), made on first
    # use. It is a member of the project, so it launches under the same limits and locks as a person.
    bot = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="bot_for"
    )
    # The open-source CI programme (portal/projects/ci_grants.py). The GPU-seconds granted each period
    # while the project is in it; 0 when it never was or an operator ended its grant (nothing renews).
    ci_grant_gpu_seconds = models.BigIntegerField(default=0)
    # The period ("2026-12") whose grant is on the pool now, "" when none is. Changed only under the
    # pool's CreditAccount row lock, with the ledger entries that grant or expire it.
    ci_grant_period = models.CharField(max_length=7, blank=True, default="")

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(condition=Q(max_run_seconds__gt=0), name="projects_max_run_positive"),
            models.CheckConstraint(
                condition=Q(ci_grant_gpu_seconds__gte=0), name="projects_ci_grant_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(member_monthly_cap_gpu_seconds__gte=0), name="projects_cap_nonnegative"
            ),
        ]

    def __str__(self):
        return self.slug

    def size_allowed(self, size_key: str) -> bool:
        """Whether members may launch `size_key` for this project (8x also needs the operators' entitlement)."""
        if size_key == "8x" and not self.entitled_8x:
            return False
        return size_key in (self.allowed_sizes or [])


class ProjectMembership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="projects_one_membership"),
            models.CheckConstraint(condition=Q(role__in=["owner", "member"]), name="projects_known_role"),
        ]

    def __str__(self):
        return f"{self.user} in {self.project} ({self.role})"


class ProjectInvitation(models.Model):
    """An invitation by email. The token is random and only its digest is stored; a new email rotates it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=ProjectMembership.Role.choices, default="member")
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    token_digest = models.CharField(max_length=64, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    declined_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One open invitation per address and project; an ended one may be followed by another.
            models.UniqueConstraint(
                fields=["project", "email"],
                condition=Q(accepted_at__isnull=True, declined_at__isnull=True, revoked_at__isnull=True),
                name="projects_one_open_invitation",
            )
        ]

    def __str__(self):
        return f"{self.email} to {self.project}"

    @property
    def is_open(self) -> bool:
        return self.accepted_at is None and self.declined_at is None and self.revoked_at is None


class TrustedPublisher(models.Model):
    """A CI workflow the project trusts to sign in without a stored secret: an OpenID Connect token from
    `provider` (a name in settings.OIDC_PROVIDERS, which maps it to its issuer URL; owners never type a
    URL the portal would fetch) for `repository`, and, when set, that ref, workflow and environment
    exactly (portal/lib/oidc.py, TrustPolicy)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="trusted_publishers")
    provider = models.CharField(max_length=50)
    repository = models.CharField(max_length=200, help_text="owner/name, e.g. vllm-project/vllm")
    ref = models.CharField(max_length=200, blank=True, default="", help_text="e.g. refs/heads/main")
    workflow = models.CharField(
        max_length=300, blank=True, default="", help_text="e.g. vllm-project/vllm/.github/workflows/gpu.yml"
    )
    environment = models.CharField(max_length=100, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "provider", "repository", "ref", "workflow", "environment"],
                name="projects_one_trusted_publisher",
            )
        ]

    def __str__(self):
        return f"{self.provider}:{self.repository} for {self.project}"


class CIGrantApplication(models.Model):
    """An owner's application for the open-source CI programme: a monthly GPU-hour grant to the pool,
    decided by an operator (portal/projects/ci_grants.py)."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending review"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="ci_grant_applications")
    applicant = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    repository_url = models.URLField("repository", max_length=300)
    # GitHub logins or email addresses, as the owner wrote them.
    maintainers = models.TextField(max_length=1000)
    purpose = models.TextField("what the GPUs are for", max_length=2000)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The operator's name as it was when they decided, so the record reads right after renames.
    decided_by_name = models.CharField(max_length=254, blank=True, default="")
    # Shown to the owners: why it was rejected, or an optional note with an approval.
    decision_reason = models.TextField(blank=True, default="")
    # The monthly grant an approval set.
    granted_gpu_seconds = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "CI programme application"
        constraints = [
            # One open application per project; a decided one may be followed by another.
            models.UniqueConstraint(
                fields=["project"], condition=Q(status="pending"), name="projects_one_open_ci_application"
            ),
            models.CheckConstraint(
                condition=Q(granted_gpu_seconds__gte=0), name="projects_ci_granted_nonnegative"
            ),
        ]

    def __str__(self):
        return f"{self.project} CI programme ({self.status})"
