"""Operators review CI programme applications in the console as they review bonus hours: a list filtered
by status, approve with a monthly amount (this period's grant is posted at once) or reject with a reason,
each decision audited in its transaction and told to every owner; a table of each programme project's use
against its grant; and ending a grant."""

import re
from datetime import UTC, datetime

import pytest
from django.test import Client
from django.urls import reverse

from portal.audit.models import AuditEntry
from portal.credits.models import CreditAccount, LedgerEntry
from portal.credits.services import ledger_post
from portal.projects import ci_grants
from portal.projects.models import CIGrantApplication, Project, ProjectMembership
from tests.conftest import mails_to, make_staff, make_user, text
from tests.projects.conftest import HOUR, add_member, pool_balance

APPLICATION = {
    "repository_url": "https://github.com/vllm-project/vllm",
    "maintainers": "alice-gh",
    "purpose": "GPU tests of every pull request",
}


@pytest.fixture
def carol(vllm):
    """A second owner of vllm."""
    carol = make_user("carol@example.com", first_name="Carol")
    add_member(vllm, carol, role=ProjectMembership.Role.OWNER)
    return carol


@pytest.fixture
def application(vllm, alice):
    return ci_grants.ci_grant_apply(user=alice, project=vllm, **APPLICATION)


def review_url(application):
    return reverse("admin:projects_cigrantapplication_change", args=[application.pk])


def test_it_offers_the_default_monthly_hours(otto_client, application, settings):
    settings.CI_GRANT_DEFAULT_HOURS = 77

    page = otto_client.get(review_url(application))

    assert page.status_code == 200
    assert 'name="approve-hours" value="77"' in page.content.decode()
    assert "GPU tests of every pull request" in text(page)


def test_approving_grants_this_period_at_once_and_tells_every_owner(
    otto_client, otto, application, vllm, alice, bob, carol, mailoutbox, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = otto_client.post(
            review_url(application), {"_approve": "1", "approve-hours": "120", "approve-note": "Welcome"}
        )

    assert response.status_code == 302
    application.refresh_from_db()
    vllm.refresh_from_db()
    assert (application.status, application.granted_gpu_seconds) == ("approved", 120 * HOUR)
    assert vllm.ci_grant_gpu_seconds == 120 * HOUR
    assert pool_balance(vllm) == 120 * HOUR
    [grant] = LedgerEntry.objects.filter(account__project=vllm, kind=LedgerEntry.Kind.GRANT)
    assert grant.idempotency_key == ci_grants.grant_key(vllm.pk, vllm.ci_grant_period)
    entry = AuditEntry.objects.get(action="ci_grant.approve")
    assert (entry.actor, entry.details["monthly_hours"]) == (otto, "120.00")
    for owner in (alice, carol):
        [message] = mails_to(mailoutbox, owner)
        assert "joined the open-source CI programme: 120.00 GPU-hours a month" in message.subject
        assert "Note from the operator: Welcome" in message.body
    assert mails_to(mailoutbox, bob) == []  # a member, not an owner


def test_rejecting_needs_a_reason_which_the_owners_read(
    otto_client, application, vllm, alice, mailoutbox, django_capture_on_commit_callbacks
):
    blank = otto_client.post(review_url(application), {"_reject": "1", "reject-reason": ""})
    with django_capture_on_commit_callbacks(execute=True):
        otto_client.post(
            review_url(application), {"_reject": "1", "reject-reason": "Add an open-source licence"}
        )

    assert blank.status_code == 200 and "Give the applicant a reason" in text(blank)
    application.refresh_from_db()
    assert (application.status, application.decision_reason) == ("rejected", "Add an open-source licence")
    assert pool_balance(vllm) == 0
    assert AuditEntry.objects.get(action="ci_grant.reject").reason == "Add an open-source licence"
    [message] = mails_to(mailoutbox, alice)
    assert "was not approved" in message.subject
    assert "Reason: Add an open-source licence" in message.body
    page = ci_page(alice, vllm)
    assert "Reason: Add an open-source licence" in text(page)


def row_text(page, slug) -> str:
    """The visible text of the programme table's row for `slug`, whitespace collapsed."""
    row = page.content.decode().split(f'data-testid="ci-grant-{slug}"')[1].split("</tr>")[0]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row))


def ci_page(user, project):
    browser = Client()
    browser.force_login(user)
    return browser.get(reverse("projects:detail", args=[project.slug]))


