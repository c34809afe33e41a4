"""This install's id: what sets its Docker objects, Slurm jobs and start slots apart from another install's.

Every install gets a random id (`dc-<12 hex>`) the first time its database is migrated, stored in the one
provisioning.Installation row, so it goes with the data: `make clean` or a fresh database gets a new one,
a second install on the same engine another. A database that already held hosts or workspaces when the
row was made keeps "devcloud", the id it ran under before, so its running containers stay its own.

DEVCLOUD_PORTAL_ID, when set, overrides the stored id (an operator who runs several installs against one
engine and wants to choose the names; tests give each test its own).
"""

import secrets

from django.conf import settings
from django.db import IntegrityError, transaction

# The id every install used before ids were made per install.
LEGACY_INSTALL_ID = "devcloud"

_cached: str | None = None


def new_install_id() -> str:
    return f"dc-{secrets.token_hex(6)}"


def install_id() -> str:
    """DEVCLOUD_PORTAL_ID when set, else the stored id (made now if the row is missing)."""
    global _cached
    override = getattr(settings, "DEVCLOUD_PORTAL_ID", "")
    if override:
        return override
    if _cached is None:
        _cached = _stored()
    return _cached


def forget() -> None:
    """Drops the id this process read, so the next call reads the row again (tests switch it)."""
    global _cached
    _cached = None


def _stored() -> str:
    from .models import Installation

    row = Installation.objects.filter(pk=1).first()
    if row is not None:
        return row.install_id
    try:
        with transaction.atomic():
            return Installation.objects.create(pk=1, install_id=new_install_id()).install_id
    except IntegrityError:
        # Another process made it first.
        return Installation.objects.get(pk=1).install_id
