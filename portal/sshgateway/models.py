from django.conf import settings
from django.db import models
from django.utils import timezone


class SshSession(models.Model):
    """One connection the SSH gateway forwarded to an instance's sshd (one `ssh -J` hop), for the operator.

    Written only by the gateway (portal.sshgateway.services): opened when it connects to the instance,
    its byte counts and last_seen_at refreshed while it lasts (the heartbeat), ended_at set when either
    side closes. A row whose gateway died keeps ended_at empty, but its last_seen_at stops moving: only
    a recent heartbeat makes a session count as open (selectors.open_session_instance_ids).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="ssh_sessions")
    instance = models.ForeignKey("instances.Instance", on_delete=models.PROTECT, related_name="ssh_sessions")
    # The account key the person authenticated with at the gateway (SHA256:..., as ssh-keygen -l prints).
    key_fingerprint = models.CharField(max_length=100)
    key_name = models.CharField(max_length=100, blank=True, default="")
    # Where the client came from, as the gateway saw it ("203.0.113.7:51234").
    client_address = models.CharField(max_length=100, blank=True, default="")
    # Which gateway process carried it ("<hostname>:<pid>").
    gateway = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_seen_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Bytes from the person's client to the instance, and back (the SSH stream, encrypted end to end).
    bytes_from_client = models.BigIntegerField(default=0)
    bytes_to_client = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["instance", "ended_at"])]
        verbose_name = "SSH session"

    def __str__(self):
        return f"{self.user} -> {self.instance.short_id} at {self.started_at:%Y-%m-%d %H:%M}"
