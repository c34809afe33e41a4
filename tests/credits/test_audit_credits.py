"""Every operator action on credits leaves an audit entry: who, what, on what, and why."""

import re

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction

from portal.audit.models import AuditEntry
from portal.credits import services
from portal.credits.models import BonusProgram, CertificateImport, CertificateRow, SignupGrantProgram

HOUR = 3600
OLIVIA = "Olivia Operator <olivia@ops.example.com>"


@pytest.fixture
def application(alice, rocm_star):
    return services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")


def only_entry(action):
    return AuditEntry.objects.get(action=action)


def test_it_audits_a_credit_adjustment_once_even_when_the_form_is_posted_twice(alice, olivia, olivia_client):
    url = f"/admin/credits/creditaccount/adjust/{alice.pk}/"
    key = re.search(
        r'name="idempotency_key" value="([0-9a-f-]+)"', olivia_client.get(url).content.decode()
    ).group(1)
    form = {"hours": "-2.5", "reason": "Refund of a double charge reversed", "idempotency_key": key}

    olivia_client.post(url, form)
    olivia_client.post(url, form)

    entry = only_entry("credits.adjust")
    assert (entry.actor, entry.actor_name, entry.reason) == (
        olivia,
        OLIVIA,
        "Refund of a double charge reversed",
    )
    assert (entry.target_type, entry.target_id) == ("accounts.user", str(alice.pk))
    assert entry.details["hours"] == "-2.50"


def test_it_audits_an_approval_with_the_operators_note(alice, olivia, olivia_client, application):
    olivia_client.post(
        f"/admin/credits/bonusapplication/{application.pk}/change/",
        {"approve-hours": "20", "approve-note": "Associate level: 20 hours", "_approve": "Approve"},
    )

    entry = only_entry("bonus.approve")
    assert (entry.actor_name, entry.reason) == (OLIVIA, "Associate level: 20 hours")
    assert (entry.target_type, entry.target_id) == ("credits.bonusapplication", str(application.pk))
    assert (entry.details["requested_hours"], entry.details["granted_hours"]) == ("20.00", "20.00")
    assert entry.details["applicant"] == "alice@example.com"


def test_it_audits_an_approval_without_a_note_with_what_was_granted(olivia, application):
    services.bonus_approve(application_id=application.pk, actor=olivia)

    assert only_entry("bonus.approve").reason == "Approved 50.00 of 50.00 GPU-hours"


def test_it_audits_a_rejection_with_its_reason(olivia, olivia_client, application):
    olivia_client.post(
        f"/admin/credits/bonusapplication/{application.pk}/change/",
        {"reject-reason": "Certificate not found", "_reject": "Reject"},
    )

    entry = only_entry("bonus.reject")
    assert (entry.actor, entry.actor_name, entry.reason) == (olivia, OLIVIA, "Certificate not found")


def test_it_audits_nothing_when_the_decision_is_refused(olivia, application):
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate not found")

    with pytest.raises(ValidationError):
        services.bonus_approve(application_id=application.pk, actor=olivia)

    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["bonus.reject"]


def test_it_keeps_no_audit_entry_for_a_decision_that_rolled_back(olivia, application):
    with pytest.raises(RuntimeError), transaction.atomic():
        services.bonus_approve(application_id=application.pk, actor=olivia)
        raise RuntimeError("the request failed after the decision")

    assert not AuditEntry.objects.exists()
    application.refresh_from_db()
    assert application.status == "pending"


def test_it_audits_an_import_and_each_approval_it_made(olivia, olivia_client, rocm_star, application):
    olivia_client.post(
        "/admin/credits/certificateimport/add/",
        {
            "program": rocm_star.pk,
            "file": SimpleUploadedFile(
                "may.csv", b"id,email\nROCM-STAR-0042,alice@example.com\nROCM-STAR-0043,bob@example.com\n"
            ),
            "note": "List sent by the ROCm Star team on 3 May",
        },
    )

    batch = CertificateImport.objects.get()
    imported = only_entry("bonus.import")
    assert (imported.actor_name, imported.reason) == (OLIVIA, "List sent by the ROCm Star team on 3 May")
    assert (imported.target_type, imported.target_id) == ("credits.certificateimport", str(batch.pk))
    assert (imported.details["rows_read"], imported.details["new_ids"], imported.details["approved"]) == (
        2,
        2,
        1,
    )
    approved = only_entry("bonus.approve")
    assert (approved.actor_name, approved.target_id) == (OLIVIA, str(application.pk))
    assert (
        approved.reason == f"Certificate ID and holder listed in import #{batch.pk} (may.csv) by Olivia Operator"
    )


def test_it_audits_an_approval_at_application_time_as_the_system(alice, olivia, rocm_star):
    batch = services.certificates_import(
        program=rocm_star, rows=[CertificateRow("ROCM-STAR-0042", email=alice.email)], actor=olivia
    )

    services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    entry = only_entry("bonus.approve")
    assert (entry.actor, entry.actor_name) == (None, "system")
    assert entry.reason == f"Certificate ID and holder listed in import #{batch.pk} by Olivia Operator"


def test_it_audits_a_new_program_and_a_change_with_what_changed_and_why(olivia, olivia_client):
    form = {
        "name": "MI300X hackathon",
        "slug": "hackathon",
        "description": "",
        "evidence_label": "Team page URL",
        "hours": "12.5",
        "is_active": "on",
        "change_reason": "New program for the May hackathon",
    }
    olivia_client.post("/admin/credits/bonusprogram/add/", form)
    program = BonusProgram.objects.get(slug="hackathon")
    olivia_client.post(
        f"/admin/credits/bonusprogram/{program.pk}/change/",
        {**form, "hours": "20", "is_active": "", "change_reason": "Hackathon is over"},
    )

    created, changed = AuditEntry.objects.filter(action="program.change").order_by("id")
    assert (created.actor_name, created.reason, created.details["created"]) == (
        OLIVIA,
        "New program for the May hackathon",
        True,
    )
    assert created.details["values"]["max_gpu_seconds"] == 45000
    assert (changed.reason, changed.target_id) == ("Hackathon is over", str(program.pk))
    assert changed.details["changes"] == {
        "max_gpu_seconds": {"from": 45000, "to": 20 * HOUR},
        "is_active": {"from": True, "to": False},
    }


def test_it_audits_a_signup_grant_change_without_touching_the_granted_count(olivia, olivia_client):
    program = SignupGrantProgram.objects.get(name="Early-registrant grant")
    SignupGrantProgram.objects.filter(pk=program.pk).update(granted_count=7)

    olivia_client.post(
        f"/admin/credits/signupgrantprogram/{program.pk}/change/",
        {
            "name": program.name,
            "hours": "25",
            "max_accounts": "20000",
            "open_until_0": "",
            "open_until_1": "",
            "is_active": "on",
            "change_reason": "Second GPU batch arrived",
        },
    )

    entry = only_entry("program.change")
    assert (entry.actor_name, entry.reason) == (OLIVIA, "Second GPU batch arrived")
    assert entry.details["changes"] == {"max_accounts": {"from": program.max_accounts, "to": 20000}}
    program.refresh_from_db()
    assert (program.max_accounts, program.granted_count) == (20000, 7)


def test_it_shows_credit_actions_on_the_audit_page(alice, olivia, olivia_client, application):
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate not found")

    page = olivia_client.get("/console/audit/", {"q": "Certificate not found"})

    assert "Bonus application rejected" in page.content.decode()
