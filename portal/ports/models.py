import hashlib

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from portal.instances.models import Instance

# The lab's and sshd's ports inside an instance (provisioning/drivers/docker.py, JUPYTER_PORT and
# SSH_PORT): the gateway already serves the first with its own rules, and the second is SSH's.
RESERVED_PORTS = (8888, 2222)
# Below this a port is privileged; the instance's user (uid 1000) cannot listen there anyway.
FIRST_PORT = 1024
LAST_PORT = 65535


def share_digest(secret: str) -> str:
    """What is stored of a share link's secret, and looked up by: its hex SHA-256."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


class ExposedPortQuerySet(models.QuerySet):
    def open(self):
        """Ports open now: not closed, on an instance that runs. A port is exposed only while its instance
        runs (services.port_expose), and once the instance stops or fails its ports are closed with it,
        whichever way it ended. (The gateway reads closed_at alone, to tell the owner the instance stopped.)"""
        return self.filter(closed_at__isnull=True, instance__state=Instance.State.RUNNING)


class ExposedPort(models.Model):
    """A port of an instance its owner opened to the web, at its own host name on the lab domain.

    Open while `closed_at` is empty and its instance runs (ExposedPort.objects.open()). Only the gateway
    reaches it, and only for the owner or a valid share link.
    """

    instance = models.ForeignKey("instances.Instance", on_delete=models.CASCADE, related_name="exposed_ports")
    port = models.PositiveIntegerField()
    # The first label of its host name, "<short id>-<port>": how the gateway finds this row from a Host.
    host_label = models.CharField(max_length=63)
    created_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    # The last request or open websocket the gateway carried to it; idle culling counts it as use.
    last_traffic_at = models.DateTimeField(null=True, blank=True)

    objects = ExposedPortQuerySet.as_manager()

    class Meta:
        ordering = ["port", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(port__gte=FIRST_PORT) & Q(port__lte=LAST_PORT) & ~Q(port__in=RESERVED_PORTS),
                name="ports_exposedport_port_allowed",
            ),
            models.UniqueConstraint(
                fields=["instance", "port"],
                condition=Q(closed_at__isnull=True),
                name="ports_exposedport_one_open_per_port",
            ),
            models.UniqueConstraint(
                fields=["host_label"],
                condition=Q(closed_at__isnull=True),
                name="ports_exposedport_one_open_per_host",
            ),
        ]

    def __str__(self):
        return f"{self.host_label} ({'closed' if self.closed_at else 'open'})"


class ShareLink(models.Model):
    """Lets anyone holding the link, or only the named `user`, reach one exposed port until `expires_at`.

    The link carries a random secret; only its SHA-256 is stored (`secret_digest`), so the table cannot
    hand out working links. Revoked, expired or with its port closed, it admits nobody.
    """

    exposed_port = models.ForeignKey(ExposedPort, on_delete=models.CASCADE, related_name="share_links")
    # Empty: anyone with the link. Set: that person only, signed in to the portal.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    secret_digest = models.CharField(max_length=64, unique=True)
    # The secret's first characters, so the owner can tell links apart in a list.
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gt=F("created_at")), name="ports_sharelink_expires_after_creation"
            ),
        ]

    def __str__(self):
        return f"{self.prefix}… for {self.exposed_port.host_label}"

    def active(self, now=None) -> bool:
        return self.revoked_at is None and self.expires_at > (now or timezone.now())
