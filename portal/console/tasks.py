from celery import shared_task

from . import services


@shared_task(name="console.record_sample", soft_time_limit=60, time_limit=90)
def record_sample():
    """Beat: store one capacity sample for the dashboard. Returns the sample's id."""
    return services.sample_record().pk


@shared_task(name="console.delete_old_samples", soft_time_limit=300, time_limit=360)
def delete_old_samples():
    """Beat: delete capacity samples older than CONSOLE_SAMPLE_RETENTION_DAYS. Returns how many."""
    return services.samples_delete_old()
