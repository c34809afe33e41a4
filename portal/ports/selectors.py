"""Reads about exposed ports and their share links, for the pages, the API and idle culling."""

from django.db.models import Max
from django.http import Http404

from .models import ExposedPort, ShareLink


def open_ports_of(instance) -> list[ExposedPort]:
    """The instance's open ports, lowest first: none once it stopped."""
    return list(ExposedPort.objects.open().filter(instance=instance))


def open_port_of(instance, port: int) -> ExposedPort:
    """The instance's open ExposedPort for `port`. Raises Http404 when that port is not exposed."""
    exposed = ExposedPort.objects.open().filter(instance=instance, port=port).first()
    if exposed is None:
        raise Http404(f"Port {port} of this instance is not exposed.")
    return exposed


def share_links_of(exposed: ExposedPort) -> list[ShareLink]:
    """Every share link of the port, newest first, revoked and expired ones included."""
    return list(exposed.share_links.select_related("user"))


def last_port_traffic(instance_ids) -> dict:
    """instance id -> the last moment the gateway carried traffic to any of its exposed ports."""
    rows = (
        ExposedPort.objects.filter(instance_id__in=instance_ids, last_traffic_at__isnull=False)
        .values("instance_id")
        .annotate(last=Max("last_traffic_at"))
    )
    return {row["instance_id"]: row["last"] for row in rows}
