"""Instance backends behind one small interface (see base.Driver)."""

from django.conf import settings
from django.utils.module_loading import import_string

DRIVERS = {
    "docker": "provisioning.drivers.docker.DockerDriver",
    "local": "provisioning.drivers.local.LocalDriver",
    "slurm": "provisioning.drivers.slurm.SlurmDriver",
    # Test double that fails in set ways (slow, never ready, crashes, engine down).
    "fake": "provisioning.drivers.fake.FakeDriver",
}


def driver_for(host, name: str | None = None):
    """The driver for a place: a Slurm partition's is always the slurm driver; a host's is `name`, which
    defaults to settings.DEVCLOUD_DRIVER."""
    if getattr(host, "backend", "docker") == "slurm":
        name = "slurm"
    return import_string(DRIVERS[name or settings.DEVCLOUD_DRIVER])(host)
