"""Deciding several bonus applications at once from the review queue."""

import pytest
from django.test import Client
from pytest_django.asserts import assertContains, assertNotContains

from portal.audit.models import AuditEntry
from portal.credits import services
from portal.credits.models import BonusApplication, CreditAccount
from tests.conftest import mails_to

from ..conftest import make_user
from .conftest import shown_messages

HOUR = 3600
QUEUE_URL = "/admin/credits/bonusapplication/"
REASON = "We could not find these certificate IDs; check them and apply again."


@pytest.fixture
def dave(db):
    return make_user("dave@example.com", first_name="Dave")


@pytest.fixture
def applications(alice, bob, dave, rocm_star):
    return [
        services.bonus_apply(user=person, program=rocm_star, evidence=f"ROCM-STAR-{number}")
        for number, person in enumerate((alice, bob, dave))
    ]


def choose(action, applications, **extra):
    return {"action": action, "index": "0", "_selected_action": [a.pk for a in applications], **extra}


def confirm_reject(applications, reason):
    """What the confirmation page posts back: the selection, the action and the reason, without "index"."""
    return {
        "action": "reject_selected",
        "_selected_action": [a.pk for a in applications],
        "bulk-reason": reason,
        "_confirm_reject": "Reject",
    }


def statuses(applications):
    return [BonusApplication.objects.get(pk=a.pk).status for a in applications]


def test_it_asks_for_one_reason_before_rejecting_the_selection(olivia_client, applications):
    page = olivia_client.post(QUEUE_URL, choose("reject_selected", applications[:2]))

    assert page.status_code == 200
    assertContains(page, "These 2 pending applications will be rejected with the reason below.")
    assertContains(page, "alice@example.com")
    assertContains(page, "bob@example.com")
    assertNotContains(page, "dave@example.com")
    assertContains(page, 'name="bulk-reason"')
    assert statuses(applications) == ["pending", "pending", "pending"]


def test_it_rejects_the_selection_with_the_reason_audits_and_emails_each_applicant_once(
    alice, bob, dave, olivia, olivia_client, applications, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(QUEUE_URL, confirm_reject(applications[:2], REASON), follow=True)

    assert "Rejected 2 application(s); each applicant is emailed the reason." in shown_messages(response)
    assert statuses(applications) == ["rejected", "rejected", "pending"]
    for application, person in zip(applications[:2], (alice, bob)):
        application.refresh_from_db()
        assert (application.decided_by, application.decision_reason) == (olivia, REASON)
        entry = AuditEntry.objects.get(action="bonus.reject", target_id=str(application.pk))
        assert (entry.actor, entry.actor_name, entry.reason) == (
            olivia,
            "Olivia Operator <olivia@ops.example.com>",
            REASON,
        )
        [message] = mails_to(mailoutbox, person)
        assert "was not approved" in message.subject
        assert f"Reason: {REASON}" in message.body
    assert not mails_to(mailoutbox, dave)


def test_it_refuses_a_bulk_rejection_without_a_reason(
    olivia_client, applications, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(QUEUE_URL, confirm_reject(applications, "   "))

    assert response.status_code == 200
    assertContains(response, "Give the applicant a reason for the rejection.")
    assert statuses(applications) == ["pending", "pending", "pending"]
    assert not AuditEntry.objects.filter(action="bonus.reject").exists()
    assert not mailoutbox


def test_it_skips_applications_decided_before_the_bulk_rejection(
    bob, olivia, olivia_client, applications, mailoutbox, django_capture_on_commit_callbacks
):
    services.bonus_approve(application_id=applications[1].pk, actor=olivia)

    page = olivia_client.post(QUEUE_URL, choose("reject_selected", applications))
    assertContains(
        page, "1 selected application already decided will be left as it is: bob@example.com (approved)."
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = olivia_client.post(QUEUE_URL, confirm_reject(applications, REASON), follow=True)

    assert "Rejected 2 application(s); each applicant is emailed the reason." in shown_messages(response)
    assert "Skipped 1 application(s) that were already decided." in shown_messages(response)
    assert statuses(applications) == ["rejected", "approved", "rejected"]
    assert CreditAccount.objects.get(user=bob).balance_gpu_seconds == 50 * HOUR
    assert not mails_to(mailoutbox, bob)  # bob's approval email was never committed in this test


def test_it_approves_the_selection_audits_and_emails_each_applicant_once(
    alice, bob, dave, olivia, olivia_client, applications, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        olivia_client.post(QUEUE_URL, choose("approve_full", applications), follow=True)
    with django_capture_on_commit_callbacks(execute=True):
        # The same selection submitted again, e.g. from a stale tab: nothing more happens.
        again = olivia_client.post(QUEUE_URL, choose("approve_full", applications), follow=True)

    assert "Skipped 3 application(s) that were already decided." in shown_messages(again)
    for application, person in zip(applications, (alice, bob, dave)):
        assert CreditAccount.objects.get(user=person).balance_gpu_seconds == 50 * HOUR
        entry = AuditEntry.objects.get(action="bonus.approve", target_id=str(application.pk))
        assert entry.actor_name == "Olivia Operator <olivia@ops.example.com>"
        assert entry.details["granted_hours"] == "50.00"
        [message] = mails_to(mailoutbox, person)
        assert "50.00 GPU-hours added" in message.subject


def test_it_keeps_staff_without_the_permission_from_bulk_decisions(oscar, applications):
    oscar_client = Client()
    oscar_client.force_login(oscar)

    oscar_client.post(QUEUE_URL, choose("approve_full", applications))
    oscar_client.post(QUEUE_URL, confirm_reject(applications, REASON))

    assert statuses(applications) == ["pending", "pending", "pending"]
    assert not AuditEntry.objects.exists()
