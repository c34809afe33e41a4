"""Attacks on bonus hours and 8x access by guessing or borrowing certificate IDs, through the real pages:
the applicant's bonus form, the operator's CSV import, the review console and the launch form."""

import uuid

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from pytest_django.asserts import assertContains, assertNotContains
from social_django.models import UserSocialAuth

from portal.credits import services
from portal.credits.models import BonusApplication, CreditAccount, IssuedCertificate
from portal.instances.models import Instance, LaunchPolicy
from provisioning.drivers import fake

from ..conftest import make_user

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600
IMPORT_URL = "/admin/credits/certificateimport/add/"
LISTED_ID = "ROCM-STAR-0042"


@pytest.fixture
def launchable(db, rocm_star):
    """A host and an image offering 1x and 8x; free accounts launch 1x, a bonus approval opens 8x."""
    fake.make_host("gpu-01")
    fake.make_image("cpu", sizes=["1x", "8x"])
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x"], bonus_sizes=["8x"], max_live_instances=4)


@pytest.fixture
def mallory(db):
    return make_user("mallory@example.net", first_name="Mallory")


def browser_of(user) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def apply(user, program, evidence):
    return browser_of(user).post("/bonus/", {"program": program.pk, "evidence": evidence})


def import_list(olivia_client, program, csv_text: str, *, trust_bare_ids=False):
    data = {
        "program": program.pk,
        "file": SimpleUploadedFile("rocm-star.csv", csv_text.encode(), content_type="text/csv"),
        "note": "",
    }
    if trust_bare_ids:
        data["trust_bare_ids"] = "on"
    return olivia_client.post(IMPORT_URL, data, follow=True)


def application_of(user, program) -> BonusApplication:
    return BonusApplication.objects.get(user=user, program=program)


def bonus_of(user) -> int:
    account = CreditAccount.objects.filter(user=user).first()
    return account.bonus_gpu_seconds if account else 0


def launches_8x(user) -> bool:
    """Whether the user's 8x launch goes through: they need credits for it, so they get them first."""
    services.credits_adjust(
        user=user, gpu_seconds=25 * HOUR, reason="Test credit", actor=None, idempotency_key=str(uuid.uuid4())
    )
    browser_of(user).post(reverse("instances:launch"), {"size": "8x", "image": "cpu"})
    return Instance.objects.filter(user=user, size="8x").exists()


def github_login(user, login, uid):
    UserSocialAuth.objects.create(user=user, provider="github", uid=str(uid), extra_data={"login": login})


# --- One application, one guess ---------------------------------------------------------------------------


def twenty_five_guesses(listed_at: int, parameter=lambda index: "abcdefghijklmnopqrstuvwxy"[index]) -> str:
    guesses = [f"ROCM-STAR-{number:04d}" for number in range(18, 43)]
    assert len(guesses) == 25 and guesses[listed_at] == LISTED_ID
    query = "&".join(f"{parameter(index)}={guess}" for index, guess in enumerate(guesses))
    link = f"https://certs.example.com/verify?{query}"
    assert len(link) <= 500
    return link


def test_it_does_not_approve_a_link_stuffed_with_25_guesses_in_different_parameters(
    mallory, olivia_client, rocm_star
):
    import_list(olivia_client, rocm_star, f"certificate_id\n{LISTED_ID}\n", trust_bare_ids=True)

    apply(mallory, rocm_star, twenty_five_guesses(listed_at=24))

    application = application_of(mallory, rocm_star)
    assert application.status == "pending"
    assert bonus_of(mallory) == 0
    assert IssuedCertificate.objects.get().claimed_by is None


def test_it_refuses_a_link_that_names_several_certificate_ids_and_files_nothing(
    mallory, olivia_client, rocm_star
):
    import_list(olivia_client, rocm_star, f"certificate_id\n{LISTED_ID}\n", trust_bare_ids=True)
    link = twenty_five_guesses(listed_at=24, parameter=lambda index: "id")

    response = apply(mallory, rocm_star, link)

    assert response.status_code == 200
    assertContains(response, "This link names several certificate IDs")
    assertContains(response, f'value="{link}"'.replace("&", "&amp;"))
    assert not BonusApplication.objects.exists()
    assert bonus_of(mallory) == 0


def test_it_refuses_evidence_that_lists_several_ids(mallory, rocm_star):
    response = apply(mallory, rocm_star, "ROCM-STAR-2025-0041, ROCM-STAR-2025-0042 ROCM-STAR-2025-0043")

    assertContains(response, "Enter one certificate ID")
    assert not BonusApplication.objects.exists()


# --- The listed holder, not whoever knows the ID ----------------------------------------------------------


def test_an_impostor_with_a_listed_id_stays_pending_without_8x_and_the_holder_is_approved_with_8x(
    alice, mallory, olivia_client, rocm_star, launchable
):
    import_list(olivia_client, rocm_star, f"certificate_id,email\n{LISTED_ID},Alice@Example.com\n")

    apply(mallory, rocm_star, f"https://certs.example.com/verify/{LISTED_ID}")
    apply(alice, rocm_star, LISTED_ID.lower())

    impostors = application_of(mallory, rocm_star)
    assert (impostors.status, bonus_of(mallory)) == ("pending", 0)
    assert not launches_8x(mallory)
    holders = application_of(alice, rocm_star)
    assert (holders.status, bonus_of(alice)) == ("approved", 50 * HOUR)
    assert launches_8x(alice)


