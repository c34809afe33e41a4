import pytest
from django.contrib.admin.models import LogEntry
from pytest_django.asserts import assertContains, assertNotContains

from portal.credits import services
from portal.credits.models import BonusApplication, CreditAccount, LedgerEntry

from .conftest import entries_of, shown_messages

HOUR = 3600


def review_url(application):
    return f"/admin/credits/bonusapplication/{application.pk}/change/"


def approve(client, application, hours, note=""):
    return client.post(
        review_url(application),
        {"approve-hours": hours, "approve-note": note, "_approve": "Approve"},
        follow=True,
    )


def reject(client, application, reason):
    return client.post(review_url(application), {"reject-reason": reason, "_reject": "Reject"}, follow=True)


@pytest.fixture
def application(alice, rocm_star):
    return services.bonus_apply(user=alice, program=rocm_star, evidence="https://certs.example.com/rocm/42")


def test_it_lists_applications_filtered_by_status_and_program(olivia_client, application, bob, hackathon):
    services.bonus_apply(user=bob, program=hackathon, evidence="HACK-7")

    pending_rocm = olivia_client.get(
        f"/admin/credits/bonusapplication/?status__exact=pending&program__id__exact={application.program_id}"
    )

    assertContains(pending_rocm, "alice@example.com")
    assertNotContains(pending_rocm, "bob@example.com")


def test_it_shows_a_pending_application_with_the_full_maximum_proposed(olivia_client, application):
    page = olivia_client.get(review_url(application))

    assertContains(page, "Review application from alice@example.com")
    assertContains(page, 'name="approve-hours" value="50.00"')
    assertContains(page, "0.00 of 50 GPU-hours; at most 50.00 more can be granted.")
    # Evidence is a link only because it is http(s).
    assertContains(page, 'href="https://certs.example.com/rocm/42"')


def test_it_approves_the_full_hours_and_records_the_operator(alice, olivia, olivia_client, application):
    response = approve(olivia_client, application, "50.00")

    assert (
        "Approved 50.00 GPU-hours of ROCm Star developer certificate for alice@example.com."
        in shown_messages(response)
    )
    application.refresh_from_db()
    assert (application.status, application.granted_gpu_seconds) == ("approved", 50 * HOUR)
    assert (application.decided_by, application.decided_by_name) == (olivia, "Olivia Operator")
    entry = entries_of(alice).get()
    assert (entry.kind, entry.gpu_seconds, entry.actor, entry.actor_name) == (
        "bonus",
        50 * HOUR,
        olivia,
        "Olivia Operator",
    )
    assert CreditAccount.objects.get(user=alice).balance_gpu_seconds == 50 * HOUR
    assert LogEntry.objects.filter(user=olivia, object_id=str(application.pk)).exists()


def test_it_approves_fewer_hours_with_a_note_the_applicant_sees(
    alice, alice_client, olivia_client, application
):
    approve(olivia_client, application, "20", note="Associate level: 20 hours")

    application.refresh_from_db()
    assert (application.granted_gpu_seconds, application.clamped) == (20 * HOUR, False)
    assert CreditAccount.objects.get(user=alice).balance_gpu_seconds == 20 * HOUR
    bonus_page = alice_client.get("/bonus/")
    assertContains(bonus_page, "Associate level: 20 hours")
    assertContains(bonus_page, "20.00")


def test_it_tells_the_operator_when_the_bonus_cap_clamps_the_grant(
    alice, olivia, olivia_client, application, hackathon
):
    earlier = services.bonus_apply(user=alice, program=hackathon, evidence="HACK-1")
    services.bonus_approve(application_id=earlier.pk, actor=olivia)  # 30 of the 50 used

    response = approve(olivia_client, application, "50.00")

    assert (
        "alice@example.com: requested 50.00 GPU-hours, granted 20.00 because of the 50 GPU-hour per-person bonus cap."
        in shown_messages(response)
    )
    application.refresh_from_db()
    assert (application.requested_gpu_seconds, application.granted_gpu_seconds) == (50 * HOUR, 20 * HOUR)
    account = CreditAccount.objects.get(user=alice)
    assert (account.bonus_gpu_seconds, account.balance_gpu_seconds) == (50 * HOUR, 50 * HOUR)


def test_it_shows_the_room_left_under_the_cap_before_approving(
    alice, olivia, olivia_client, application, hackathon
):
    earlier = services.bonus_apply(user=alice, program=hackathon, evidence="HACK-1")
    services.bonus_approve(application_id=earlier.pk, actor=olivia)

    assertContains(olivia_client.get(review_url(application)), "30.00 of 50 GPU-hours; at most 20.00 more")


