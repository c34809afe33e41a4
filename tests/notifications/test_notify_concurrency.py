"""Races on real PostgreSQL: workers reporting one event together record it once and email it once, and
duplicate deliveries of the email task racing each other send one email.

Each worker is a thread with its own database connection; a barrier releases them together. Rows are
committed (transaction=True), so every connection sees them.
"""

import time

import pytest
from django.db import transaction

from portal.notifications import services, tasks
from portal.notifications.models import Kind, Notification
from tests.conftest import mails_to

from ..conftest import make_user
from .conftest import run_together

# Transactional: the threads commit on their own connections (tests/conftest.py re-seeds the programs).
pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 3  # one lucky interleaving proves little
WORKERS = 6
SUSPENDED = {"reason": "Crypto mining is not allowed."}


def notify_suspended(user):
    return services.notify(
        user=user, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
    )


def errors(results):
    return [value for status, value in results if status == "error"]


def test_it_records_and_emails_once_when_workers_report_the_same_event_together(mailoutbox):
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")

        results = run_together([lambda person=person: notify_suspended(person) for _ in range(WORKERS)])

        assert errors(results) == []
        assert sum(1 for _, notification in results if notification is not None) == 1
        assert Notification.objects.filter(user=person).count() == 1
        assert len(mails_to(mailoutbox, person)) == 1


def test_it_records_once_when_callers_hold_their_transactions_open(mailoutbox):
    """Every caller passes the existence check before any commits, so the unique constraint decides:
    the others wait on the first INSERT and then find the row instead of failing their transaction."""

    def in_a_long_transaction(user):
        with transaction.atomic():
            notification = notify_suspended(user)
            time.sleep(0.3)  # still uncommitted while the others insert
            return notification

    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")

        results = run_together([lambda person=person: in_a_long_transaction(person) for _ in range(WORKERS)])

        assert errors(results) == []
        assert sum(1 for _, notification in results if notification is not None) == 1
        assert Notification.objects.filter(user=person).count() == 1
        assert len(mails_to(mailoutbox, person)) == 1


def test_it_sends_once_when_duplicate_deliveries_of_the_task_race(mailoutbox):
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")
        notification = Notification.objects.create(
            user=person, kind=Kind.ACCOUNT_SUSPENDED, event_key="suspension:1", context=SUSPENDED
        )

        results = run_together(
            # Plain threads, not tasks: Celery's "never block inside a task" guard is a process-wide flag
            # an earlier test's in-process worker may leave set, so it is waived here explicitly.
            [
                lambda pk=notification.pk: tasks.send.apply(args=[pk]).get(disable_sync_subtasks=False)
                for _ in range(WORKERS)
            ]
        )

        assert errors(results) == []
        assert sorted(sent for _, sent in results) == [False] * (WORKERS - 1) + [True]
        assert len(mails_to(mailoutbox, person)) == 1
        notification.refresh_from_db()
        assert notification.email_attempts == 1
