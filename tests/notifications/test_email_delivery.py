"""The notifications.send task: a duplicate delivery sends nothing more, a refused send is recorded and
retried, and a broker outage sends the email from the web process instead."""

import logging
import os
import time
from contextlib import contextmanager

import kombu.pools
import pytest
from celery.exceptions import Retry
from django.test import override_settings

from portal.notifications import services, tasks
from portal.notifications.models import Kind, Notification
from tests.conftest import mails_to
from tests.support.smtp import free_port, smtp_server
from tests.support.worker import celery_publishing_to, celery_worker, redis_url, unique_queue

SUSPENDED = {"reason": "Crypto mining is not allowed."}
# Redis database index used by the notification tests only.
REDIS_DB = int(os.environ.get("NOTIF_TEST_REDIS_DB", "14"))


def recorded(user, event_key="suspension:1"):
    """A notification recorded but not yet emailed, as the task finds it when it runs."""
    return Notification.objects.create(
        user=user, kind=Kind.ACCOUNT_SUSPENDED, event_key=event_key, context=SUSPENDED
    )


@contextmanager
def publishing_to(*, broker_url: str, queue: str):
    """Publish tasks to `broker_url`/`queue` instead of running them eagerly, for the block.

    celery_publishing_to closes the pools it replaces, but kombu keeps closed pools cached by URL,
    and even an eager apply_async takes a producer from them ("Acquire on closed pool" in later
    tests): start and end with kombu's pools cleared. celery_publishing_to goes first because it saves
    the configuration it restores, which Celery reads from Django settings on first use, and that
    must not happen while eager mode is overridden off.
    """
    kombu.pools.reset()
    try:
        with (
            celery_publishing_to(broker_url=broker_url, queue=queue),
            override_settings(CELERY_TASK_ALWAYS_EAGER=False),
        ):
            yield
    finally:
        kombu.pools.reset()


def broker_down():
    """Publishing fails the way it does when Redis is down: nothing listens on port 1."""
    return publishing_to(broker_url="redis://127.0.0.1:1/0", queue=unique_queue("notif-down"))


def smtp_settings(settings, port):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_TIMEOUT = 5


@pytest.mark.django_db
def test_it_sends_once_when_the_task_is_delivered_twice(alice, mailoutbox):
    notification = recorded(alice)

    first = tasks.send.apply(args=[notification.pk]).get()
    second = tasks.send.apply(args=[notification.pk]).get()

    assert (first, second) == (True, False)
    assert len(mails_to(mailoutbox, alice)) == 1


@pytest.mark.django_db
def test_it_records_a_refused_send_and_retries_until_the_mail_server_answers(alice, settings):
    port = free_port()
    smtp_settings(settings, port)  # nothing listens there yet
    notification = recorded(alice)

    for attempt in (1, 2):
        # In eager mode Celery hands the retry back as an exception instead of scheduling it.
        with pytest.raises(Retry) as retry:
            tasks.send.apply(args=[notification.pk])
        assert isinstance(retry.value.exc, ConnectionRefusedError)
        notification.refresh_from_db()
        assert notification.emailed_at is None, "a send that failed must stay claimable for the retry"
        assert notification.email_attempts == attempt
        assert "ConnectionRefusedError" in notification.email_error

    with smtp_server(port=port) as (inbox, _):
        assert tasks.send.apply(args=[notification.pk]).get() is True
        assert tasks.send.apply(args=[notification.pk]).get() is False
        message = inbox.wait_for(lambda m: alice.email in m.rcpt_tos, timeout=10)
        time.sleep(0.2)  # let a (wrong) second message arrive, if one was sent
        assert len(inbox.messages) == 1

    assert message.subject == "Your DevCloud account is suspended"
    notification.refresh_from_db()
    assert notification.emailed_at is not None
    assert notification.email_attempts == 3


@pytest.mark.django_db
def test_it_sends_inline_when_the_broker_is_down(
    alice, mailoutbox, caplog, django_capture_on_commit_callbacks
):
    with broker_down(), caplog.at_level(logging.WARNING, logger="portal.notifications.services"):
        with django_capture_on_commit_callbacks(execute=True):
            notification = services.notify(
                user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
            )

    assert len(mails_to(mailoutbox, alice)) == 1
    assert "Broker unreachable" in caplog.text
    notification.refresh_from_db()
    assert notification.emailed_at is not None


@pytest.mark.django_db
def test_it_never_fails_the_caller_when_the_broker_and_the_mail_server_are_down(
    alice, settings, caplog, django_capture_on_commit_callbacks
):
    smtp_settings(settings, free_port())

    with broker_down(), django_capture_on_commit_callbacks(execute=True):
        notification = services.notify(
            user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
        )

    notification.refresh_from_db()
    assert notification.emailed_at is None
    assert "ConnectionRefusedError" in notification.email_error
    assert "Running notifications.send inline failed" in caplog.text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_sends_one_email_however_often_the_message_is_delivered(alice):
    broker = redis_url(REDIS_DB)
    queue = unique_queue("notif-email")
    with smtp_server() as (inbox, port):
        worker_env = {
            "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(port),
            "EMAIL_USE_TLS": "0",
        }
        with celery_worker(
            queues=[queue],
            broker_url=broker,
            extra_env=worker_env,
            settings_module="portal.settings.test",
        ) as worker:
            with publishing_to(broker_url=broker, queue=queue):
                notification = services.notify(
                    user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
                )
                mail = inbox.wait_for(lambda m: alice.email in m.rcpt_tos, timeout=60)
                # The broker redelivers the message (e.g. after a lost ack): two more copies.
                for _ in range(2):
                    tasks.send.apply_async(args=[notification.pk])
                deadline = time.monotonic() + 60
                while worker.log().count("succeeded") < 3 and time.monotonic() < deadline:
                    time.sleep(0.2)

            assert worker.log().count("succeeded") == 3, worker.log()
            assert worker.log().count(": False") == 2, worker.log()
        assert len(inbox.messages) == 1

    assert "suspended" in mail.subject
    notification.refresh_from_db()
    assert notification.emailed_at is not None and notification.email_attempts == 1
