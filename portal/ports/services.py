"""Exposing an instance's port, closing it, and the share links that let others reach it.

Every change is written to the audit log in its own transaction. The owner is the only one who may do any
of these: anyone else's request is answered as if the instance did not exist (Http404).
"""

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone

from portal.audit.services import audit_record
from portal.instances.models import Instance
from portal.instances.selectors import instance_of_owner

from .addresses import host_label
from .models import FIRST_PORT, LAST_PORT, RESERVED_PORTS, ExposedPort, ShareLink, share_digest
from .selectors import open_port_of

# A share link lives at most this long, and a day unless its maker says otherwise.
SHARE_MAX_HOURS = 24 * 30
SHARE_DEFAULT_HOURS = 24


def port_check(port) -> int:
    """Returns `port` as an int when it may be exposed. Raises ValidationError (code "port") otherwise."""
    if isinstance(port, bool) or not isinstance(port, int):
        try:
            port = int(str(port))
        except ValueError:
            raise ValidationError("A port is a whole number, such as 8000.", code="port") from None
    if port in RESERVED_PORTS:
        raise ValidationError(
            f"Port {port} is the instance's own JupyterLab or SSH port; expose the port your app listens on.",
            code="port",
        )
    if not FIRST_PORT <= port <= LAST_PORT:
        raise ValidationError(f"Expose a port from {FIRST_PORT} to {LAST_PORT}.", code="port")
    return port


def port_expose(*, user, instance_id, port) -> ExposedPort:
    """Opens `port` of the owner's running instance at its own address (addresses.port_url). Returns the
    ExposedPort; exposing an open port again returns it unchanged.

    Raises Http404 for an unknown or someone else's instance, ValidationError with code "port" for a port
    that may not be exposed, "ended" when the instance is not running and "ports_unavailable" when its backend
    gives the gateway no way to reach its ports.
    """
    port = port_check(port)
    instance = instance_of_owner(user, instance_id)
    if instance.state != Instance.State.RUNNING:
        raise ValidationError(
            f"This instance is {instance.state}; ports can be exposed only while it runs.", code="ended"
        )
    if not (instance.driver_state or {}).get("address"):
        raise ValidationError(
            "The gateway cannot reach the ports of this instance (its backend does not say where they "
            "are, or it started before ports could be exposed). Launch a new instance to expose ports.",
            code="ports_unavailable",
        )
    existing = ExposedPort.objects.filter(instance=instance, port=port, closed_at__isnull=True).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            exposed = ExposedPort.objects.create(
                instance=instance, port=port, host_label=host_label(instance.short_id, port)
            )
            audit_record(actor=user, action="port.expose", target=instance, details={"port": port})
    except IntegrityError:
        # A concurrent request exposed it first (or, once in four billion, another instance with the same
        # short id holds the name).
        existing = ExposedPort.objects.filter(instance=instance, port=port, closed_at__isnull=True).first()
        if existing is None:
            raise ValidationError(
                "Another instance holds this port's address; launch a new instance to expose it.",
                code="ports_unavailable",
            ) from None
        return existing
    return exposed


def port_close(*, user, instance_id, port) -> ExposedPort:
    """Closes the owner's exposed `port`: the gateway refuses it from the next request, share links
    included. Returns the closed row. Raises Http404 when the port is not open (or not the user's)."""
    instance = instance_of_owner(user, instance_id)
    exposed = open_port_of(instance, port_check(port))
    with transaction.atomic():
        # Conditional, so of two closes at once one records it.
        closed = ExposedPort.objects.filter(id=exposed.id, closed_at__isnull=True).update(
            closed_at=timezone.now()
        )
        if closed:
            audit_record(actor=user, action="port.close", target=instance, details={"port": exposed.port})
    exposed.refresh_from_db()
    return exposed


def share_create(
    *, user, instance_id, port, hours=SHARE_DEFAULT_HOURS, email: str = ""
) -> tuple[ShareLink, str]:
    """Makes a share link for the owner's exposed `port`, valid for `hours`: for anyone holding it, or
    only for the person signed in as `email` when given.

    Returns (the ShareLink, its secret). The secret is shown once; only its digest is kept. Raises
    Http404 when the port is not open, ValidationError (code "hours") for hours out of range, or an
    email that names no active person other than the owner (code "email").
    """
    instance = instance_of_owner(user, instance_id)
    exposed = open_port_of(instance, port_check(port))
    if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= SHARE_MAX_HOURS:
        raise ValidationError(f"A share link lasts from 1 to {SHARE_MAX_HOURS} hours.", code="hours")
    shared_with = None
    if email:
        shared_with = (
            get_user_model()
            .objects.filter(email__iexact=email.strip(), is_active=True)
            .exclude(pk=user.pk)
            .first()
        )
        if shared_with is None:
            raise ValidationError(
                f"There is no other DevCloud account with the address {email}.", code="email"
            )
    secret = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        link = ShareLink.objects.create(
            exposed_port=exposed,
            user=shared_with,
            secret_digest=share_digest(secret),
            prefix=secret[:8],
            created_at=now,
            expires_at=now + timedelta(hours=hours),
        )
        audit_record(
            actor=user,
            action="share.create",
            target=instance,
            details={
                "port": exposed.port,
                "share_link": link.id,
                "for": shared_with.email if shared_with else "anyone with the link",
                "expires_at": link.expires_at,
            },
        )
    return link, secret


def share_revoke(*, user, instance_id, share_id: int) -> ShareLink:
    """Revokes one of the owner's share links; the gateway refuses it from the next request. Returns it.
    Revoking twice is harmless. Raises Http404 for a link that is not one of the owner's instance's."""
    instance = instance_of_owner(user, instance_id)
    link = (
        ShareLink.objects.filter(id=share_id, exposed_port__instance=instance)
        .select_related("exposed_port")
        .first()
    )
    if link is None:
        raise Http404("No such share link.")
    with transaction.atomic():
        revoked = ShareLink.objects.filter(id=link.id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:
            audit_record(
                actor=user,
                action="share.revoke",
                target=instance,
                details={"port": link.exposed_port.port, "share_link": link.id},
            )
    link.refresh_from_db()
    return link
