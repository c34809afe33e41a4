"""Each host's GPU counts (GpuHost.gpus_present, gpus_free), which placement reads instead of counting GPU
rows, stay equal to a count of the rows through allocation, release, races and rediscovery; the
database refuses counts that cannot be right."""

import importlib
import shutil
import threading

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from provisioning import services
from provisioning.models import Gpu, GpuAllocation, GpuHost
from provisioning.scheduler import allocate, release

NODES = "sys/class/kfd/kfd/topology/nodes"


def real_counts() -> dict:
    """host id -> (present GPUs, present GPUs without a live allocation), counted from the rows."""
    present = dict(
        GpuHost.objects.annotate(count=Count("gpus", filter=Q(gpus__is_present=True))).values_list(
            "pk", "count"
        )
    )
    held = dict(
        GpuAllocation.objects.filter(released_at__isnull=True, gpu__is_present=True)
        .values("gpu__host_id")
        .annotate(count=Count("id"))
        .values_list("gpu__host_id", "count")
    )
    return {pk: (count, count - held.get(pk, 0)) for pk, count in present.items()}


def kept_counts() -> dict:
    """host id -> (gpus_present, gpus_free) as the host rows say."""
    return {
        pk: (present, free)
        for pk, present, free in GpuHost.objects.values_list("pk", "gpus_present", "gpus_free")
    }


def assert_counts_are_real():
    assert kept_counts() == real_counts()


@pytest.fixture
def editable_sysfs(tmp_path, kfd_sysfs_8gpu):
    root = tmp_path / "sysfs"
    shutil.copytree(kfd_sysfs_8gpu, root)
    return root


def discovered_host(name, sysfs_root) -> GpuHost:
    """A host of this machine's engine whose GPUs discovery reads from `sysfs_root` (no engine needed)."""
    host = GpuHost.objects.create(name=name, sysfs_root=str(sysfs_root))
    services.host_discover(host_id=host.pk)
    return host


@pytest.mark.django_db
def test_it_keeps_every_hosts_counts_equal_to_its_rows_through_allocation_release_and_rediscovery(
    alice, bob, host_make, host_queued_instance, editable_sysfs, tmp_path
):
    discovered = discovered_host("gpu-a", editable_sysfs)
    made = host_make("gpu-b")
    assert kept_counts() == {discovered.pk: (8, 8), made.pk: (8, 8)}

    # Packing puts the 1x launches on gpu-a (first by name), so the 8x gets gpu-b.
    ones = [host_queued_instance(alice) for _ in range(3)]
    for instance in ones:
        assert allocate(instance_id=instance.pk)[0].gpu.host_id == discovered.pk
    eight = host_queued_instance(bob, size="8x")
    assert len(allocate(instance_id=eight.pk)) == 8
    assert kept_counts() == {discovered.pk: (8, 5), made.pk: (8, 0)}
    assert_counts_are_real()

    release(instance_id=ones[0].pk)
    assert kept_counts()[discovered.pk] == (8, 6)

    # Discovery loses a GPU that an instance holds and a free one.
    held_node = GpuAllocation.objects.get(instance=ones[1]).gpu.node_id
    free_node = Gpu.objects.filter(host=discovered).exclude(allocations__released_at__isnull=True)[0].node_id
    for node in (held_node, free_node):
        shutil.move(editable_sysfs / NODES / str(node), tmp_path / str(node))
    services.host_discover(host_id=discovered.pk)
    assert kept_counts()[discovered.pk] == (6, 5)
    # The held GPU is gone, so its release frees nothing.
    release(instance_id=ones[1].pk)
    assert kept_counts()[discovered.pk] == (6, 5)
    assert_counts_are_real()

    # Both come back, and a GPU appears on a new node.
    for node in (held_node, free_node):
        shutil.move(tmp_path / str(node), editable_sysfs / NODES / str(node))
    shutil.copytree(editable_sysfs / NODES / "8", editable_sysfs / NODES / "9")
    properties = editable_sysfs / NODES / "9" / "properties"
    properties.write_text(properties.read_text().replace("drm_render_minor 184", "drm_render_minor 192"))
    services.host_discover(host_id=discovered.pk)
    assert kept_counts()[discovered.pk] == (9, 8)
    assert_counts_are_real()

    # Writes that go around the services: a bulk release, a GPU marked absent by hand, a GPU row deleted.
    GpuAllocation.objects.filter(released_at__isnull=True).update(released_at=timezone.now())
    Gpu.objects.filter(host=made, node_id=4).update(is_present=False)
    small = host_make("gpu-c", gpus=2)
    Gpu.objects.filter(host=small, node_id=2).delete()
    assert kept_counts() == {discovered.pk: (9, 9), made.pk: (7, 7), small.pk: (1, 1)}
    assert_counts_are_real()


