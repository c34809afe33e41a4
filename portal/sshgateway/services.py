"""State changes of the SSH gateway: session records, and the owner's keys inside running instances.

Keys inside an instance: its sshd trusts ~/.ssh/authorized_keys, and the portal keeps that file equal to
the owner's keys on their account. It is written before the container first starts (the lifecycle puts
authorized_keys_text in the driver's start spec), again at once after every key added or removed
(push_user_keys, from a Celery task queued on commit), and by beat every SSH_KEYS_SYNC_SECONDS for whatever a push missed. The
gateway itself checks the person's current keys on every connection, so a removed key is refused at the
first hop at once, whatever the instance still holds.
"""

import logging
from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from portal.accounts.models import SshKey
from portal.instances.models import Instance

from .models import SshSession

logger = logging.getLogger(__name__)

# --- Session records ------------------------------------------------------------------------------


def session_open(*, route, client_address: str, gateway: str) -> SshSession:
    """Record that the gateway connected `route` (an access.Route) for a client. Returns the SshSession."""
    now = timezone.now()
    return SshSession.objects.create(
        user_id=route.user_id,
        instance_id=route.instance_id,
        key_fingerprint=route.key_fingerprint,
        key_name=route.key_name,
        client_address=client_address,
        gateway=gateway,
        started_at=now,
        last_seen_at=now,
    )


def session_progress(*, session_id: int, bytes_from_client: int, bytes_to_client: int, ended: bool) -> None:
    """Store the byte counts so far and refresh the heartbeat; with `ended`, the session is over."""
    now = timezone.now()
    changes = {
        "bytes_from_client": bytes_from_client,
        "bytes_to_client": bytes_to_client,
        "last_seen_at": now,
    }
    if ended:
        changes["ended_at"] = now
    SshSession.objects.filter(pk=session_id, ended_at__isnull=True).update(**changes)


def sessions_close_stale(*, older_than: timedelta) -> int:
    """End sessions whose gateway stopped reporting (it died), as of their last heartbeat. Returns how many."""
    cutoff = timezone.now() - older_than
    return SshSession.objects.filter(ended_at__isnull=True, last_seen_at__lt=cutoff).update(
        ended_at=F("last_seen_at")
    )


# --- The owner's keys inside instances -------------------------------------------------------------


def authorized_keys_text(user_id) -> str:
    """The authorized_keys file for the instances of this person: their account keys that have not
    expired, one per line."""
    lines = (
        SshKey.objects.trusted().filter(user_id=user_id, user__is_active=True).order_by("created_at", "pk")
    )
    return "".join(f"{line}\n" for line in lines.values_list("public_key", flat=True))


def _ssh_instances(**filters):
    return Instance.objects.filter(
        state__in=[Instance.State.PROVISIONING, Instance.State.RUNNING],
        driver__in=["docker", "slurm"],
        **filters,
    ).select_related("host")


def push_keys_to(instance, text: str) -> bool:
    """Write `text` as the instance's authorized_keys through its host's engine. Returns whether it did;
    an instance whose container is gone, or an engine that does not answer, is logged and skipped (the
    next sync tries again)."""
    from portal.instances.start_spec import instance_ref
    from provisioning.drivers import driver_for
    from provisioning.drivers.base import DriverError

    if instance.host is None:
        return False
    try:
        return driver_for(instance.host, instance.driver).authorized_keys_set(instance_ref(instance), text)
    except DriverError as error:
        logger.warning("Could not update the SSH keys of instance %s: %s", instance.id, error.message)
        return False


def push_user_keys(*, user_id) -> int:
    """Make every running instance of the person trust exactly their current keys. Returns how many
    instances were updated."""
    text = authorized_keys_text(user_id)
    return sum(push_keys_to(instance, text) for instance in _ssh_instances(user_id=user_id))


def push_all_keys() -> int:
    """push_user_keys for everyone with a running instance (beat's safety net). Returns instances updated."""
    texts: dict = {}
    updated = 0
    for instance in _ssh_instances():
        if instance.user_id not in texts:
            texts[instance.user_id] = authorized_keys_text(instance.user_id)
        updated += push_keys_to(instance, texts[instance.user_id])
    return updated


def keys_changed(*, user_id) -> None:
    """Call after a person's keys changed (inside the transaction that changed them): once it commits, a
    worker pushes the new set into their running instances (or this process does, if the broker is down)."""
    from django.db import transaction

    from portal.lib.tasks import publish

    from .tasks import push_keys

    transaction.on_commit(
        lambda: publish(push_keys, args=[user_id], inline=lambda: push_user_keys(user_id=user_id))
    )
