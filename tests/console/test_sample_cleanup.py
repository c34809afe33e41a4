"""Capacity samples are kept CONSOLE_SAMPLE_RETENTION_DAYS; the hourly beat task deletes only older ones."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from portal.console.models import CapacitySample
from portal.console.tasks import delete_old_samples


def sample(taken_at) -> CapacitySample:
    return CapacitySample.objects.create(
        taken_at=taken_at,
        gpus_total=8,
        gpus_allocated=1,
        queue_length=0,
        oldest_queued_wait_seconds=0,
        running_instances=1,
    )


def test_it_deletes_only_the_samples_older_than_the_retention(db, settings):
    settings.CONSOLE_SAMPLE_RETENTION_DAYS = 30
    now = timezone.now()
    old = [sample(now - timedelta(days=30, seconds=1)), sample(now - timedelta(days=400))]
    kept = [sample(now - timedelta(days=29, hours=23)), sample(now - timedelta(minutes=5)), sample(now)]

    deleted = delete_old_samples()

    assert deleted == len(old)
    assert sorted(CapacitySample.objects.values_list("pk", flat=True)) == sorted(s.pk for s in kept)


def test_the_dashboards_longest_range_is_kept_by_default():
    from portal.console.timeranges import MAX_CUSTOM_DAYS

    assert settings.CONSOLE_SAMPLE_RETENTION_DAYS >= MAX_CUSTOM_DAYS


def test_beat_runs_the_cleanup():
    entries = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}

    assert "console.delete_old_samples" in entries
