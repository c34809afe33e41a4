"""What DevCloud told a user, and which optional emails the user turned off.

A Notification is recorded once per event: (user, kind, event_key) is unique in the database, so
however many workers report the same stop or the same low balance, the user hears about it once.
"""

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q


class Kind(models.TextChoices):
    CREDIT_LOW_1H = "credit_low_1h", "About 1 hour of credit left"
    CREDIT_LOW_10M = "credit_low_10m", "About 10 minutes of credit left"
    INSTANCE_STOPPED = "instance_stopped", "Instance stopped by DevCloud"
    # Sent by idle culling before the grace period ends (docs/architecture.md, "Idle culling and SSH").
    INSTANCE_IDLE_WARNING = "instance_idle_warning", "Idle instance about to be stopped"
    # Sent by the limits beat before a session's longest length stops it (portal/instances/limits.py).
    SESSION_ENDING = "session_ending", "Session about to reach its time limit"
    LAUNCH_FAILED = "launch_failed", "Launch failed"
    BONUS_DECISION = "bonus_decision", "Bonus application decided"
    ACCOUNT_SUSPENDED = "account_suspended", "Account suspended"
    # A GPU an instance holds was drained by its health check (provisioning/gpu_health.py).
    GPU_UNHEALTHY = "gpu_unhealthy", "A GPU of your instance is failing"
    # Told to every owner of the project (portal/projects/ci_grants.py).
    CI_GRANT_DECISION = "ci_grant_decision", "CI programme application decided"
    # A booking's window ends soon while instances run in it (portal/instances/reservations.py).
    RESERVATION_ENDING = "reservation_ending", "Booking about to end"
    # An operator cancelled a booking, with a reason.
    RESERVATION_CANCELLED = "reservation_cancelled", "Booking cancelled by an operator"


# Kinds a user may stop receiving by email. The credit warnings are advance notice only: when credit
# does run out the instance_stopped email (mandatory) still says so. Every other kind reports
# something that already happened to the user's sessions, credits or account, or (the idle warning)
# is the user's last chance to keep a session, so it is always sent.
OPTIONAL_KINDS = (Kind.CREDIT_LOW_1H, Kind.CREDIT_LOW_10M)


class Notification(models.Model):
    """One event told to one user: shown on the dashboard, and emailed unless the user turned the kind off.

    Email delivery is at most once: a sender claims the row by setting emailed_at (a conditional
    UPDATE on emailed_at IS NULL) before it sends, and gives the claim back only when the send
    raised. A worker killed between the claim and the send loses that email; the dashboard still has it.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=40, choices=Kind.choices)
    # Names the event, e.g. "instance:<uuid>:stopped". Conventions are in services.py.
    event_key = models.CharField(max_length=200)
    # What the templates need to say what happened (reason, hours, instance name...). JSON only.
    context = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)
    # False when the user had turned this optional kind off, or the account has no address to write to.
    email_enabled = models.BooleanField(default=True)
    # When a sender claimed the email; the email was handed to the mail server then, unless the worker died.
    emailed_at = models.DateTimeField(null=True, blank=True)
    email_attempts = models.PositiveSmallIntegerField(default=0)
    # Why the last attempt failed; kept after a later attempt succeeds, as the delivery's history.
    email_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "kind", "event_key"], name="notifications_once_per_event"
            ),
        ]
        indexes = [
            models.Index(fields=["user", "-created_at"], name="notifications_user_recent"),
            models.Index(
                fields=["user"], condition=Q(read_at__isnull=True), name="notifications_user_unread"
            ),
        ]

    def __str__(self):
        return f"{self.get_kind_display()} for {self.user_id} ({self.event_key})"

    @property
    def is_unread(self) -> bool:
        return self.read_at is None


class EmailOptOut(models.Model):
    """The user does not want emails of this optional kind. The dashboard still lists them."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_opt_outs"
    )
    kind = models.CharField(max_length=40, choices=Kind.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], name="notifications_one_opt_out_per_kind"),
            # Mandatory kinds cannot be turned off, whatever writes the row.
            models.CheckConstraint(
                condition=Q(kind__in=[kind.value for kind in OPTIONAL_KINDS]),
                name="notifications_opt_out_optional_only",
            ),
        ]

    def __str__(self):
        return f"{self.user_id} has no {self.kind} emails"