def test_a_decision_that_cannot_be_audited_changes_nothing(application, vllm, olivia, monkeypatch):
    def refuse(**kwargs):
        raise RuntimeError("audit log unavailable")

    monkeypatch.setattr(ci_grants, "audit_record", refuse)

    with pytest.raises(RuntimeError):
        ci_grants.ci_grant_approve(application_id=application.pk, actor=olivia)

    application.refresh_from_db()
    assert application.status == "pending"
    assert pool_balance(vllm) == 0
    assert Project.objects.get(pk=vllm.pk).ci_grant_gpu_seconds == 0


def test_a_decided_application_cannot_be_decided_again(application, olivia):
    ci_grants.ci_grant_approve(application_id=application.pk, actor=olivia)

    with pytest.raises(Exception, match="already approved"):
        ci_grants.ci_grant_reject(application_id=application.pk, actor=olivia, reason="Second thoughts")


def test_the_list_filters_by_status(otto_client, application, triton, dave, olivia):
    other = ci_grants.ci_grant_apply(
        user=dave,
        project=triton,
        **{**APPLICATION, "repository_url": "https://github.com/triton-lang/triton"},
    )
    ci_grants.ci_grant_reject(application_id=other.pk, actor=olivia, reason="Not open source")
    changelist = reverse("admin:projects_cigrantapplication_changelist")

    pending = otto_client.get(changelist, {"status__exact": "pending"})
    rejected = otto_client.get(changelist, {"status__exact": "rejected"})

    assert "vllm-project/vllm" in text(pending) and "triton-lang/triton" not in text(pending)
    assert "triton-lang/triton" in text(rejected) and "vllm-project/vllm" not in text(rejected)


def test_staff_without_the_review_permission_can_neither_see_nor_decide(application):
    browser = Client()
    browser.force_login(make_staff("sam@ops.example.com"))

    listing = browser.get(reverse("admin:projects_cigrantapplication_changelist"))
    decision = browser.post(review_url(application), {"_approve": "1", "approve-hours": "100"})

    assert listing.status_code == 403
    assert decision.status_code in (302, 403) and CIGrantApplication.objects.get().status == "pending"


def test_the_console_shows_each_projects_use_against_its_grant(
    otto_client, application, vllm, olivia, settings
):
    settings.CI_GRANT_RENEWAL_DAY = 1
    ci_grants.ci_grant_approve(
        application_id=application.pk,
        actor=olivia,
        gpu_seconds=100 * HOUR,
        now=datetime(2026, 12, 3, tzinfo=UTC),
    )
    ledger_post(
        account=CreditAccount.objects.get(project=vllm),
        kind=LedgerEntry.Kind.USAGE,
        gpu_seconds=-30 * HOUR,
        idempotency_key="test-usage:1",
        reason="Test usage",
    )

    page = otto_client.get(reverse("admin:projects_cigrantapplication_programme"))

    assert page.status_code == 200
    cells = row_text(page, "vllm")
    assert "2026-12" in cells
    assert "100.00 100.00 30.00 70.00" in cells
    assert "2027-01-01" in cells


def test_an_operator_ends_a_grant_and_it_is_audited(otto_client, otto, application, vllm, olivia):
    ci_grants.ci_grant_approve(application_id=application.pk, actor=olivia)

    response = otto_client.post(
        reverse("admin:projects_cigrantapplication_end", args=[vllm.pk]), {"reason": "CI moved elsewhere"}
    )

    assert response.status_code == 302
    assert Project.objects.get(pk=vllm.pk).ci_grant_gpu_seconds == 0
    entry = AuditEntry.objects.get(action="ci_grant.end")
    assert (entry.actor, entry.reason) == (otto, "CI moved elsewhere")
    page = otto_client.get(reverse("admin:projects_cigrantapplication_programme"))
    assert "(expires, no renewal)" in text(page)


def test_the_owners_dashboard_entry_links_to_the_project(application, alice, olivia):
    from portal.notifications import kinds
    from portal.notifications.models import Notification

    ci_grants.ci_grant_reject(application_id=application.pk, actor=olivia, reason="Add a licence")

    rendered = kinds.render(Notification.objects.get(user=alice, kind="ci_grant_decision"))

    assert rendered.action_url == reverse("projects:detail", args=["vllm"])
    assert "Reason: Add a licence" in rendered.body
