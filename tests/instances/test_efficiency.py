"""GPU efficiency: what the idle culler's GPU readings add to an instance's sampled and busy GPU-seconds,
and what the instance page makes of them."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from portal.instances import culling
from portal.instances.efficiency import MAX_SAMPLE_GAP_INTERVALS, gpu_samples_record
from portal.instances.models import Instance, LaunchPolicy
from tests.instances.efficiency_data import running_instance


@pytest.fixture(autouse=True)
def culler_every_minute(settings):
    settings.IDLE_CULL_SECONDS = 60
    settings.IDLE_GPU_BUSY_PERCENT = 5


def cull_round(monkeypatch, percents: dict, now, *, busy_kernels=0, unreachable=False):
    """One culler round where every JupyterLab answers (recently active, with `busy_kernels`), or none
    does, and the GPUs read `percents`."""

    def probe_all(instances):
        return {
            instance.id: culling.JupyterUnreachable("no answer")
            if unreachable
            else culling.JupyterActivity(
                last_activity=now, kernels=busy_kernels, busy_kernels=busy_kernels, terminals=0, connections=0
            )
            for instance in instances
        }

    monkeypatch.setattr(culling, "_probe_all", probe_all)
    monkeypatch.setattr(
        culling.hostfs, "instances_gpu_busy", lambda ids: {i: percents[i] for i in ids if i in percents}
    )
    return culling.cull_idle(now=now)


def test_it_adds_busy_and_idle_gpu_seconds_from_a_culler_round(alice, monkeypatch):
    busy_8x = running_instance(alice, size="8x")
    idle_1x = running_instance(alice)
    now = timezone.now()
    cull_round(monkeypatch, {busy_8x.id: 80, idle_1x.id: 1}, now)

    busy_8x.refresh_from_db()
    idle_1x.refresh_from_db()
    # The first reading counts from ready (30 s ago), times the GPU count.
    assert busy_8x.gpu_seconds_sampled == busy_8x.gpu_seconds_busy == 30 * 8
    assert (idle_1x.gpu_seconds_sampled, idle_1x.gpu_seconds_busy) == (30, 0)
    assert busy_8x.gpu_sampled_at == now

    # The next round a minute later flips them: the minute counts for what was read then.
    cull_round(monkeypatch, {busy_8x.id: 0, idle_1x.id: 99}, now + timedelta(seconds=60))
    busy_8x.refresh_from_db()
    idle_1x.refresh_from_db()
    assert (busy_8x.gpu_seconds_sampled, busy_8x.gpu_seconds_busy) == (90 * 8, 30 * 8)
    assert (idle_1x.gpu_seconds_sampled, idle_1x.gpu_seconds_busy) == (90, 60)


def test_it_counts_the_readings_of_an_instance_whose_lab_did_not_answer(alice, monkeypatch):
    instance = running_instance(alice)
    cull_round(monkeypatch, {instance.id: 90}, timezone.now(), unreachable=True)
    instance.refresh_from_db()
    assert instance.gpu_seconds_busy == instance.gpu_seconds_sampled == 30


def test_a_whole_culler_round_makes_as_many_queries_for_50_instances_as_for_1(alice, monkeypatch):
    def queries_of_a_round(count):
        Instance.objects.all().delete()
        instances = [running_instance(alice) for _ in range(count)]
        percents = {instance.id: 90 if index % 2 else 0 for index, instance in enumerate(instances)}
        # Busy kernels explain the busy GPUs, so the round writes no timeline lines of its own.
        with CaptureQueriesContext(connection) as queries:
            cull_round(monkeypatch, percents, timezone.now(), busy_kernels=1)
        assert Instance.objects.filter(gpu_seconds_sampled=30).count() == count
        assert Instance.objects.filter(gpu_seconds_busy=30).count() == count // 2
        return len(queries)

    LaunchPolicy.current()  # made on first read: not part of a round
    assert queries_of_a_round(50) == queries_of_a_round(1)


def test_it_caps_a_missed_round_at_two_intervals(alice, monkeypatch):
    instance = running_instance(alice)
    now = timezone.now()
    cull_round(monkeypatch, {instance.id: 50}, now)
    cull_round(monkeypatch, {instance.id: 50}, now + timedelta(hours=1))
    instance.refresh_from_db()
    assert instance.gpu_seconds_busy == instance.gpu_seconds_sampled == 30 + 60 * MAX_SAMPLE_GAP_INTERVALS


def test_it_does_not_count_an_instance_without_readings_as_idle(alice, monkeypatch):
    unmeasured = running_instance(alice)
    cull_round(monkeypatch, {}, timezone.now())
    unmeasured.refresh_from_db()
    assert (unmeasured.gpu_seconds_sampled, unmeasured.gpu_seconds_busy, unmeasured.gpu_sampled_at) == (
        0,
        0,
        None,
    )


def test_it_does_not_count_a_round_twice_when_another_round_got_there_first(alice):
    instance = running_instance(alice)
    read = Instance.objects.get(pk=instance.pk)
    now = timezone.now()
    assert gpu_samples_record(readings={instance.id: True}, instances=[read], now=now) == 1
    # A concurrent round that read the same row before the first wrote it claims nothing.
    assert gpu_samples_record(readings={instance.id: True}, instances=[read], now=now) == 0
    instance.refresh_from_db()
    assert instance.gpu_seconds_busy == 30


@pytest.mark.parametrize("count", [1, 50])
def test_it_records_a_round_in_one_query_whatever_the_number_of_instances(
    alice, count, django_assert_num_queries
):
    instances = [running_instance(alice) for _ in range(count)]
    readings = {instance.id: index % 2 == 0 for index, instance in enumerate(instances)}
    with django_assert_num_queries(1):
        updated = gpu_samples_record(readings=readings, instances=instances, now=timezone.now())
    assert updated == count
    assert Instance.objects.filter(gpu_seconds_sampled=30).count() == count
    assert Instance.objects.filter(gpu_seconds_busy=30).count() == (count + 1) // 2


def test_the_page_shows_the_busy_share_and_the_idle_gpu_hours(alice, alice_client):
    instance = running_instance(
        alice, size="8x", charged_gpu_seconds=int(8.2 * 3600), gpu_seconds_sampled=1000, gpu_seconds_busy=620
    )
    page = alice_client.get(reverse("instances:detail", args=[instance.id])).content.decode()
    assert "GPUs busy 62% of the measured time; about 3.1 of 8.2 GPU-hours billed were idle." in page


def test_the_page_of_a_stopped_instance_shows_it_too(alice, alice_client):
    instance = running_instance(
        alice, charged_gpu_seconds=3600, gpu_seconds_sampled=100, gpu_seconds_busy=100
    )
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED, stopped_at=timezone.now())
    page = alice_client.get(reverse("instances:detail", args=[instance.id])).content.decode()
    assert "GPUs busy 100% of the measured time; about 0.0 of 1.0 GPU-hours billed were idle." in page


def test_the_page_of_an_unmeasured_instance_says_not_measured_never_idle(alice, alice_client):
    instance = running_instance(alice, charged_gpu_seconds=3600)
    page = alice_client.get(reverse("instances:detail", args=[instance.id])).content.decode()
    assert "GPU use not measured" in page
    assert "were idle" not in page
