"""GPU health: every heartbeat reads each GPU's RAS counters, device node and KFD listing on its host (here
the 8x MI300X fixture tree with amdgpu's ras/*_err_count files, and a stand-in /dev), drains a GPU that
turned unhealthy on its own, and placement skips it until an operator returns it."""

import importlib
import shutil
import time

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from portal.instances import lifecycle
from portal.instances.models import Instance, InstanceEvent
from portal.notifications.models import Kind, Notification
from provisioning import gpu_health, health, scheduler
from provisioning.models import Gpu, GpuAllocation
from tests.conftest import mails_to

pytestmark = pytest.mark.django_db

@pytest.fixture
def files(gpu_health_files):
    return gpu_health_files


@pytest.fixture
def gpu_host(gpu_health_host):
    return gpu_health_host


def gpu(host, minor) -> Gpu:
    return Gpu.objects.get(host=host, render_minor=minor)


def placed_minors(instance) -> list[int]:
    return sorted(
        GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).values_list(
            "gpu__render_minor", flat=True
        )
    )


def test_the_first_beat_records_every_gpus_error_counts_and_drains_nothing(gpu_host, files):
    files.ras(136, ue=2, ce=40)

    report = health.hosts_heartbeat()

    assert report.gpus_drained == []
    assert gpu(gpu_host, 136).ras_uncorrectable == 2
    assert gpu(gpu_host, 136).ras_correctable == 40
    assert gpu(gpu_host, 128).ras_uncorrectable == 0
    assert not Gpu.objects.filter(is_drained=True).exists()


def test_uncorrectable_errors_that_rise_drain_the_gpu_with_the_reason_audited_and_placement_skips_it(
    gpu_host, files, alice, host_queued_instance
):
    health.hosts_heartbeat()
    files.ras(128, "umc", ue=1)
    files.ras(128, "gfx", ue=2)

    report = health.hosts_heartbeat()

    broken = gpu(gpu_host, 128)
    assert report.gpus_drained == [broken.pk]
    assert broken.is_drained
    assert broken.drained_reason == "Uncorrectable RAS errors rose from 0 to 3 since the last reading."
    entry = AuditEntry.objects.get(action="gpu.drain")
    assert entry.actor is None and entry.target_id == str(broken.pk) and entry.reason == broken.drained_reason
    # Renderd128 is node 1, the one placement takes first on an empty host.
    launch = host_queued_instance(alice)
    scheduler.allocate(instance_id=launch.id)
    assert placed_minors(launch) == [136]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the GPU count triggers exist on PostgreSQL only")
def test_a_drained_gpu_is_not_counted_free_even_after_its_holder_releases_it(gpu_host, files, alice, host_queued_instance):
    health.hosts_heartbeat()
    holder = host_queued_instance(alice)
    scheduler.allocate(instance_id=holder.id)
    files.ras(128, ue=5)

    health.hosts_heartbeat()
    gpu_host.refresh_from_db()
    assert (gpu_host.gpus_present, gpu_host.gpus_free) == (7, 7)
    scheduler.release(instance_id=holder.id)

    gpu_host.refresh_from_db()
    assert (gpu_host.gpus_present, gpu_host.gpus_free) == (7, 7)


def test_an_8x_launch_does_not_fit_a_host_with_a_drained_gpu(gpu_host, files, alice, host_queued_instance):
    health.hosts_heartbeat()
    files.ras(184, ue=1)
    health.hosts_heartbeat()

    launch = host_queued_instance(alice, size="8x")

    assert scheduler.allocate(instance_id=launch.id) is None


def test_correctable_errors_alone_do_not_drain_a_gpu(gpu_host, files):
    health.hosts_heartbeat()
    files.ras(144, ce=1000)

    report = health.hosts_heartbeat()

    assert report.gpus_drained == []
    assert gpu(gpu_host, 144).ras_correctable == 1000
    assert not gpu(gpu_host, 144).is_drained


def test_a_device_node_that_disappears_drains_its_gpu(gpu_host, files):
    health.hosts_heartbeat()
    files.remove_device_node(152)

    report = health.hosts_heartbeat()

    assert report.gpus_drained == [gpu(gpu_host, 152).pk]
    assert gpu(gpu_host, 152).drained_reason == "Its device node /dev/dri/renderD152 is gone."


def test_a_gpu_the_kfd_topology_no_longer_lists_is_drained_as_not_answering(gpu_host, files):
    health.hosts_heartbeat()
    files.drop_from_kfd(160)

    health.hosts_heartbeat()

    assert gpu(gpu_host, 160).is_drained
    assert "stopped answering" in gpu(gpu_host, 160).drained_reason


def test_a_host_showing_no_kfd_topology_at_all_drains_none_of_its_gpus(gpu_host, files):
    health.hosts_heartbeat()
    shutil.rmtree(files.sysfs / "sys/class/kfd")

    report = health.hosts_heartbeat()

    assert report.gpus_drained == []
    assert "No KFD topology" in report.gpu_health_unknown[gpu_host.pk]
    assert not Gpu.objects.filter(is_drained=True).exists()


