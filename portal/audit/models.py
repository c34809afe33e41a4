from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models


class AuditEntry(models.Model):
    """One operator action: who, when, what (action and target) and why.

    Append-only: the database refuses UPDATE and DELETE (console migration 0002, which made the table
    before the model moved here). Written through services.audit_record, in the same transaction as the
    action it records.
    """

    # Who acted; null for actions the system took on its own (beat tasks, automatic approvals).
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The operator's name and address as they were when they acted, so the record reads right after
    # renames and account deletion.
    actor_name = models.CharField(max_length=300)
    # Short dotted code, e.g. "credits.adjust" or "host.drain"; see services.AUDIT_ACTIONS.
    action = models.CharField(max_length=50, db_index=True)
    # "app_label.model" of the object acted on, its primary key, and how it read at the time.
    target_type = models.CharField(max_length=100, blank=True, default="")
    target_id = models.CharField(max_length=64, blank=True, default="")
    target_repr = models.CharField(max_length=300, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    # Anything else worth keeping: amounts, previous and new values, counts.
    details = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        # The table and its index keep the names the console app gave them: the model moved, the rows and
        # the append-only trigger on them did not.
        db_table = "console_auditentry"
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["target_type", "target_id"], name="console_audit_target")]
        # Who may read the log is the console's business: its admin screen is a proxy of this model
        # (portal.console.models.AuditEntry) and holds the view permission operators' groups already have.
        # Permissions here would be a second "view audit entry" that no screen checks.
        default_permissions = ()

    def __str__(self):
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor_name} {self.action} {self.target_repr}".strip()
