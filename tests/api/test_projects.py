"""/api/v1/projects and project launches: members see their projects, owners their members and limits;
nobody outside a project can see it, its instances, launch for it or change it (404 as if it did not
exist), and a member cannot change its limits (403)."""

import pytest

from portal.credits.models import CreditAccount
from portal.instances import services as instance_services
from portal.instances.models import Instance
from portal.projects import services as project_services
from portal.projects.models import Project, ProjectMembership
from tests.conftest import give, make_user
from tests.projects.conftest import fund

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def dave(db):
    return make_user("dave@example.com")


@pytest.fixture
def vllm(alice, bob):
    """alice owns it, bob is a member, 10 GPU-hours in its pool."""
    project = project_services.project_create(user=alice, slug="vllm", name="vLLM")
    ProjectMembership.objects.create(project=project, user=bob, role="member")
    fund(project, 10)
    return project


@pytest.fixture
def triton(dave):
    """dave's project, in which neither alice nor bob is."""
    project = project_services.project_create(user=dave, slug="triton", name="Triton")
    fund(project, 10)
    return project


def test_it_lists_my_projects_with_my_role_and_the_pools_balance(vllm, triton, bob):
    _, api = token_for(bob)
    assert api.get("/api/v1/projects").json() == [
        {
            "slug": "vllm",
            "name": "vLLM",
            "repository_url": "",
            "role": "member",
            "balance_gpu_seconds": 36000,
            "balance_gpu_hours": "10.00",
        }
    ]


def test_an_owner_sees_the_members_and_a_member_does_not(vllm, alice, bob):
    _, as_alice = token_for(alice)
    _, as_bob = token_for(bob)
    owner_view = as_alice.get("/api/v1/projects/vllm").json()
    member_view = as_bob.get("/api/v1/projects/vllm").json()

    assert [m["email"] for m in owner_view["members"]] == ["alice@example.com", "bob@example.com"]
    assert member_view["members"] is None and member_view["role"] == "member"
    assert member_view["limits"] == {
        "max_live_instances": 2,
        "max_run_seconds": 14400,
        "allowed_sizes": ["1x"],
        "member_monthly_cap_gpu_seconds": 0,
        "entitled_8x": False,
    }
    assert member_view["balance_gpu_hours"] == "10.00"


def test_a_member_launches_for_the_project_and_the_instance_names_it(vllm, bob, cpu):
    _, api = token_for(bob)
    answer = api.post("/api/v1/instances", {"size": "1x", "image": "cpu", "project": "vllm"})

    assert answer.status_code == 201, answer.content
    assert answer.json()["project"] == "vllm"
    assert Instance.objects.get().project == vllm
    assert api.get("/api/v1/instances").json()[0]["project"] == "vllm"


def test_a_personal_launch_names_no_project(alice, cpu):
    give(alice, 1)
    _, api = token_for(alice)
    assert api.post("/api/v1/instances", {"size": "1x", "image": "cpu"}).json()["project"] is None


def test_a_member_of_one_project_cannot_see_or_launch_for_another(vllm, triton, bob, cpu):
    _, api = token_for(bob)
    assert_problem(api.get("/api/v1/projects/triton"), 404, kind="not-found")
    unknown = api.get("/api/v1/projects/no-such-project").json()
    assert api.get("/api/v1/projects/triton").json() == unknown
    assert_problem(
        api.post("/api/v1/instances", {"size": "1x", "image": "cpu", "project": "triton"}),
        404,
        kind="not-found",
    )
    assert not Instance.objects.exists()


def test_a_member_of_one_project_cannot_see_or_stop_anothers_instances(vllm, triton, bob, dave, cpu):
    theirs = instance_services.instance_launch(user=dave, size="1x", image_key="cpu", project="triton")
    _, api = token_for(bob)
    for answer in (
        api.get(f"/api/v1/instances/{theirs.id}"),
        api.post(f"/api/v1/instances/{theirs.id}/stop"),
    ):
        assert_problem(answer, 404, kind="not-found")
    assert Instance.objects.get(pk=theirs.pk).state == "queued"


