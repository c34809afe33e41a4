"""Instance backends behind one small interface (see base.Driver)."""

from django.conf import settings
from django.utils.module_loading import import_string

DRIVERS = {
    "docker": "provisioning.drivers.docker.DockerDriver",
    "local": "provisioning.drivers.local.LocalDriver",
    # Test double that fails in set ways (slow, never ready, crashes, engine down).
    "fake": "provisioning.drivers.fake.FakeDriver",
}


def driver_for(host, name: str | None = None):
    """The driver for a host. `name` defaults to settings.DEVCLOUD_DRIVER."""
    return import_string(DRIVERS[name or settings.DEVCLOUD_DRIVER])(host)
