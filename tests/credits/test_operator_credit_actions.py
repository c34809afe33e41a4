"""Adjusting credits and reviewing bonus applications each take their own operator permission: otto (the
Operators group) may; staff holding the credit models' change permissions (what these used to require)
may not. Personas come from tests/conftest.py."""

import re
import uuid

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from portal.audit.models import AuditEntry
from portal.credits import services
from portal.credits.models import BonusApplication, CertificateImport
from tests.conftest import make_staff

from .conftest import entries_of

QUEUE_URL = "/admin/credits/bonusapplication/"
IMPORT_URL = "/admin/credits/certificateimport/add/"
REASON = "We could not find this certificate ID; check it and apply again."


def adjust_url(user):
    return f"/admin/credits/creditaccount/adjust/{user.pk}/"


def review_url(application):
    return f"/admin/credits/bonusapplication/{application.pk}/change/"


@pytest.fixture
def applications(alice, bob, rocm_star):
    return [
        services.bonus_apply(user=person, program=rocm_star, evidence=f"ROCM-STAR-{number}")
        for number, person in enumerate((alice, bob))
    ]


@pytest.fixture
def credits_editor_client(db):
    """Staff holding every change permission of the credit models, and no operator permission."""
    browser = Client()
    browser.force_login(
        make_staff(
            "carl@ops.example.com",
            "accounts.view_user",
            "credits.view_creditaccount",
            "credits.change_creditaccount",
            "credits.view_bonusapplication",
            "credits.change_bonusapplication",
            "credits.view_certificateimport",
            "credits.add_certificateimport",
        )
    )
    return browser


def adjust_form(client, user, hours="5"):
    page = client.get(adjust_url(user)).content.decode()
    found = re.search(r'name="idempotency_key" value="([0-9a-f-]+)"', page)
    key = found.group(1) if found else str(uuid.uuid4())
    return {"hours": hours, "reason": "Conference voucher", "idempotency_key": key}


def statuses(applications):
    return [BonusApplication.objects.get(pk=a.pk).status for a in applications]


def test_an_operator_grants_credits(otto, otto_client, alice):
    response = otto_client.post(adjust_url(alice), adjust_form(otto_client, alice))

    assert response.status_code == 302
    entry = entries_of(alice).get()
    assert (entry.gpu_seconds, entry.actor) == (5 * 3600, otto)


def test_an_operator_approves_and_rejects_applications(otto, otto_client, applications):
    approve = {"approve-hours": "50", "approve-note": "", "_approve": "Approve"}
    otto_client.post(review_url(applications[0]), approve)
    otto_client.post(review_url(applications[1]), {"reject-reason": REASON, "_reject": "Reject"})

    assert statuses(applications) == ["approved", "rejected"]
    assert AuditEntry.objects.filter(actor=otto, action__in=["bonus.approve", "bonus.reject"]).count() == 2


def test_an_operator_rejects_a_selection_in_bulk(otto_client, applications):
    otto_client.post(
        QUEUE_URL,
        {
            "action": "reject_selected",
            "_selected_action": [a.pk for a in applications],
            "bulk-reason": REASON,
            "_confirm_reject": "Reject",
        },
    )

    assert statuses(applications) == ["rejected", "rejected"]


def test_an_operator_imports_certificate_ids(otto_client, rocm_star):
    response = otto_client.post(
        IMPORT_URL, {"program": rocm_star.pk, "file": SimpleUploadedFile("ids.csv", b"ROCM-STAR-7\n")}
    )

    assert response.status_code == 302
    assert CertificateImport.objects.filter(program=rocm_star).count() == 1


def test_staff_with_the_credit_models_change_permissions_cannot_grant_or_review(
    credits_editor_client, alice, applications, rocm_star
):
    adjusted = credits_editor_client.post(adjust_url(alice), adjust_form(credits_editor_client, alice, "100"))
    credits_editor_client.post(
        review_url(applications[0]), {"approve-hours": "50", "approve-note": "", "_approve": "Approve"}
    )
    credits_editor_client.post(
        QUEUE_URL, {"action": "approve_full", "index": "0", "_selected_action": [a.pk for a in applications]}
    )
    imported = credits_editor_client.post(
        IMPORT_URL, {"program": rocm_star.pk, "file": SimpleUploadedFile("ids.csv", b"ROCM-STAR-0\n")}
    )

    assert (adjusted.status_code, imported.status_code) == (403, 403)
    assert not entries_of(alice).filter(kind="adjustment").exists()
    assert not entries_of(alice).filter(gpu_seconds=100 * 3600).exists()
    assert statuses(applications) == ["pending", "pending"]
    assert not CertificateImport.objects.exists()