def test_a_member_cannot_stop_another_members_project_instance_but_an_owner_can(vllm, alice, bob, dave, cpu):
    ProjectMembership.objects.create(project=vllm, user=dave, role="member")
    daves = instance_services.instance_launch(user=dave, size="1x", image_key="cpu", project="vllm")
    _, as_bob = token_for(bob)
    _, as_alice = token_for(alice)

    assert_problem(as_bob.post(f"/api/v1/instances/{daves.id}/stop"), 404)
    answer = as_alice.post(f"/api/v1/instances/{daves.id}/stop")

    assert answer.status_code == 202, answer.content
    assert Instance.objects.get(pk=daves.pk).stop_reason == "project_owner"


def test_a_member_cannot_change_the_limits(vllm, bob):
    _, api = token_for(bob)
    answer = api.http.patch(
        "/api/v1/projects/vllm",
        {"max_live_instances": 50},
        content_type="application/json",
        headers=api._headers(None),
    )
    assert_problem(answer, 403, kind="forbidden")
    assert Project.objects.get(pk=vllm.pk).max_live_instances == 2


def test_a_stranger_cannot_change_the_limits(vllm, dave, triton):
    _, api = token_for(dave)
    answer = api.http.patch(
        "/api/v1/projects/vllm",
        {"max_live_instances": 50},
        content_type="application/json",
        headers=api._headers(None),
    )
    assert_problem(answer, 404, kind="not-found")
    assert Project.objects.get(pk=vllm.pk).max_live_instances == 2


def test_an_owner_changes_the_limits_it_names_and_keeps_the_rest(vllm, alice):
    _, api = token_for(alice)
    answer = api.http.patch(
        "/api/v1/projects/vllm",
        {"max_live_instances": 5, "member_monthly_cap_gpu_seconds": 7200},
        content_type="application/json",
        headers=api._headers(None),
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["limits"]["max_live_instances"] == 5
    vllm.refresh_from_db()
    assert (vllm.max_live_instances, vllm.member_monthly_cap_gpu_seconds, vllm.max_run_seconds) == (
        5,
        7200,
        14400,
    )


def test_an_owner_cannot_give_the_project_8x(vllm, alice):
    _, api = token_for(alice)
    answer = api.http.patch(
        "/api/v1/projects/vllm",
        {"allowed_sizes": ["1x", "8x"], "entitled_8x": True},
        content_type="application/json",
        headers=api._headers(None),
    )
    assert_problem(answer, 400)
    vllm.refresh_from_db()
    assert vllm.allowed_sizes == ["1x"] and not vllm.entitled_8x


def test_a_read_only_token_cannot_change_the_limits(vllm, alice):
    _, api = token_for(alice, scope="read")
    answer = api.http.patch(
        "/api/v1/projects/vllm",
        {"max_live_instances": 5},
        content_type="application/json",
        headers=api._headers(None),
    )
    assert_problem(answer, 403)


def test_a_launch_the_pool_cannot_cover_is_402_and_one_past_the_projects_limit_409(vllm, alice, bob, cpu):
    Project.objects.filter(pk=vllm.pk).update(max_live_instances=1)
    instance_services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")
    _, api = token_for(bob)
    body = {"size": "1x", "image": "cpu", "project": "vllm"}
    assert_problem(api.post("/api/v1/instances", body), 409, kind="instance-limit")

    Project.objects.filter(pk=vllm.pk).update(max_live_instances=5)
    CreditAccount.objects.filter(project=vllm).update(balance_gpu_seconds=20 * 60)
    problem = assert_problem(api.post("/api/v1/instances", body), 402, kind="insufficient-credit")
    assert "pool cannot cover" in problem["detail"]


def test_a_limits_change_that_is_not_an_object_is_a_400_not_a_crash(vllm, alice):
    _, api = token_for(alice)
    answer = api.http.patch(
        "/api/v1/projects/vllm", [1, 2], content_type="application/json", headers=api._headers(None)
    )
    assert_problem(answer, 400, kind="validation")
