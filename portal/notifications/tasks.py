"""Celery tasks of the notifications app. Thin: load by id, call the service, return."""

import smtplib

from celery import shared_task

from . import services


# The mail server being down or refusing is transient: retry with backoff for about an hour and a half,
# every countdown well under the broker's visibility timeout. The service claims the row before it
# sends, so a redelivered or retried message never sends a second email.
@shared_task(
    name="notifications.send",
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=30,
    retry_backoff_max=900,
    max_retries=8,
    soft_time_limit=60,
    time_limit=90,
)
def send(notification_id: int) -> bool:
    """Email one notification. Returns False when there was nothing (left) to send."""
    return services.notification_email_send(notification_id=notification_id)
