"""/api/v1/projects/<slug>/ci-grant-application: an owner applies for the open-source CI programme and
reads its state; a member is refused (403), an outsider finds nothing (404), a second open application
is a conflict (409)."""

import pytest

from portal.projects import ci_grants
from portal.projects import services as project_services
from portal.projects.models import CIGrantApplication, ProjectMembership
from tests.conftest import make_user

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/projects/vllm/ci-grant-application"
BODY = {
    "repository_url": "https://github.com/vllm-project/vllm",
    "maintainers": "alice-gh",
    "purpose": "GPU tests of every pull request",
}


@pytest.fixture
def vllm(alice, bob):
    project = project_services.project_create(user=alice, slug="vllm", name="vLLM")
    ProjectMembership.objects.create(project=project, user=bob, role="member")
    return project


def test_an_owner_applies_and_reads_the_state(vllm, alice_api):
    before = alice_api.get(URL)

    created = alice_api.post(URL, BODY)
    after = alice_api.get(URL)

    assert before.status_code == 200 and before.json() == {"application": None, "grant": None}
    assert created.status_code == 201, created.content
    assert created.json()["application"]["status"] == "pending"
    assert after.json()["application"]["repository_url"] == BODY["repository_url"]
    assert after.json()["grant"] is None


def test_it_shows_the_grant_once_approved(vllm, alice_api, olivia):
    alice_api.post(URL, BODY)
    ci_grants.ci_grant_approve(
        application_id=CIGrantApplication.objects.get().pk, actor=olivia, gpu_seconds=100 * 3600
    )

    state = alice_api.get(URL).json()

    assert state["application"]["status"] == "approved"
    assert state["application"]["monthly_gpu_hours"] == "100.00"
    assert (state["grant"]["granted_gpu_hours"], state["grant"]["left_gpu_hours"]) == ("100.00", "100.00")
    assert state["grant"]["renews"] is True


def test_a_second_open_application_is_a_conflict(vllm, alice_api):
    alice_api.post(URL, BODY)

    response = alice_api.post(URL, BODY)

    assert_problem(response, 409, kind="conflict")
    assert CIGrantApplication.objects.count() == 1


def test_a_repository_that_is_not_https_is_refused(vllm, alice_api):
    response = alice_api.post(URL, {**BODY, "repository_url": "http://github.com/vllm-project/vllm"})

    assert_problem(response, 400, kind="validation")


def test_a_member_who_is_not_an_owner_may_neither_apply_nor_read_it(vllm, bob_api):
    assert_problem(bob_api.post(URL, BODY), 403)
    assert_problem(bob_api.get(URL), 403)
    assert not CIGrantApplication.objects.exists()


def test_an_outsider_finds_no_project(vllm):
    _, dave_api = token_for(make_user("dave@example.com"))

    assert_problem(dave_api.post(URL, BODY), 404)
    assert_problem(dave_api.get(URL), 404)
    assert not CIGrantApplication.objects.exists()
