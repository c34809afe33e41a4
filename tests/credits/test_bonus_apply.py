import pytest
from pytest_django.asserts import assertContains, assertNotContains, assertRedirects

from portal.credits import services
from portal.credits.models import BonusApplication, BonusProgram, CreditAccount

HOUR = 3600


def apply(client, program, evidence):
    return client.post("/bonus/", {"program": program.pk, "evidence": evidence})


def test_it_lists_active_programs_with_their_maximum(alice_client, rocm_star):
    BonusProgram.objects.create(name="Retired program", slug="retired", max_gpu_seconds=HOUR, is_active=False)

    response = alice_client.get("/bonus/")

    assertContains(response, "ROCm Star developer certificate")
    assertContains(response, "Up to 50.00 GPU-hours")
    assertNotContains(response, "Retired program")


@pytest.mark.parametrize("evidence", ["ROCM-STAR-2024-0042", "https://certs.example.com/rocm-star/0042"])
def test_it_files_an_application_and_shows_it_pending(alice, alice_client, rocm_star, evidence):
    response = apply(alice_client, rocm_star, evidence)

    assertRedirects(response, "/bonus/", fetch_redirect_response=False)
    application = BonusApplication.objects.get(user=alice)
    assert (application.program, application.evidence, application.status) == (rocm_star, evidence, "pending")
    page = alice_client.get("/bonus/")
    assertContains(page, "Your application for ROCm Star developer certificate was sent for review.")
    assertContains(page, '<span class="pill pill-pending">Pending review</span>', html=True)
    assertContains(page, evidence)


@pytest.mark.parametrize(
    "evidence, message",
    [
        ("", "Enter your certificate ID or the link to your certificate."),
        ("    ", "Enter your certificate ID or the link to your certificate."),
        ("ftp://certs.example.com/0042", "A link must start with https:// or http://."),
        ("javascript:alert(1)", "A link must start with https:// or http://."),
        ("www.example.com/cert/0042", "A link must start with https:// or http://."),
        ("https://not a host/0042", "That link is not a valid web address."),
        ("R" * 501, "Keep it to 500 characters or fewer (it has 501)."),
    ],
)
def test_it_refuses_bad_evidence_and_keeps_the_input(alice, alice_client, rocm_star, evidence, message):
    response = apply(alice_client, rocm_star, evidence)

    assert response.status_code == 200
    assertContains(response, message)
    if evidence.strip():
        assertContains(response, f'value="{evidence}"')
    assert not BonusApplication.objects.exists()


def test_it_shows_the_service_refusal_for_a_second_application_and_keeps_the_input(
    alice, alice_client, rocm_star
):
    apply(alice_client, rocm_star, "ROCM-STAR-1")

    response = apply(alice_client, rocm_star, "ROCM-STAR-2")

    assertContains(response, "You already have an application for ROCm Star developer certificate.")
    assertContains(response, 'value="ROCM-STAR-2"')
    assert list(BonusApplication.objects.values_list("evidence", flat=True)) == ["ROCM-STAR-1"]


def test_it_allows_a_new_application_after_a_rejection(alice, alice_client, rocm_star, olivia):
    first = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-typo")
    services.bonus_reject(application_id=first.pk, actor=olivia, reason="No such certificate")

    assertRedirects(apply(alice_client, rocm_star, "ROCM-STAR-0042"), "/bonus/")

    assert BonusApplication.objects.filter(user=alice).count() == 2


def test_it_refuses_an_inactive_program(alice, alice_client):
    retired = BonusProgram.objects.create(
        name="Retired", slug="retired", max_gpu_seconds=HOUR, is_active=False
    )

    response = apply(alice_client, retired, "CERT-1")

    assertContains(response, "That program is not taking applications right now.")
    assert not BonusApplication.objects.exists()


def test_it_refuses_someone_already_at_the_bonus_cap(alice, alice_client, rocm_star):
    CreditAccount.objects.create(user=alice, bonus_gpu_seconds=50 * HOUR)

    response = apply(alice_client, rocm_star, "ROCM-STAR-1")

    assertContains(response, "You already have the maximum of 50 bonus GPU-hours across all programs.")
    assert not BonusApplication.objects.exists()


def test_it_tells_an_unverified_user_why_they_cannot_apply(charlie_client, rocm_star):
    page = charlie_client.get("/bonus/")

    assertContains(page, "Confirm your email address before applying")
    assertNotContains(page, 'name="evidence"')


def test_it_refuses_an_application_posted_by_an_unverified_user(charlie_client, rocm_star):
    response = apply(charlie_client, rocm_star, "ROCM-STAR-1")

    assertContains(response, "Confirm your email address before applying for bonus hours.")
    assert not BonusApplication.objects.exists()


def test_it_shows_the_applicant_the_granted_hours_and_the_operators_note(
    alice, alice_client, rocm_star, olivia
):
    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-1")
    services.bonus_approve(
        application_id=application.pk, actor=olivia, gpu_seconds=20 * HOUR, reason="Level 1 cert"
    )

    page = alice_client.get("/bonus/")

    table = page.content.decode().split('data-testid="applications"', 1)[1]
    assert "Approved" in table and "20.00" in table and "Level 1 cert" in table


def test_it_shows_the_applicant_the_rejection_reason(alice, alice_client, rocm_star, olivia):
    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-1")
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate ID not found")

    page = alice_client.get("/bonus/")

    assertContains(page, '<span class="pill pill-rejected">Rejected</span>', html=True)
    assertContains(page, "Certificate ID not found")


def test_it_preselects_a_program_not_applied_to_yet(alice, alice_client, rocm_star):
    hackathon = BonusProgram.objects.create(name="A hackathon", slug="hackathon", max_gpu_seconds=HOUR)
    services.bonus_apply(user=alice, program=hackathon, evidence="HACK-1")

    page = alice_client.get("/bonus/")

    assertContains(page, f'<option value="{rocm_star.pk}" selected>', html=False)
