"""notify(): one record and one email per event, only after the caller commits, and the optional
kinds a user turned off are recorded for the dashboard but not emailed."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.accounts.services import account_delete
from portal.notifications import services
from portal.notifications.models import EmailOptOut, Kind, Notification
from portal.notifications.services import StopReason
from tests.conftest import mails_to

from .conftest import make_instance

pytestmark = pytest.mark.django_db

SUSPENDED = {"reason": "Crypto mining is not allowed."}


def test_it_sends_one_email_when_the_same_event_is_reported_twice(
    alice, image, mailoutbox, django_capture_on_commit_callbacks
):
    instance = make_instance(alice, image)

    with django_capture_on_commit_callbacks(execute=True):
        first = services.notify_instance_stopped(instance=instance, reason=StopReason.CREDITS_EXHAUSTED)
    with django_capture_on_commit_callbacks(execute=True):
        # The reconciler or a retried teardown reports the same stop again.
        second = services.notify_instance_stopped(instance=instance, reason=StopReason.CREDITS_EXHAUSTED)

    assert first is not None and second is None
    assert Notification.objects.filter(user=alice).count() == 1
    assert len(mails_to(mailoutbox, alice)) == 1
    first.refresh_from_db()
    assert first.emailed_at is not None and first.email_attempts == 1


def test_it_sends_one_email_per_distinct_event(alice, image, mailoutbox, django_capture_on_commit_callbacks):
    instances = [make_instance(alice, image) for _ in range(2)]

    with django_capture_on_commit_callbacks(execute=True):
        for instance in instances:
            services.notify_instance_stopped(instance=instance, reason=StopReason.IDLE)
        services.notify_launch_failed(instance=instances[0])

    assert len(mails_to(mailoutbox, alice)) == 3


def test_it_keeps_events_of_different_users_apart(alice, bob, mailoutbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        for user in (alice, bob):
            services.notify(
                user=user, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
            )

    assert len(mails_to(mailoutbox, alice)) == 1
    assert len(mails_to(mailoutbox, bob)) == 1


def test_it_tells_nobody_when_the_callers_transaction_rolls_back(
    alice, image, mailoutbox, django_capture_on_commit_callbacks
):
    instance = make_instance(alice, image)

    with django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(RuntimeError):
        with transaction.atomic():
            services.notify_instance_stopped(instance=instance, reason=StopReason.CREDITS_EXHAUSTED)
            raise RuntimeError("the stop failed after notifying")

    assert callbacks == []
    assert not Notification.objects.exists()
    assert mailoutbox == []
    # The stop is retried and this time commits: the user hears about it then, once.
    with django_capture_on_commit_callbacks(execute=True):
        assert services.notify_instance_stopped(instance=instance, reason=StopReason.CREDITS_EXHAUSTED)
    assert len(mails_to(mailoutbox, alice)) == 1


def test_it_emails_only_after_the_caller_commits(alice, mailoutbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.notify(user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED)
        assert mailoutbox == []

    assert len(callbacks) == 1


def test_it_keeps_the_caller_transaction_usable_after_a_duplicate(
    alice, mailoutbox, django_capture_on_commit_callbacks
):
    services.notify(user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED)

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        services.notify(user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED)
        # Had the duplicate INSERT failed outside a savepoint, PostgreSQL would refuse this query.
        assert Notification.objects.filter(user=alice).count() == 1


def test_it_records_but_does_not_email_an_optional_kind_the_user_turned_off(
    alice, bob, mailoutbox, django_capture_on_commit_callbacks
):
    services.email_preferences_set(user=alice, emailed_kinds=[])
    context = {"balance_hours": "0.83", "runway": "about 50 minutes", "burn_gpus": "1"}

    with django_capture_on_commit_callbacks(execute=True):
        for user in (alice, bob):
            services.notify(
                user=user, kind=Kind.CREDIT_LOW_1H, event_key="credit_low:x:after_entry:0", context=context
            )

    assert mails_to(mailoutbox, alice) == []
    assert len(mails_to(mailoutbox, bob)) == 1
    recorded = Notification.objects.get(user=alice)
    assert recorded.email_enabled is False and recorded.emailed_at is None
    # Even a stray delivery of the task sends nothing for it.
    assert services.notification_email_send(notification_id=recorded.pk) is False
    assert mails_to(mailoutbox, alice) == []


def test_it_emails_the_mandatory_kinds_whatever_the_preferences(
    alice, mailoutbox, django_capture_on_commit_callbacks
):
    services.email_preferences_set(user=alice, emailed_kinds=[])

    with django_capture_on_commit_callbacks(execute=True):
        services.notify_account_suspended(
            user=alice, reason="Crypto mining is not allowed.", suspended_at=timezone.now()
        )

    assert len(mails_to(mailoutbox, alice)) == 1


def test_the_database_refuses_to_turn_off_a_mandatory_kind(alice):
    with pytest.raises(IntegrityError), transaction.atomic():
        EmailOptOut.objects.create(user=alice, kind=Kind.INSTANCE_STOPPED)


def test_it_does_not_write_to_a_deleted_account(alice, mailoutbox, django_capture_on_commit_callbacks):
    pending = services.notify(
        user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
    )
    account_delete(user=alice)
    alice.refresh_from_db()

    with django_capture_on_commit_callbacks(execute=True):
        later = services.notify(
            user=alice, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:2", context=SUSPENDED
        )

    # The one queued before the deletion finds no address to write to when its task runs.
    assert services.notification_email_send(notification_id=pending.pk) is False
    assert later.email_enabled is False
    assert mailoutbox == []


def test_it_sends_a_new_suspension_after_an_unsuspend(alice, mailoutbox, django_capture_on_commit_callbacks):
    first_time = timezone.now()

    with django_capture_on_commit_callbacks(execute=True):
        services.notify_account_suspended(user=alice, reason="First warning.", suspended_at=first_time)
        services.notify_account_suspended(user=alice, reason="First warning.", suspended_at=first_time)
        services.notify_account_suspended(
            user=alice, reason="Again.", suspended_at=first_time + timedelta(days=3)
        )

    bodies = [message.body for message in mails_to(mailoutbox, alice)]
    assert len(bodies) == 2
    assert "Reason: First warning." in bodies[0] and "Reason: Again." in bodies[1]
