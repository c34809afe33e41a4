"""Calling a driver from a test the way the lifecycle does: with the start spec and the instance reference
that portal/instances/start_spec.py builds from the rows."""

from portal.instances.start_spec import instance_ref, start_spec_for


def start_on(driver, instance, gpus=(), **options):
    """driver.start for `instance` with `gpus` (Gpu rows), as instance_provision would call it."""
    return driver.start(start_spec_for(instance, host=driver.host, gpus=list(gpus)), **options)


__all__ = ["instance_ref", "start_on", "start_spec_for"]