def test_the_owner_of_a_running_instance_on_a_drained_gpu_is_told_on_its_page_and_by_email(
    gpu_host, files, alice, host_queued_instance, mailoutbox, django_capture_on_commit_callbacks
):
    health.hosts_heartbeat()
    running = host_queued_instance(alice)
    scheduler.allocate(instance_id=running.id)
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.RUNNING)
    files.ras(128, ue=4)

    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.hosts_heartbeat()

    notice = Notification.objects.get(user=alice, kind=Kind.GPU_UNHEALTHY)
    assert notice.context["gpu"] == "renderD128"
    assert "rose from 0 to 4" in notice.context["health_reason"]
    assert InstanceEvent.objects.filter(instance=running, message__contains="renderD128 failed its health check").exists()
    browser = Client()
    browser.force_login(alice)
    page = browser.get(reverse("instances:detail", args=[running.id])).content.decode()
    assert "Its GPU renderD128 failed its health check" in page
    assert Instance.objects.get(pk=running.pk).state == Instance.State.RUNNING
    [mail] = mails_to(mailoutbox, alice)
    assert "renderD128" in mail.subject + mail.body and "Uncorrectable RAS errors rose from 0 to 4" in mail.body
    # A later beat with the same counts tells nobody again.
    lifecycle.hosts_heartbeat()
    assert Notification.objects.filter(user=alice, kind=Kind.GPU_UNHEALTHY).count() == 1


def test_a_returned_gpu_is_placed_again_and_drained_again_only_if_its_errors_rise_further(
    gpu_host, files, alice, otto, host_queued_instance
):
    health.hosts_heartbeat()
    files.ras(128, ue=1)
    health.hosts_heartbeat()

    gpu_health.gpu_return(gpu_id=gpu(gpu_host, 128).pk, actor=otto, reason="Reseated the OAM module.")
    health.hosts_heartbeat()

    assert not gpu(gpu_host, 128).is_drained
    launch = host_queued_instance(alice)
    scheduler.allocate(instance_id=launch.id)
    assert placed_minors(launch) == [128]
    files.ras(128, ue=2)
    health.hosts_heartbeat()
    assert gpu(gpu_host, 128).is_drained


def test_returning_needs_a_reason_and_a_drained_gpu(gpu_host, otto):
    healthy = gpu(gpu_host, 128)

    with pytest.raises(gpu_health.GpuReturnError, match="Say why"):
        gpu_health.gpu_return(gpu_id=healthy.pk, actor=otto, reason=" ")
    with pytest.raises(gpu_health.GpuReturnError, match="is not drained"):
        gpu_health.gpu_return(gpu_id=healthy.pk, actor=otto, reason="Looks fine.")


def test_with_the_shipped_beat_settings_a_gpu_stops_getting_placements_within_one_heartbeat(
    gpu_host, files, alice, host_queued_instance
):
    """The bound: the heartbeat (which reads GPU health) runs every HOST_HEARTBEAT_SECONDS, so a counter
    that rises just after a beat read it is seen by the next one; that beat drains the GPU before it ends."""
    schedule = django_settings.CELERY_BEAT_SCHEDULE["host-heartbeat"]
    assert schedule["task"] == "provisioning.heartbeat"
    period = schedule["schedule"]
    health.hosts_heartbeat()
    files.ras(128, ue=1)

    started = time.monotonic()
    health.hosts_heartbeat()
    beat_seconds = time.monotonic() - started

    launch = host_queued_instance(alice)
    scheduler.allocate(instance_id=launch.id)
    assert 128 not in placed_minors(launch)
    worst = period + beat_seconds
    print(f"\nheartbeat period {period:.0f} s; one beat on an 8-GPU host took {beat_seconds * 1000:.0f} ms; "
          f"a rising error counter stops placements within {worst:.2f} s at worst, {beat_seconds:.2f} s at best")
    assert period == 15.0
    assert worst < period + 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the GPU count triggers exist on PostgreSQL only")
def test_the_migration_counts_drained_gpus_out_and_its_reverse_counts_them_back(gpu_host, files):
    from django.apps import apps

    migration = importlib.import_module("provisioning.migrations.0009_gpu_health")
    health.hosts_heartbeat()
    files.remove_device_node(128)
    health.hosts_heartbeat()

    with connection.cursor() as cursor:
        cursor.execute(migration.PRESENT_ONLY_FUNCTIONS)
    migration._fill(apps, skip_drained=False)
    gpu_host.refresh_from_db()
    assert (gpu_host.gpus_present, gpu_host.gpus_free) == (8, 8)

    with connection.cursor() as cursor:
        cursor.execute(migration.COUNTED_FUNCTIONS)
    migration._fill(apps, skip_drained=True)
    gpu_host.refresh_from_db()
    assert (gpu_host.gpus_present, gpu_host.gpus_free) == (7, 7)
    Gpu.objects.filter(host=gpu_host, render_minor=128).update(is_drained=False)
    gpu_host.refresh_from_db()
    assert (gpu_host.gpus_present, gpu_host.gpus_free) == (8, 8)
