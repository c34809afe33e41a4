"""Celery tasks of the accounts app. Thin: load by id, call the service, return."""

import smtplib

from celery import shared_task

from . import services


# SMTP hiccups and refused connections are transient: retry with backoff for about half an hour.
# The link is built when the email is sent, so a late retry still carries a fresh token.
@shared_task(
    name="accounts.send_email",
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=30,
    retry_backoff_max=600,
    max_retries=6,
    soft_time_limit=60,
    time_limit=90,
)
def send_email(kind: str, user_id: int, details: dict | None = None) -> bool:
    """Send one account email (see services.EmailKind). Returns False when it was no longer needed."""
    return services.email_send(kind=kind, user_id=user_id, details=details)


@shared_task(name="accounts.prune_expired_ssh_keys")
def prune_expired_ssh_keys() -> int:
    """Remove SSH keys past their expiry (a `devcloud run` key whose CLI was killed)."""
    return services.sshkeys_prune_expired()
