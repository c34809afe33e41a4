"""Concurrent placement against real PostgreSQL: many workers, one host, no GPU ever booked twice."""

import threading

import pytest
from django.db import connection
from django.db.models import Count

from provisioning.models import GpuAllocation
from provisioning.scheduler import allocate


def race(instance_ids, **options):
    """Call allocate() for every instance at once, one thread and DB connection each. Returns id -> result."""
    barrier = threading.Barrier(len(instance_ids))
    results, errors = {}, []

    def worker(instance_id):
        try:
            barrier.wait(timeout=30)
            results[instance_id] = allocate(instance_id=instance_id, **options)
        except Exception as error:  # reported below: a thread's exception would otherwise vanish
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(instance_id,)) for instance_id in instance_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == len(instance_ids)
    return results


def double_booked_gpus():
    return list(
        GpuAllocation.objects.filter(released_at__isnull=True)
        .values("gpu_id")
        .annotate(holders=Count("id"))
        .filter(holders__gt=1)
    )


@pytest.mark.django_db(transaction=True)
def test_it_gives_30_simultaneous_1x_launches_exactly_the_8_gpus_of_one_host(
    alice, host_make, host_queued_instance
):
    host = host_make("gpu-race")
    instances = [host_queued_instance(alice) for _ in range(30)]

    results = race([instance.pk for instance in instances])

    placed = {instance_id: allocations for instance_id, allocations in results.items() if allocations}
    assert len(placed) == 8
    assert sum(1 for allocations in results.values() if allocations is None) == 22
    assert double_booked_gpus() == []
    live = GpuAllocation.objects.filter(released_at__isnull=True)
    assert live.count() == 8
    assert set(live.values_list("gpu__host_id", flat=True)) == {host.pk}
    assert set(live.values_list("instance_id", flat=True)) == set(placed)


@pytest.mark.django_db(transaction=True)
def test_it_gives_a_host_to_either_the_8x_or_the_1x_launches_never_both(
    alice, bob, host_make, host_queued_instance
):
    host_make("gpu-race")
    eight = host_queued_instance(bob, size="8x")
    ones = [host_queued_instance(alice) for _ in range(5)]

    results = race([eight.pk] + [instance.pk for instance in ones])

    ones_placed = [instance.pk for instance in ones if results[instance.pk]]
    if results[eight.pk]:
        assert len(results[eight.pk]) == 8
        assert ones_placed == []
    else:
        assert len(ones_placed) == 5
    assert double_booked_gpus() == []
    assert GpuAllocation.objects.filter(released_at__isnull=True).count() in (5, 8)