def at_once(*calls):
    """Run every call at the same moment, each in its own thread and database connection."""
    barrier = threading.Barrier(len(calls))
    errors = []

    def run(call):
        try:
            barrier.wait(timeout=30)
            call()
        except Exception as error:  # reported below: a thread's exception would otherwise vanish
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors


@pytest.mark.django_db(transaction=True)
def test_it_keeps_the_counts_right_while_launches_releases_and_a_discovery_race(
    alice, host_queued_instance, editable_sysfs, tmp_path
):
    host = discovered_host("gpu-race", editable_sysfs)
    running = [host_queued_instance(alice) for _ in range(8)]
    for instance in running:
        allocate(instance_id=instance.pk)
    waiting = [host_queued_instance(alice) for _ in range(8)]
    # Discovery will find two GPUs gone: one held by an instance that is releasing, one by one that is not.
    releasing = running[:4]
    gone = [GpuAllocation.objects.get(instance=instance).gpu.node_id for instance in (running[0], running[7])]
    for node in gone:
        shutil.move(editable_sysfs / NODES / str(node), tmp_path / str(node))

    at_once(
        *[lambda instance=instance: release(instance_id=instance.pk) for instance in releasing],
        *[lambda instance=instance: allocate(instance_id=instance.pk) for instance in waiting],
        lambda: services.host_discover(host_id=host.pk),
    )

    # How many waiting launches got a GPU depends on which releases committed first.
    assert_counts_are_real()
    held = GpuAllocation.objects.filter(released_at__isnull=True, gpu__host=host, gpu__is_present=True)
    assert kept_counts()[host.pk] == (6, 6 - held.count())
    assert not held.values("gpu").annotate(holders=Count("id")).filter(holders__gt=1).exists()


@pytest.mark.django_db
def test_the_database_refuses_a_free_count_above_the_present_count_or_below_zero(host_make):
    host = host_make("gpu-a", gpus=2)

    for wrong in (F("gpus_present") + 1, -1):
        with pytest.raises(IntegrityError), transaction.atomic():
            GpuHost.objects.filter(pk=host.pk).update(gpus_free=wrong)

    assert kept_counts()[host.pk] == (2, 2)


@pytest.mark.django_db
def test_it_gives_back_a_host_whose_count_says_more_gpus_are_free_than_are(
    alice, bob, host_make, host_queued_instance
):
    wrong = host_make("gpu-a")
    right = host_make("gpu-b")
    assert allocate(instance_id=host_queued_instance(alice).pk)[0].gpu.host_id == wrong.pk
    GpuHost.objects.filter(pk=wrong.pk).update(gpus_free=8)  # as if a release had been counted twice

    allocations = allocate(instance_id=host_queued_instance(bob, size="8x").pk)

    assert {allocation.gpu.host_id for allocation in allocations} == {right.pk}
    assert GpuAllocation.objects.filter(gpu__host=wrong, released_at__isnull=True).count() == 1
    assert kept_counts() == {wrong.pk: (8, 8), right.pk: (8, 0)}


@pytest.mark.django_db
def test_saving_a_host_loaded_before_an_allocation_leaves_its_counts_alone(
    alice, host_make, host_queued_instance
):
    host = host_make("gpu-a")
    allocate(instance_id=host_queued_instance(alice).pk)

    host.state = GpuHost.State.DRAINING
    host.save()

    assert kept_counts()[host.pk] == (8, 7)


@pytest.mark.django_db
def test_the_migration_fills_the_counts_of_hosts_that_existed_before_it(
    alice, host_make, host_queued_instance
):
    migration = importlib.import_module("provisioning.migrations.0006_host_gpu_counts")
    host_make("gpu-a")
    host_make("gpu-b", gpus=3)
    allocate(instance_id=host_queued_instance(alice).pk)
    # As the columns were when the migration added them.
    GpuHost.objects.update(gpus_present=0, gpus_free=0)

    migration.fill_gpu_counts(apps)

    assert sorted(kept_counts().values()) == [(3, 2), (8, 8)]
    assert_counts_are_real()
