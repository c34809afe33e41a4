from celery import shared_task

from . import services


@shared_task(name="console.record_sample", soft_time_limit=60, time_limit=90)
def record_sample():
    """Beat: store one capacity sample for the dashboard. Returns the sample's id."""
    return services.sample_record().pk
