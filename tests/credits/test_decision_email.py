"""Each bonus decision emails the applicant once, after the decision is committed."""

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from portal.credits import services
from portal.notifications.models import Notification
from tests.conftest import mails_to


@pytest.fixture
def application(alice, rocm_star):
    return services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")


def test_it_emails_the_hours_granted_once_the_approval_commits(
    alice, olivia, application, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        services.bonus_approve(
            application_id=application.pk, actor=olivia, gpu_seconds=20 * 3600, reason="Associate level"
        )
        assert not mailoutbox  # nothing leaves before the commit
    for callback in callbacks:
        callback()

    [message] = mails_to(mailoutbox, alice)
    assert "application was approved: 20.00 GPU-hours added" in message.subject
    assert "20.00 GPU-hours were added to your balance" in message.body
    assert "Note from the operator: Associate level" in message.body


def test_it_emails_the_reason_of_a_rejection(
    alice, olivia, application, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate ID not found")

    [message] = mails_to(mailoutbox, alice)
    assert "was not approved" in message.subject
    assert "Reason: Certificate ID not found" in message.body


def test_it_does_not_email_a_second_time_when_the_decision_is_repeated(
    alice, olivia, application, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        services.bonus_approve(application_id=application.pk, actor=olivia)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ValidationError):
        services.bonus_reject(application_id=application.pk, actor=olivia, reason="Second thoughts")

    assert len(mails_to(mailoutbox, alice)) == 1
    assert Notification.objects.filter(user=alice, kind="bonus_decision").count() == 1


def test_it_emails_nobody_when_the_decision_rolls_back(
    alice, olivia, application, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        services.bonus_approve(application_id=application.pk, actor=olivia)
        raise RuntimeError("the request failed after the decision")

    assert not mailoutbox
    assert not Notification.objects.filter(user=alice).exists()


def test_it_shows_the_decision_on_the_applicants_dashboard(alice, alice_client, olivia, application):
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate ID not found")

    page = alice_client.get("/notifications/")

    assert "application was not approved" in page.content.decode()
