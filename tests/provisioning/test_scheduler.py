"""Placement rules: 1x packs, 8x takes a whole free host, only ACTIVE hosts get work, FIFO queue."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.instances.models import Instance
from provisioning.models import Gpu, GpuAllocation, GpuHost
from provisioning.scheduler import SchedulerError, allocate, next_queued, release

pytestmark = pytest.mark.django_db


def fill(host, count, user, host_queued_instance):
    """Give `count` 1x instances GPUs on `host`, with every other host drained meanwhile."""
    states = dict(GpuHost.objects.values_list("pk", "state"))
    GpuHost.objects.exclude(pk=host.pk).update(state=GpuHost.State.DRAINING)
    GpuHost.objects.filter(pk=host.pk).update(state=GpuHost.State.ACTIVE)
    for _ in range(count):
        instance = host_queued_instance(user)
        allocations = allocate(instance_id=instance.pk)
        assert allocations and allocations[0].gpu.host_id == host.pk
    for pk, state in states.items():
        GpuHost.objects.filter(pk=pk).update(state=state)


def used_on(host) -> int:
    return GpuAllocation.objects.filter(gpu__host=host, released_at__isnull=True).count()


def test_it_packs_a_1x_onto_the_fullest_host_with_room(alice, host_make, host_queued_instance):
    empty = host_make("gpu-a-empty")
    busy = host_make("gpu-b-busy")
    busier = host_make("gpu-c-busier")
    full = host_make("gpu-d-full")
    for host, count in ((full, 8), (busier, 5), (busy, 2)):
        fill(host, count, alice, host_queued_instance)

    instance = host_queued_instance(alice)
    allocations = allocate(instance_id=instance.pk)

    assert [allocation.gpu.host for allocation in allocations] == [busier]
    instance.refresh_from_db()
    assert instance.host == busier
    assert (used_on(empty), used_on(busy), used_on(busier), used_on(full)) == (0, 2, 6, 8)


def test_it_fills_a_host_that_can_never_take_an_8x_before_touching_a_whole_one(
    alice, host_make, host_queued_instance
):
    host_make("gpu-a-whole")
    seven = host_make("gpu-b-seven", gpus=7)

    allocations = allocate(instance_id=host_queued_instance(alice).pk)

    assert allocations[0].gpu.host == seven


def test_it_breaks_ties_by_host_name(alice, host_make, host_queued_instance):
    host_make("gpu-b")
    first = host_make("gpu-a")

    allocations = allocate(instance_id=host_queued_instance(alice).pk)

    assert allocations[0].gpu.host == first


def test_it_gives_an_8x_all_eight_gpus_of_an_entirely_free_host(bob, host_make, host_queued_instance):
    partly_used = host_make("gpu-a")
    fill(partly_used, 1, bob, host_queued_instance)
    free = host_make("gpu-b")

    instance = host_queued_instance(bob, size="8x")
    allocations = allocate(instance_id=instance.pk)

    assert len(allocations) == 8
    assert {allocation.gpu.host_id for allocation in allocations} == {free.pk}
    minors = sorted(allocation.gpu.render_minor for allocation in allocations)
    assert minors == [128, 136, 144, 152, 160, 168, 176, 184]
    instance.refresh_from_db()
    assert instance.host == free


def test_it_refuses_an_8x_a_partly_used_host(bob, host_make, host_queued_instance):
    host = host_make("gpu-a")
    fill(host, 1, bob, host_queued_instance)

    instance = host_queued_instance(bob, size="8x")

    assert allocate(instance_id=instance.pk) is None
    assert used_on(host) == 1
    instance.refresh_from_db()
    assert instance.host is None
    assert instance.state == Instance.State.QUEUED


def test_it_refuses_an_8x_a_host_with_a_gpu_missing(bob, host_make, host_queued_instance):
    host = host_make("gpu-a")
    Gpu.objects.filter(host=host, node_id=4).update(is_present=False)

    assert allocate(instance_id=host_queued_instance(bob, size="8x").pk) is None


def test_it_places_nothing_on_draining_down_or_retired_hosts(alice, host_make, host_queued_instance):
    for state in (GpuHost.State.DRAINING, GpuHost.State.DOWN, GpuHost.State.RETIRED):
        host_make(f"gpu-{state}", state=state)

    assert allocate(instance_id=host_queued_instance(alice).pk) is None
    assert allocate(instance_id=host_queued_instance(alice, size="8x").pk) is None
    assert GpuAllocation.objects.count() == 0


def test_it_keeps_a_draining_host_off_the_list_even_when_it_is_the_fullest(
    alice, host_make, host_queued_instance
):
    draining = host_make("gpu-a")
    fill(draining, 3, alice, host_queued_instance)
    draining.state = GpuHost.State.DRAINING
    draining.save()
    other = host_make("gpu-b")

    allocations = allocate(instance_id=host_queued_instance(alice).pk)

    assert allocations[0].gpu.host == other
    assert used_on(draining) == 3


def test_it_never_places_on_a_gpu_that_vanished(alice, host_make, host_queued_instance):
    host = host_make("gpu-a", gpus=2)
    Gpu.objects.filter(host=host, node_id=1).update(is_present=False)

    first = allocate(instance_id=host_queued_instance(alice).pk)
    second = allocate(instance_id=host_queued_instance(alice).pk)

    assert first[0].gpu.node_id == 2
    assert second is None


def test_it_answers_none_when_every_gpu_is_taken(alice, host_make, host_queued_instance):
    host = host_make("gpu-a", gpus=2)
    fill(host, 2, alice, host_queued_instance)

    assert allocate(instance_id=host_queued_instance(alice).pk) is None


def test_it_returns_the_same_gpus_when_asked_twice_for_one_instance(alice, host_make, host_queued_instance):
    host_make("gpu-a")
    instance = host_queued_instance(alice)

    first = allocate(instance_id=instance.pk)
    again = allocate(instance_id=instance.pk)

    assert [allocation.pk for allocation in again] == [allocation.pk for allocation in first]
    assert GpuAllocation.objects.filter(instance=instance).count() == 1


def test_it_refuses_to_allocate_for_an_instance_that_has_ended(alice, host_make, host_queued_instance):
    host_make("gpu-a")
    instance = host_queued_instance(alice)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)

    with pytest.raises(SchedulerError, match="stopped"):
        allocate(instance_id=instance.pk)
    assert GpuAllocation.objects.count() == 0


def test_it_frees_the_gpus_on_release_and_a_second_release_changes_nothing(
    bob, host_make, host_queued_instance
):
    host = host_make("gpu-a")
    eight = host_queued_instance(bob, size="8x")
    allocate(instance_id=eight.pk)
    waiting = host_queued_instance(bob)
    assert allocate(instance_id=waiting.pk) is None

    assert release(instance_id=eight.pk) == 8
    assert release(instance_id=eight.pk) == 0

    assert used_on(host) == 0
    assert GpuAllocation.objects.filter(instance=eight, released_at__isnull=False).count() == 8
    assert allocate(instance_id=waiting.pk)[0].gpu.host == host


def test_it_keeps_whole_hosts_for_a_waiting_8x_when_asked(alice, host_make, host_queued_instance):
    whole = host_make("gpu-a")
    partly = host_make("gpu-b")
    fill(partly, 8, alice, host_queued_instance)
    release(instance_id=GpuAllocation.objects.filter(gpu__host=partly).first().instance_id)

    backfill = allocate(instance_id=host_queued_instance(alice).pk, reserve_whole_hosts=True)
    no_room = allocate(instance_id=host_queued_instance(alice).pk, reserve_whole_hosts=True)

    assert backfill[0].gpu.host == partly
    assert no_room is None
    assert used_on(whole) == 0


def test_it_lets_1x_launches_behind_a_waiting_8x_backfill_partly_used_hosts_only(
    alice, bob, host_queued_instance
):
    ahead = host_queued_instance(alice)
    eight = host_queued_instance(bob, size="8x")
    behind = host_queued_instance(alice)

    plan = next_queued()

    assert [(launch.instance, launch.reserve_whole_hosts) for launch in plan] == [
        (ahead, False),
        (eight, False),
        (behind, True),
    ]


def test_it_holds_everything_behind_an_8x_that_has_waited_too_long(
    alice, bob, host_queued_instance, settings
):
    settings.SCHEDULER_8X_MAX_WAIT_SECONDS = 60
    eight = host_queued_instance(bob, size="8x")
    host_queued_instance(alice)
    Instance.objects.filter(pk=eight.pk).update(created_at=timezone.now() - timedelta(seconds=61))

    plan = next_queued()

    assert [launch.instance for launch in plan] == [eight]


def test_it_places_with_as_many_queries_among_40_hosts_as_among_2(alice, host_make, host_queued_instance):
    def queries_for_one_placement():
        with CaptureQueriesContext(connection) as captured:
            assert allocate(instance_id=host_queued_instance(alice).pk)
        return len(captured)

    host_make("gpu-00")
    host_make("gpu-01")
    with_two = queries_for_one_placement()
    for number in range(2, 40):
        host_make(f"gpu-{number:02d}")
    with_forty = queries_for_one_placement()

    # The candidate search reads one host per query (the workspace host, then the best in packing
    # order), whatever the fleet size.
    assert with_forty == with_two