@pytest.mark.parametrize(
    "hours, message",
    [
        ("", "Enter a number of GPU-hours."),
        ("lots", "Enter the hours as a number, for example 5 or 2.5."),
        ("0", "Grant more than zero hours, or reject the application instead."),
        ("-5", "Grant more than zero hours, or reject the application instead."),
        ("50.01", "ROCm Star developer certificate grants at most 50.00 GPU-hours."),
        ("1.005", "Use at most two decimals"),
    ],
)
def test_it_refuses_bad_hours_and_changes_nothing(alice, olivia_client, application, hours, message):
    response = approve(olivia_client, application, hours)

    assertContains(response, message)
    application.refresh_from_db()
    assert application.status == "pending"
    assert not entries_of(alice).exists()


def test_it_requires_a_reason_to_reject(olivia_client, application):
    response = reject(olivia_client, application, "   ")

    assertContains(response, "Give the applicant a reason for the rejection.")
    application.refresh_from_db()
    assert application.status == "pending"


def test_it_rejects_with_a_reason_the_applicant_sees(alice, alice_client, olivia, olivia_client, application):
    response = reject(
        olivia_client, application, "The certificate ID does not exist; check it and apply again."
    )

    assert (
        "Rejected the ROCm Star developer certificate application from alice@example.com."
        in shown_messages(response)
    )
    application.refresh_from_db()
    assert (application.status, application.decided_by, application.decided_by_name) == (
        "rejected",
        olivia,
        "Olivia Operator",
    )
    assert not entries_of(alice).exists()
    assert LogEntry.objects.filter(user=olivia, object_id=str(application.pk)).exists()
    assertContains(
        alice_client.get("/bonus/"), "The certificate ID does not exist; check it and apply again."
    )


def test_it_shows_a_decided_application_read_only(olivia, olivia_client, application):
    services.bonus_approve(application_id=application.pk, actor=olivia)

    page = olivia_client.get(review_url(application))

    assert page.status_code == 200
    assertNotContains(page, 'name="_approve"')
    assertNotContains(page, 'name="_reject"')
    assertNotContains(page, 'name="_save"')
    assertContains(page, "This application was approved by Olivia Operator")


def test_it_grants_once_when_the_approval_is_submitted_twice(alice, olivia_client, application):
    approve(olivia_client, application, "50")

    second = approve(olivia_client, application, "50")

    assert "This application was already approved by Olivia Operator; nothing changed." in " ".join(
        shown_messages(second)
    )
    assert entries_of(alice).count() == 1
    assert CreditAccount.objects.get(user=alice).balance_gpu_seconds == 50 * HOUR


def test_it_refuses_a_plain_edit_of_a_decided_application(olivia, olivia_client, application):
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Not found")

    response = olivia_client.post(review_url(application), {"status": "approved", "_save": "Save"})

    assert response.status_code == 403
    application.refresh_from_db()
    assert application.status == "rejected"


def test_it_cannot_add_or_delete_applications(olivia_client, application):
    assert olivia_client.get("/admin/credits/bonusapplication/add/").status_code == 403
    assert (
        olivia_client.post(
            f"/admin/credits/bonusapplication/{application.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    assert BonusApplication.objects.filter(pk=application.pk).exists()


def test_it_approves_selected_applications_in_bulk_for_their_full_hours(
    alice, bob, olivia, olivia_client, application, rocm_star
):
    bobs = services.bonus_apply(user=bob, program=rocm_star, evidence="ROCM-STAR-7")

    response = olivia_client.post(
        "/admin/credits/bonusapplication/",
        {"action": "approve_full", "_selected_action": [application.pk, bobs.pk]},
        follow=True,
    )

    assert response.status_code == 200
    for person in (alice, bob):
        assert CreditAccount.objects.get(user=person).balance_gpu_seconds == 50 * HOUR
        assert entries_of(person).get().actor_name == "Olivia Operator"
    assert LogEntry.objects.filter(user=olivia).count() == 2


def test_it_skips_decided_applications_in_bulk_and_reports_clamps(
    alice, bob, olivia, olivia_client, application, hackathon
):
    earlier = services.bonus_apply(user=alice, program=hackathon, evidence="HACK-1")
    services.bonus_approve(application_id=earlier.pk, actor=olivia)

    response = olivia_client.post(
        "/admin/credits/bonusapplication/",
        {"action": "approve_full", "_selected_action": [application.pk, earlier.pk]},
        follow=True,
    )

    messages = shown_messages(response)
    assert (
        "alice@example.com: requested 50.00 GPU-hours, granted 20.00 because of the 50 GPU-hour per-person bonus cap."
        in messages
    )
    assert "Skipped 1 application(s) that were already decided." in messages
    assert CreditAccount.objects.get(user=alice).bonus_gpu_seconds == 50 * HOUR
    assert LedgerEntry.objects.filter(kind="bonus").count() == 2
