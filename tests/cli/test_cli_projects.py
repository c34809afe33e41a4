"""`devcloud projects` and `devcloud launch --project`, against a live portal with a real token."""

import json
import re

import pytest

from portal.api import services
from portal.instances.models import Instance
from portal.projects import services as project_services
from portal.projects.models import ProjectMembership
from tests.conftest import give, make_user
from tests.projects.conftest import fund

OK, REFUSED, USAGE, AUTH, CREDIT, SERVER = 0, 1, 2, 3, 4, 5


@pytest.fixture
def bob_in_vllm(devcloud, portal, alice, bob):
    """bob, logged in, a member of alice's vllm (10 GPU-hours in its pool) with no credit of his own."""
    vllm = project_services.project_create(user=alice, slug="vllm", name="vLLM")
    ProjectMembership.objects.create(project=vllm, user=bob, role="member")
    fund(vllm, 10)
    token = services.token_create(user=bob, name="cli", scope="launch", days=1)[1]
    assert devcloud("login", "--url", portal, "--token", token).returncode == OK
    return vllm


def test_projects_lists_mine_with_my_role_and_the_pool(devcloud, bob_in_vllm):
    dave = make_user("dave@example.com")
    project_services.project_create(user=dave, slug="triton", name="Triton")

    listed = devcloud("projects")
    as_json = json.loads(devcloud("projects", "--json").stdout)

    assert listed.returncode == OK, listed.stderr
    assert "vllm" in listed.stdout and "member" in listed.stdout and "10.00" in listed.stdout
    assert "triton" not in listed.stdout
    assert [row["slug"] for row in as_json] == ["vllm"]


def test_launch_for_a_project_is_paid_from_its_pool(devcloud, bob_in_vllm, bob):
    launched = devcloud("launch", "--size", "1x", "--image", "cpu", "--project", "vllm")

    assert launched.returncode == OK, launched.stderr
    assert "for vllm" in launched.stdout
    assert Instance.objects.get(user=bob).project == bob_in_vllm


def test_ls_says_who_pays_for_each_instance(devcloud, bob_in_vllm, bob):
    give(bob, 5)
    assert devcloud("launch", "--size", "1x", "--image", "cpu", "--project", "vllm").returncode == OK
    assert devcloud("launch", "--size", "1x", "--image", "cpu").returncode == OK

    listed = devcloud("ls").stdout.splitlines()

    assert re.search(r"\bPAID BY\b", listed[0])
    paid_by = sorted(line.split()[4] for line in listed[1:3])
    assert paid_by == ["vllm", "you"]


def test_launch_for_a_project_i_am_not_in_is_refused_and_launches_nothing(devcloud, bob_in_vllm, bob):
    make_user("dave@example.com")
    result = devcloud("launch", "--size", "1x", "--image", "cpu", "--project", "triton", "--json")

    assert result.returncode == REFUSED
    assert json.loads(result.stdout)["error"]["status"] == 404
    assert not Instance.objects.filter(user=bob).exists()


@pytest.fixture
def alice_logged_in(devcloud, portal, alice, bob_in_vllm):
    """alice, owner of vllm (bob is a member), logged in."""
    token = services.token_create(user=alice, name="cli", scope="launch", days=1)[1]
    assert devcloud("login", "--url", portal, "--token", token).returncode == OK
    return bob_in_vllm


def test_an_owner_invites_lists_and_withdraws_from_the_command_line(devcloud, alice_logged_in):
    invited = devcloud("project", "invite", "vllm", "erin@example.com", "--owner")
    listed = devcloud("project", "members", "vllm")
    withdrawn = devcloud("project", "uninvite", "vllm", "erin@example.com")

    assert invited.returncode == OK, invited.stderr
    assert "Invited erin@example.com to vllm as owner" in invited.stdout
    assert re.search(r"^erin@example.com +owner \(invited\) +until ", listed.stdout, re.MULTILINE)
    assert re.search(r"^bob@example.com +member ", listed.stdout, re.MULTILINE)
    assert withdrawn.returncode == OK and "Withdrew" in withdrawn.stdout
    assert "erin@example.com" not in devcloud("project", "members", "vllm").stdout


def test_an_owner_promotes_and_removes_a_member_by_email(devcloud, alice_logged_in, bob):
    promoted = devcloud("project", "role", "vllm", "bob@example.com", "owner")
    removed = devcloud("project", "remove", "vllm", "bob@example.com")

    assert promoted.returncode == OK and "bob@example.com is now an owner of vllm" in promoted.stdout
    assert removed.returncode == OK, removed.stderr
    assert not ProjectMembership.objects.filter(project=alice_logged_in, user=bob).exists()


def test_a_member_cannot_manage_people_and_is_told_why(devcloud, bob_in_vllm, alice):
    members = devcloud("project", "members", "vllm")
    invite = devcloud("project", "invite", "vllm", "erin@example.com")

    assert members.returncode == REFUSED and "Only an owner of vllm sees its members" in members.stderr
    assert invite.returncode == AUTH and "Only an owner of the project may do that." in invite.stderr
    assert ProjectMembership.objects.get(project=bob_in_vllm, user=alice).role == "owner"


def test_removing_someone_not_in_the_project_says_how_to_list_members(devcloud, alice_logged_in):
    result = devcloud("project", "remove", "vllm", "nobody@example.com")

    assert result.returncode == REFUSED
    assert "nobody@example.com is not a member of vllm. `devcloud project members vllm`" in result.stderr
