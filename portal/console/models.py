from django.db import models

from portal.audit import models as audit_models


class AuditEntry(audit_models.AuditEntry):
    """The audit log's screen in Django admin, and nothing else: code that writes or reads the log uses
    portal.audit. Django names an admin screen's URLs and permissions after its model's app and name, so
    this proxy keeps /admin/console/auditentry/ and the console.view_auditentry permission that operators'
    groups already hold (and that the console's audit page checks)."""

    class Meta:
        proxy = True
        verbose_name_plural = "audit entries"


class CapacitySample(models.Model):
    """The fleet at one moment, recorded by the beat task console.record_sample for the dashboard's charts."""

    taken_at = models.DateTimeField(db_index=True)
    # Present GPUs of hosts that are not retired.
    gpus_total = models.PositiveIntegerField()
    # Of those, GPUs held by a live allocation.
    gpus_allocated = models.PositiveIntegerField()
    # Launches waiting for GPUs, and how long the oldest of them has waited.
    queue_length = models.PositiveIntegerField()
    oldest_queued_wait_seconds = models.PositiveIntegerField()
    running_instances = models.PositiveIntegerField()

    class Meta:
        ordering = ["-taken_at"]

    def __str__(self):
        return (
            f"{self.taken_at:%Y-%m-%d %H:%M} {self.gpus_allocated}/{self.gpus_total} GPUs, "
            f"{self.queue_length} queued"
        )


class OperatorAction(models.Model):
    """No table: the holder of one permission per operator action (Meta.permissions), so an operator can
    be given "suspend users" without "change users", which would also let them edit permissions,
    staff and superuser flags and passwords. The "Operators" group holds them (migration 0004,
    portal.console.operators)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("suspend_user", "Can suspend a user"),
            ("unsuspend_user", "Can lift a user's suspension"),
            ("open_launch_sizes", "Can open or close launch sizes for one user"),
            ("adjust_credits", "Can grant or correct a user's credits"),
            ("review_bonus", "Can approve or reject bonus applications and import certificate IDs"),
            ("drain_host", "Can drain a GPU host"),
            ("evict_host", "Can cordon a GPU host and evict its instances"),
            ("retire_host", "Can retire a GPU host"),
            ("activate_host", "Can put a GPU host back into service"),
            ("discover_gpus", "Can run GPU discovery on a host"),
            ("check_engine", "Can check a host's Docker engine"),
            ("ensure_images", "Can pre-pull or build images on hosts"),
            ("force_stop_instance", "Can force-stop an instance"),
        ]


class PeriodicTaskRun(models.Model):
    """When a beat task last started and last finished well, one row per task name.

    Written by the worker around every run of a task in CELERY_BEAT_SCHEDULE (portal.console.instrumentation),
    read by the health checks: beat and a worker are alive when each task ran within two of its periods.
    """

    task_name = models.CharField(max_length=200, unique=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    # The last run that returned without raising.
    last_succeeded_at = models.DateTimeField(null=True, blank=True)
    last_duration_seconds = models.FloatField(null=True, blank=True)
    # The exception class of the last failed run, if the last run failed; empty otherwise.
    last_error = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["task_name"]

    def __str__(self):
        return f"{self.task_name} (last finished {self.last_finished_at})"
