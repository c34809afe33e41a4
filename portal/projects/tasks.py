"""Celery tasks of the projects app. Thin: load by id, call the service, return."""

import smtplib

from celery import shared_task

from . import ci_grants, services


# As accounts.send_email: SMTP hiccups are transient. The token is made when the email is sent, so no
# secret travels through the broker.
@shared_task(
    name="projects.send_invitation",
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=30,
    retry_backoff_max=600,
    max_retries=6,
    soft_time_limit=60,
    time_limit=90,
)
def send_invitation(invitation_id: int) -> bool:
    """Email one project invitation with a fresh link. Returns False when it is no longer open."""
    return services.invitation_send(invitation_id=invitation_id)


# Beat runs it hourly (CELERY_BEAT_SCHEDULE["ci-grants-renew"]); a run that finds nothing due changes nothing,
# and two at once post each grant once (portal/projects/ci_grants.py).
@shared_task(name="projects.renew_ci_grants", soft_time_limit=600, time_limit=660)
def renew_ci_grants() -> int:
    """Renew the open-source CI programme's grants that are due. Returns how many projects renewed."""
    return ci_grants.ci_grants_renew()
