"""Operations that write console records: capacity samples. The audit log is written by portal.audit."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from . import selectors
from .models import CapacitySample


def sample_record(*, now=None) -> CapacitySample:
    """Measure the fleet and the launch queue now and store the sample. Returns it.

    Safe to run twice: a second sample a moment later only adds a point that the charts average in.
    """
    now = now or timezone.now()
    fleet = selectors.fleet_now(now=now)
    return CapacitySample.objects.create(
        taken_at=now,
        gpus_total=fleet.gpus_total,
        gpus_allocated=fleet.gpus_allocated,
        queue_length=fleet.queue_length,
        oldest_queued_wait_seconds=fleet.oldest_queued_wait_seconds,
        running_instances=fleet.running_instances,
    )


def samples_delete_old(*, now=None) -> int:
    """Delete the capacity samples taken more than CONSOLE_SAMPLE_RETENTION_DAYS before `now`. Returns
    how many were deleted. Samples are measurements, not records of anyone's action: nothing keeps them.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CONSOLE_SAMPLE_RETENTION_DAYS)
    deleted, _ = CapacitySample.objects.filter(taken_at__lt=cutoff).delete()
    return deleted
