import hashlib
import uuid
from decimal import Decimal

from django.contrib.auth.models import AbstractUser, BaseUserManager
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone


def normalise_email(email: str) -> str:
    """The form of an address that identifies a person: lower-case, no +tag, no dots for Gmail.

    Used only to decide whether someone already collected a one-per-person grant.
    """
    local, _, domain = email.strip().lower().rpartition("@")
    local = local.split("+", 1)[0]
    if domain in ("gmail.com", "googlemail.com"):
        local, domain = local.replace(".", ""), "gmail.com"
    return f"{local}@{domain}"


def email_fingerprint(email: str) -> str:
    """A one-way digest of the normalised address, kept after the account (and its address) is gone."""
    return hashlib.sha256(normalise_email(email).encode()).hexdigest()


def share_text(share: Decimal) -> str:
    """A queue share for people: '1', '2.5', '0.25'."""
    return f"{Decimal(share).normalize():f}"


class UserManager(BaseUserManager):
    use_in_migrations = True

    def _create_user(self, email, password, **extra_fields):
        if not email:
            raise ValueError("An email address is required.")
        user = self.model(email=self.normalize_email(email).lower(), **extra_fields)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def get_by_natural_key(self, username):
        # Addresses are stored lower-case; match what a person types in any case (admin login too).
        return self.get(email__iexact=username)

    def create_user(self, email, password=None, **extra_fields):
        extra_fields.setdefault("is_staff", False)
        extra_fields.setdefault("is_superuser", False)
        return self._create_user(email, password, **extra_fields)

    def create_superuser(self, email, password=None, **extra_fields):
        extra_fields.setdefault("is_staff", True)
        extra_fields.setdefault("is_superuser", True)
        return self._create_user(email, password, **extra_fields)


class User(AbstractUser):
    """A developer or operator. The email address is the login name."""

    username = None
    email = models.EmailField("email address", max_length=254, unique=True)
    # Set when the current address was confirmed; cleared when the address changes.
    email_verified_at = models.DateTimeField(null=True, blank=True)
    # An address the user asked to move to, waiting for its confirmation link.
    pending_email = models.EmailField(blank=True, default="")
    # Set when the user deleted their account: personal data is scrubbed, the ledger stays.
    deleted_at = models.DateTimeField(null=True, blank=True)
    # Set by an operator through user_suspend: the person can still log in and read their data, but
    # cannot launch or apply for bonus hours. The reason is shown to them; the name says who did it.
    suspended_at = models.DateTimeField(null=True, blank=True)
    suspended_reason = models.TextField(blank=True, default="")
    suspended_by_name = models.CharField(max_length=300, blank=True, default="")
    # Sizes (e.g. ["8x"]) an operator opened to this person beyond what their tier allows, changed only
    # through user_launch_sizes_set so that each change is audited. See portal.instances.entitlements.
    extra_sizes = models.JSONField(default=list, blank=True)
    # When the password was last changed or reset: a change revokes the credentials added from other
    # sessions since then (see services.password_changed).
    password_changed_at = models.DateTimeField(null=True, blank=True)
    # Names the person's workspace (volume or directory) and labels it: never reused, unlike the numeric
    # id, which a new account can get again after a database restore or on another install.
    workspace_key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # The account a project's robot tokens and keyless CI sign-ins act as (Project.bot): it has no
    # password and is never emailed, and what it launches is paid from its project's pool.
    project_bot = models.BooleanField(default=False)
    # This person's weight in the queue's fair share (portal/instances/queue.py): their recent GPU use is
    # divided by it, so a share of 2 queues as if they had used half as much. Operators set it.
    queue_share = models.DecimalField(
        max_digits=6,
        decimal_places=2,
        default=1,
        validators=[MinValueValidator(Decimal("0.01"))],
        help_text="Weight in the queue's fair share (default 1): recent GPU use is divided by it, so 2 "
        "queues this person as if they had used half as much, 0.5 as if twice as much.",
    )

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    objects = UserManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(Lower("email"), name="accounts_user_email_ci_unique"),
            # A suspension always carries the reason the person is shown.
            models.CheckConstraint(
                condition=models.Q(suspended_at__isnull=True) | ~models.Q(suspended_reason=""),
                name="accounts_user_suspension_has_reason",
            ),
            # A share of 0 would divide by zero; "never" is what suspension is for.
            models.CheckConstraint(
                condition=models.Q(queue_share__gt=0), name="accounts_user_queue_share_positive"
            ),
        ]

    def __str__(self):
        return self.email

    def save(self, *args, **kwargs):
        # Addresses are stored lower-case, so "Alice@X" and "alice@x" are one account.
        self.email = (self.email or "").strip().lower()
        super().save(*args, **kwargs)

    @property
    def email_verified(self) -> bool:
        return self.email_verified_at is not None

    @property
    def is_suspended(self) -> bool:
        return self.suspended_at is not None

    @property
    def suspension_notice(self) -> str:
        """What a suspended person reads wherever they are refused; '' when not suspended."""
        if not self.is_suspended:
            return ""
        # The operator may or may not end the reason with a full stop; the sentence adds its own.
        reason = self.suspended_reason.strip().rstrip(".")
        return f"Your account is suspended: {reason}. Contact support to lift it."


class SshKeyQuerySet(models.QuerySet):
    def trusted(self, now=None):
        """Keys that still open doors: no expiry, or one still ahead."""
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now or timezone.now()))


class SshKey(models.Model):
    """An SSH public key a developer uploaded; injected into instances they launch."""

    objects = SshKeyQuerySet.as_manager()

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    key_type = models.CharField(max_length=40)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    # Which session or API token added the key (services.origin_of_session / origin_of_token), so a
    # password change can revoke what a stolen session added; "" for keys older than this field.
    added_from = models.CharField(max_length=64, blank=True, default="")
    # When the key stops being trusted and is removed (tasks.prune_expired_ssh_keys); None: never. A key
    # made for one `devcloud run` expires with the run, so a CLI killed before it could remove the key
    # leaves nothing behind for long.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [models.UniqueConstraint(fields=["user", "fingerprint"], name="accounts_sshkey_unique_per_user")]

    def __str__(self):
        return f"{self.name} ({self.fingerprint})"
