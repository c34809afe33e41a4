import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from pytest_django.asserts import assertContains

from portal.credits.models import BonusProgram, SignupGrantProgram

HOUR = 3600


@pytest.fixture
def signup_program(db):
    """The program seeded by migration 0003."""
    return SignupGrantProgram.objects.get(name="Early-registrant grant")


def signup_form(**changes):
    form = {
        "name": "Early-registrant grant",
        "hours": "25",
        "max_accounts": "10000",
        "open_until_0": "",
        "open_until_1": "",
        "is_active": "on",
        "change_reason": "Quarterly review of the grant",
    }
    return {**form, **changes}


def bonus_form(**changes):
    form = {
        "name": "MI300X hackathon",
        "slug": "hackathon",
        "description": "Took part in an MI300X hackathon.",
        "evidence_label": "Team page URL",
        "hours": "12.5",
        "is_active": "on",
        "change_reason": "New program for the MI300X hackathon",
    }
    return {**form, **changes}


def test_it_lists_the_signup_grant_in_hours_with_its_count(olivia_client, signup_program):
    page = olivia_client.get("/admin/credits/signupgrantprogram/")

    assertContains(page, "Early-registrant grant")
    assertContains(page, "25.00")
    assertContains(page, "10000")


def test_it_edits_the_signup_grant_in_hours_and_stores_seconds(olivia, olivia_client, signup_program):
    response = olivia_client.post(
        f"/admin/credits/signupgrantprogram/{signup_program.pk}/change/",
        signup_form(hours="30", max_accounts="500", open_until_0="2030-01-31", open_until_1="23:59:00"),
    )

    assert response.status_code == 302
    signup_program.refresh_from_db()
    assert (signup_program.gpu_seconds, signup_program.max_accounts) == (30 * HOUR, 500)
    assert signup_program.open_until.isoformat() == "2030-01-31T23:59:00+00:00"
    assert LogEntry.objects.get(user=olivia, action_flag=CHANGE, object_id=str(signup_program.pk))


def test_it_shows_the_hours_but_never_edits_the_granted_count(olivia_client, signup_program):
    SignupGrantProgram.objects.filter(pk=signup_program.pk).update(granted_count=7)
    url = f"/admin/credits/signupgrantprogram/{signup_program.pk}/change/"

    assertContains(olivia_client.get(url), 'name="hours" value="25.00"')
    olivia_client.post(url, signup_form(granted_count="0"))

    signup_program.refresh_from_db()
    assert signup_program.granted_count == 7


def test_it_adds_a_bonus_program_entered_in_hours(olivia, olivia_client, alice_client):
    response = olivia_client.post("/admin/credits/bonusprogram/add/", bonus_form())

    assert response.status_code == 302
    program = BonusProgram.objects.get(slug="hackathon")
    assert (program.max_gpu_seconds, program.evidence_label, program.is_active) == (
        45000,
        "Team page URL",
        True,
    )
    assert LogEntry.objects.get(user=olivia, action_flag=ADDITION, object_id=str(program.pk))
    page = alice_client.get("/bonus/")
    assertContains(page, "MI300X hackathon")
    assertContains(page, "Up to 12.50 GPU-hours")


def test_it_switches_a_bonus_program_off(olivia_client, alice_client, rocm_star):
    olivia_client.post(
        f"/admin/credits/bonusprogram/{rocm_star.pk}/change/",
        bonus_form(name=rocm_star.name, slug=rocm_star.slug, hours="50", is_active=""),
    )

    rocm_star.refresh_from_db()
    assert not rocm_star.is_active
    assert "ROCm Star" not in alice_client.get("/bonus/").content.decode()


@pytest.mark.parametrize(
    "hours, message",
    [
        ("", "Enter a number of GPU-hours."),
        ("0", "Ensure this value is greater than or equal to 0.01."),
        ("-5", "Ensure this value is greater than or equal to 0.01."),
        ("fifty", "Enter the hours as a number, for example 5 or 2.5."),
    ],
)
def test_it_refuses_bad_hours_on_both_programs(olivia_client, signup_program, rocm_star, hours, message):
    signup = olivia_client.post(
        f"/admin/credits/signupgrantprogram/{signup_program.pk}/change/", signup_form(hours=hours)
    )
    bonus = olivia_client.post(
        f"/admin/credits/bonusprogram/{rocm_star.pk}/change/",
        bonus_form(name=rocm_star.name, slug=rocm_star.slug, hours=hours),
    )

    assertContains(signup, message)
    assertContains(bonus, message)
    signup_program.refresh_from_db()
    rocm_star.refresh_from_db()
    assert (signup_program.gpu_seconds, rocm_star.max_gpu_seconds) == (25 * HOUR, 50 * HOUR)


def test_it_refuses_a_program_change_without_a_reason(olivia_client, rocm_star):
    response = olivia_client.post(
        f"/admin/credits/bonusprogram/{rocm_star.pk}/change/",
        bonus_form(name=rocm_star.name, slug=rocm_star.slug, hours="10", change_reason="  "),
    )

    assertContains(response, "Say why; the reason is recorded in the audit log.")
    rocm_star.refresh_from_db()
    assert rocm_star.max_gpu_seconds == 50 * HOUR


def test_it_refuses_a_bonus_program_without_a_name_or_with_a_taken_slug(olivia_client, rocm_star):
    response = olivia_client.post("/admin/credits/bonusprogram/add/", bonus_form(name="", slug="rocm-star"))

    assertContains(response, "This field is required.")
    assertContains(response, "Bonus program with this Slug already exists.")
    assert BonusProgram.objects.count() == 1


def test_it_never_deletes_a_program(olivia_client, rocm_star, signup_program):
    assert (
        olivia_client.post(f"/admin/credits/bonusprogram/{rocm_star.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    url = f"/admin/credits/signupgrantprogram/{signup_program.pk}/delete/"
    assert olivia_client.post(url, {"post": "yes"}).status_code == 403
    assert BonusProgram.objects.filter(pk=rocm_star.pk).exists()


def test_it_sends_a_non_staff_user_away_from_program_editing(bob_client, rocm_star):
    response = bob_client.post(
        f"/admin/credits/bonusprogram/{rocm_star.pk}/change/",
        bonus_form(name=rocm_star.name, slug=rocm_star.slug, hours="5000"),
    )

    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    rocm_star.refresh_from_db()
    assert rocm_star.max_gpu_seconds == 50 * HOUR
