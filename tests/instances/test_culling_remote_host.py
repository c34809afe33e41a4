"""Idle culling counts GPU use on a host it reaches only through its engine (mutual TLS): gpu_busy_percent is
read on the host by a helper container, and a busy GPU keeps the instance.

The host is the one of test_remote_host.py: this machine's dockerd behind mutual TLS, with a stand-in
tree whose gpu_busy_percent files the test writes, as amdgpu would.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import culling
from portal.instances.models import Instance, InstanceEvent, LaunchPolicy
from provisioning.models import GpuAllocation
from tests.provisioning.test_remote_host import host_root, launch, remote_host, set_gpu_busy  # noqa: F401
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401
    wait_for_jupyter,
)
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


def busy_readers_started(since, portal_id) -> int:
    """How many helper containers reading gpu_busy_percent the engine started for this portal since `since`."""
    events = docker_client().events(
        since=since,
        until=timezone.now() + timedelta(seconds=1),
        filters={
            "type": "container",
            "event": "start",
            "label": [f"devcloud.portal={portal_id}", "devcloud.helper=hostfs", "devcloud.helper.reads=busy"],
        },
        decode=True,
    )
    return sum(1 for _ in events)


def test_it_counts_a_busy_gpu_on_a_remote_host_as_use_when_culling(
    alice, remote_host, host_root, cpu_image, django_capture_on_commit_callbacks, docker_portal
):
    policy = LaunchPolicy.current()
    policy.idle_minutes = {"1x": 60, "8x": 30}
    policy.idle_grace_minutes = 10
    policy.save()
    instance, gpu, result = launch(alice, remote_host, cpu_image, 152)
    wait_for_jupyter(result.endpoint, instance)
    GpuAllocation.objects.create(gpu=gpu, instance=instance)
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING, ready_at=timezone.now(), driver_state={"endpoint": result.endpoint}
    )
    test_began = timezone.now() - timedelta(seconds=2)
    later = timezone.now() + timedelta(minutes=61)

    # Idle on JupyterLab and on the GPU, as the host reads it: past the idle time, the owner is warned.
    with django_capture_on_commit_callbacks(execute=True):
        idle = culling.cull_idle(later)

    assert (idle.checked, idle.busy, idle.warned) == (1, 0, 1)
    # Read on the host, by a helper container its engine ran for the round.
    assert busy_readers_started(test_began, docker_portal) == 1

    # A job from a shell keeps the GPU busy: the host says so through its engine, and the instance is kept.
    set_gpu_busy(host_root, 152, 80)
    with django_capture_on_commit_callbacks(execute=True):
        busy = culling.cull_idle(later)

    assert (busy.checked, busy.busy, busy.warned, busy.stopped) == (1, 1, 0, 0)
    assert InstanceEvent.objects.filter(instance=instance, message__startswith="GPUs busy (80%)").exists()
    assert busy_readers_started(test_began, docker_portal) == 2
