"""/api/v1/bonus-applications: apply and list through credits' bonus_apply, with its messages and its rate
limits."""

import pytest

from portal.credits.models import BonusApplication, BonusProgram

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db
URL = "/api/v1/bonus-applications"


@pytest.fixture
def program(db):
    return BonusProgram.objects.get_or_create(
        slug="rocm-star", defaults={"name": "ROCm Star", "max_gpu_seconds": 50 * 3600}
    )[0]


def test_it_lists_programs_and_files_an_application(alice, program):
    _, api = token_for(alice)
    assert program.slug in [row["slug"] for row in api.get("/api/v1/bonus-programs").json()]
    answer = api.post(URL, {"program": program.slug, "evidence": "ROCM-STAR-2024-0042"})
    assert answer.status_code == 201, answer.content
    assert answer.json()["status"] == "pending" and answer.json()["program"] == program.slug
    assert [row["evidence"] for row in api.get(URL).json()] == ["ROCM-STAR-2024-0042"]


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        (
            {"program": "nope", "evidence": "ROCM-1"},
            "program",
            "That program is not taking applications right now.",
        ),
        (
            {"program": "rocm-star", "evidence": ""},
            "evidence",
            "Enter your certificate ID or the link to your certificate.",
        ),
        (
            {"program": "rocm-star", "evidence": "javascript:alert(1)"},
            "evidence",
            "A link must start with https:// or http://.",
        ),
    ],
)
def test_it_refuses_bad_input_with_the_pages_messages(alice, program, payload, field, message):
    _, api = token_for(alice)
    body = assert_problem(api.post(URL, payload), 400, kind="validation")
    assert message in body["errors"][field]
    assert not BonusApplication.objects.exists()


def test_it_applies_the_per_person_rate_limit(alice, program, settings):
    settings.BONUS_APPLICATIONS_PER_PERSON_PER_DAY = 1
    other = BonusProgram.objects.create(slug="other", name="Other", max_gpu_seconds=3600)
    _, api = token_for(alice)
    assert api.post(URL, {"program": program.slug, "evidence": "ROCM-1"}).status_code == 201
    body = assert_problem(
        api.post(URL, {"program": other.slug, "evidence": "ROCM-2"}), 429, kind="rate-limited"
    )
    assert "the most we take from one person" in body["detail"]
    assert BonusApplication.objects.count() == 1


def test_an_unconfirmed_account_gets_the_pages_refusal(charlie, program):
    # charlie cannot make a token (unconfirmed), so he uses the API from his logged-in browser.
    from django.test import Client

    browser = Client(enforce_csrf_checks=False)
    browser.force_login(charlie)
    body = assert_problem(
        browser.post(URL, {"program": program.slug, "evidence": "ROCM-1"}, content_type="application/json"),
        400,
    )
    assert body["detail"] == "Confirm your email address before applying for bonus hours."
