"""sample_record and the console.record_sample beat task: the fleet and queue measured from real rows."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.console.models import CapacitySample
from portal.console.services import sample_record
from portal.console.tasks import record_sample
from portal.instances.models import Instance
from provisioning.models import GpuAllocation, GpuHost

from .conftest import launch, make_host

State = Instance.State


@pytest.fixture
def fleet(alice, bob, image):
    """Two active hosts (8 GPUs, and 8 with one gone), a draining and a retired host, and launches on them."""
    now = timezone.now()
    gpu_01 = make_host("gpu-01")
    gpu_02 = make_host("gpu-02", absent=1)
    draining = make_host("gpu-03", gpus=2, state=GpuHost.State.DRAINING)
    retired = make_host("gpu-04", state=GpuHost.State.RETIRED)
    # 8x on gpu-01, a 1x and a stopped (released) 1x on gpu-02, a 1x on the draining host.
    launch(alice, image, state=State.RUNNING, size="8x", gpus=list(gpu_01.gpus.all()))
    launch(bob, image, state=State.RUNNING, gpus=[gpu_02.gpus.get(node_id=1)])
    stopped = launch(bob, image, state=State.STOPPED, gpus=[gpu_02.gpus.get(node_id=2)])
    GpuAllocation.objects.filter(instance=stopped).update(released_at=now)
    launch(alice, image, state=State.PROVISIONING, gpus=[draining.gpus.get(node_id=1)])
    # A leftover live allocation on a retired host is not in service, so not counted either way.
    launch(bob, image, state=State.STOPPING, gpus=[retired.gpus.get(node_id=1)])
    # Three queued launches; the oldest has waited 15 minutes.
    launch(alice, image, created_at=now - timedelta(minutes=15))
    launch(bob, image, created_at=now - timedelta(minutes=4))
    launch(bob, image, size="8x", created_at=now - timedelta(seconds=30))
    launch(alice, image, state=State.FAILED)
    return now


def test_it_counts_gpus_in_service_and_held(fleet):
    sample = sample_record(now=fleet)

    # 8 + 7 present on the active hosts + 2 draining; the retired host's 8 are out of service.
    assert sample.gpus_total == 17
    # 8 (8x) + 1 (1x on gpu-02) + 1 (draining host); the released GPU and the retired host's are not held.
    assert sample.gpus_allocated == 10
    assert sample.running_instances == 2


def test_it_measures_the_queue_and_its_oldest_wait(fleet):
    sample = sample_record(now=fleet)

    assert sample.queue_length == 3
    assert 15 * 60 - 1 <= sample.oldest_queued_wait_seconds <= 15 * 60 + 1


def test_it_stores_the_sample_at_the_given_time(fleet):
    sample = sample_record(now=fleet)

    stored = CapacitySample.objects.get()
    assert stored.pk == sample.pk and stored.taken_at == fleet


def test_it_follows_the_fleet_as_it_changes(fleet):
    first = sample_record(now=fleet)
    GpuAllocation.objects.filter(released_at__isnull=True).update(released_at=fleet)
    Instance.objects.filter(state=State.QUEUED).update(state=State.FAILED)
    second = sample_record(now=fleet + timedelta(minutes=5))

    assert (first.gpus_allocated, second.gpus_allocated) == (10, 0)
    assert (second.queue_length, second.oldest_queued_wait_seconds) == (0, 0)
    assert CapacitySample.objects.count() == 2


def test_it_samples_an_empty_fleet(db):
    sample = sample_record()

    assert (sample.gpus_total, sample.gpus_allocated, sample.queue_length, sample.running_instances) == (
        0,
        0,
        0,
        0,
    )


def test_the_beat_task_records_a_sample(fleet):
    sample_id = record_sample.delay().get()

    sample = CapacitySample.objects.get(pk=sample_id)
    assert (sample.gpus_total, sample.gpus_allocated, sample.queue_length) == (17, 10, 3)
    assert record_sample.name == "console.record_sample"