def test_the_import_approves_the_holder_by_github_login_not_the_impostor_who_applied_first(
    bob, mallory, olivia_client, rocm_star, launchable
):
    github_login(bob, "bob-builds", uid=101)
    github_login(mallory, "mallory", uid=666)
    apply(mallory, rocm_star, LISTED_ID)
    apply(bob, rocm_star, f"https://certs.example.com/v?id={LISTED_ID}")

    import_list(olivia_client, rocm_star, f"certificate_id;github;issued_on\n{LISTED_ID};Bob-Builds;2025-05-01\n")

    assert application_of(mallory, rocm_star).status == "pending"
    assert not launches_8x(mallory)
    assert application_of(bob, rocm_star).status == "approved"
    assert launches_8x(bob)


# --- Lists without holders ----------------------------------------------------------------------------------


def test_a_list_without_holders_approves_nothing_unless_the_operator_trusts_bare_ids(
    alice, olivia_client, rocm_star
):
    response = import_list(olivia_client, rocm_star, f"certificate_id\n{LISTED_ID}\n")

    apply(alice, rocm_star, LISTED_ID)

    assert application_of(alice, rocm_star).status == "pending"
    assert bonus_of(alice) == 0
    assertContains(response, "no holders")


def test_a_trusted_bare_id_grants_the_hours_but_does_not_open_8x(alice, olivia_client, rocm_star, launchable):
    import_list(olivia_client, rocm_star, f"certificate_id\n{LISTED_ID}\n", trust_bare_ids=True)

    apply(alice, rocm_star, LISTED_ID)

    assert application_of(alice, rocm_star).status == "approved"
    assert bonus_of(alice) == 50 * HOUR
    assert not launches_8x(alice)
    page = browser_of(alice).get(reverse("instances:list"))
    assertContains(page, "approved from the certificate list alone")


# --- Rate limits ------------------------------------------------------------------------------------------


def test_it_limits_how_many_applications_one_person_files(
    settings, mallory, olivia, rocm_star, hackathon
):
    settings.BONUS_APPLICATIONS_PER_PERSON_PER_DAY = 2
    apply(mallory, rocm_star, "ROCM-STAR-2025-0001")
    services.bonus_reject(
        application_id=application_of(mallory, rocm_star).pk, actor=olivia, reason="Not a certificate"
    )
    apply(mallory, rocm_star, "ROCM-STAR-2025-0002")
    services.bonus_reject(
        application_id=BonusApplication.objects.get(user=mallory, status="pending").pk,
        actor=olivia,
        reason="Not a certificate",
    )

    third = apply(mallory, hackathon, "HACK-0003")

    assert third.status_code == 200
    assertContains(third, "You have filed 2 bonus applications in the last 24 hours")
    assertContains(third, 'value="HACK-0003"')
    assert BonusApplication.objects.filter(user=mallory).count() == 2


def test_it_limits_how_many_applications_one_program_takes_per_hour(settings, alice, bob, mallory, rocm_star):
    settings.BONUS_APPLICATIONS_PER_PROGRAM_PER_HOUR = 2
    apply(alice, rocm_star, "ROCM-STAR-2025-0001")
    apply(bob, rocm_star, "ROCM-STAR-2025-0002")

    third = apply(mallory, rocm_star, "ROCM-STAR-2025-0003")

    assert third.status_code == 200
    assertContains(third, "is taking many applications right now")
    assertContains(third, 'value="ROCM-STAR-2025-0003"')
    assert BonusApplication.objects.filter(program=rocm_star).count() == 2


# --- The console shows who else named the ID --------------------------------------------------------------


def test_the_review_page_lists_every_other_application_that_named_the_same_id(
    alice, bob, mallory, olivia, olivia_client, rocm_star, hackathon
):
    apply(alice, rocm_star, LISTED_ID)
    apply(bob, rocm_star, f"https://certs.example.com/verify/{LISTED_ID.lower()}")
    apply(mallory, hackathon, f"https://certs.example.com/v?id={LISTED_ID}&lang=en")
    services.bonus_approve(application_id=application_of(bob, rocm_star).pk, actor=olivia)
    unrelated = make_user("dave@example.com")
    apply(unrelated, rocm_star, "ROCM-STAR-2025-0099")

    review = olivia_client.get(f"/admin/credits/bonusapplication/{application_of(alice, rocm_star).pk}/change/")
    decided = olivia_client.get(f"/admin/credits/bonusapplication/{application_of(bob, rocm_star).pk}/change/")

    same_id = review.content.decode().split('data-testid="same-id"', 1)[1].split("</div>", 1)[0]
    assert "bob@example.com" in same_id and "mallory@example.net" in same_id
    assert f"/admin/credits/bonusapplication/{application_of(bob, rocm_star).pk}/change/" in same_id
    assert "dave@example.com" not in same_id
    assertContains(decided, "alice@example.com")
    assertContains(decided, "mallory@example.net")
    assertNotContains(decided, "dave@example.com")
