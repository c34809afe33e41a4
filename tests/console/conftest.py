"""Console fixtures. Personas (alice, bob, olivia the operator) come from tests/conftest.py."""

from contextlib import contextmanager
from datetime import timedelta
from unittest import mock

import pytest

from portal.instances.models import Image, Instance
from provisioning.models import Gpu, GpuAllocation, GpuHost


@pytest.fixture
def image(db):
    return Image.objects.create(
        key="cpu-test", name="CPU test", sizes=["1x", "8x"], reference="devcloud/cpu:test"
    )


def make_host(name, *, gpus=8, state=GpuHost.State.ACTIVE, absent=0):
    """A host with `gpus` GPUs, the last `absent` of them no longer present."""
    host = GpuHost.objects.create(name=name, state=state)
    for node in range(gpus):
        Gpu.objects.create(
            host=host,
            node_id=node + 1,
            gpu_id=1000 + node,
            render_minor=128 + 8 * node,
            is_present=node < gpus - absent,
        )
    return host


def launch(
    user, image, *, state=Instance.State.QUEUED, size="1x", gpus=(), created_at=None, first_gpu_at=None
):
    """An instance in `state`, holding `gpus` (live allocations) and created at `created_at`."""
    instance = Instance.objects.create(user=user, image=image, size=size, state=state)
    if created_at is not None:
        Instance.objects.filter(pk=instance.pk).update(created_at=created_at)
    for gpu in gpus:
        allocation = GpuAllocation.objects.create(gpu=gpu, instance=instance)
        if first_gpu_at is not None:
            GpuAllocation.objects.filter(pk=allocation.pk).update(allocated_at=first_gpu_at)
    instance.refresh_from_db()
    return instance


def ago(now, **delta):
    return now - timedelta(**delta)


@contextmanager
def clock_at(moment):
    """Rows created inside get `moment` as their auto_now_add timestamp (ledger and audit rows cannot be
    updated afterwards: the database refuses)."""
    with mock.patch("django.utils.timezone.now", return_value=moment):
        yield
