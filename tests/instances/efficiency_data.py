"""Instances with the GPU readings and charges the efficiency tests need, shared by the instances,
credits and console tests."""

from datetime import timedelta

from django.utils import timezone

from portal.instances.models import Image, Instance
from provisioning.drivers import fake


def image(key="cpu"):
    return Image.objects.filter(key=key).first() or fake.make_image(key)


def running_instance(user, *, size="1x", ready_ago=timedelta(seconds=30), image_key="cpu", **fields):
    """A RUNNING instance of `user`'s, ready `ready_ago` ago, with `fields` (charges, readings) set."""
    return Instance.objects.create(
        user=user,
        size=size,
        image=image(image_key),
        state=Instance.State.RUNNING,
        ready_at=timezone.now() - ready_ago,
        driver_state={"endpoint": "http://127.0.0.1:9"},
        jupyter_token="token",
        **fields,
    )
