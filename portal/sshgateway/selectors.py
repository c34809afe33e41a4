"""Reads about SSH sessions, for idle culling and the pages."""

from datetime import timedelta

from django.db.models import Max
from django.utils import timezone

from .models import SshSession

# The gateway refreshes open sessions this often (server.HEARTBEAT_SECONDS); a session unrefreshed for
# longer than this lost its gateway and no longer counts as open.
OPEN_SESSION_FRESHNESS = timedelta(seconds=90)


def open_session_instance_ids(instance_ids) -> set:
    """Ids, among `instance_ids`, of instances someone is connected to over SSH right now."""
    fresh = timezone.now() - OPEN_SESSION_FRESHNESS
    return set(
        SshSession.objects.filter(instance_id__in=instance_ids, ended_at__isnull=True, last_seen_at__gte=fresh)
        .values_list("instance_id", flat=True)
        .distinct()
    )


def last_session_activity(instance_ids) -> dict:
    """instance id -> the last moment an SSH session of it was seen (its end, or its last heartbeat)."""
    rows = (
        SshSession.objects.filter(instance_id__in=instance_ids)
        .values("instance_id")
        .annotate(last=Max("last_seen_at"))
    )
    return {row["instance_id"]: row["last"] for row in rows}


def connection_help(user) -> dict:
    """What the settings page shows about SSH: the command, an example instance and the config block.

    Returns {"command", "example", "config", "available", "host_key"}; `available` is False when
    instances run with the local driver, which has no SSH; `host_key` is the gateway's
    host_key.PublishedKey (its known_hosts line and fingerprint, or a note when it has none yet).
    """
    from django.conf import settings

    from portal.instances.models import Instance

    from . import host_key
    from .access import HOSTNAME_PREFIX, gateway_command

    running = Instance.objects.filter(user=user, state=Instance.State.RUNNING).order_by("-created_at").first()
    example = running.short_id if running else "<instance>"
    config = (
        f"Host {HOSTNAME_PREFIX}gateway\n"
        f"    HostName {settings.SSH_GATEWAY_HOST}\n"
        f"    Port {settings.SSH_GATEWAY_PORT}\n"
        f"\n"
        f"Host {HOSTNAME_PREFIX}* !{HOSTNAME_PREFIX}gateway\n"
        f"    User developer\n"
        f"    ProxyJump {HOSTNAME_PREFIX}gateway\n"
    )
    return {
        "command": gateway_command(example),
        "example": f"{HOSTNAME_PREFIX}{running.short_id if running else '1a2b3c4d'}",
        "config": config,
        "available": getattr(settings, "DEVCLOUD_DRIVER", "docker") != "local",
        "host_key": host_key.published_key(
            private_path=settings.SSH_GATEWAY_HOST_KEY, host=settings.SSH_GATEWAY_HOST, port=settings.SSH_GATEWAY_PORT
        ),
    }
