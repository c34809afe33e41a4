"""Project membership through the API (/api/v1/projects/<slug>/invitations and /members/<user_id>): an
owner invites by email, withdraws an invitation, changes roles and removes people; a member can only
leave; nobody outside the project learns it exists; the project always keeps an owner."""

import json

import pytest
from django.core import mail
from django.core.exceptions import ValidationError

from portal.instances import services as instance_services
from portal.instances.models import Instance
from portal.projects import services as project_services
from portal.projects.models import ProjectInvitation, ProjectMembership
from tests.conftest import give, make_user
from tests.projects.conftest import fund
from tests.projects.test_invitations import link_token

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def vllm(alice, bob):
    """alice owns it, bob is a member, 10 GPU-hours in its pool."""
    project = project_services.project_create(user=alice, slug="vllm", name="vLLM")
    ProjectMembership.objects.create(project=project, user=bob, role="member")
    fund(project, 10)
    return project


def patch(api, path, body):
    return api.http.patch(path, json.dumps(body), content_type="application/json", headers=api._headers(None))


def test_an_owner_invites_by_email_and_the_invitee_accepts_from_the_link(
    vllm, alice, django_capture_on_commit_callbacks
):
    erin = make_user("erin@example.com")
    _, as_alice = token_for(alice)

    with django_capture_on_commit_callbacks(execute=True):
        answer = as_alice.post(
            "/api/v1/projects/vllm/invitations", {"email": "Erin@Example.com", "role": "owner"}
        )

    assert answer.status_code == 201, answer.content
    assert answer.json()["email"] == "erin@example.com" and answer.json()["role"] == "owner"
    assert [row["email"] for row in as_alice.get("/api/v1/projects/vllm/invitations").json()] == [
        "erin@example.com"
    ]
    [message] = mail.outbox
    project_services.invitation_accept(user=erin, token=link_token(message))
    assert ProjectMembership.objects.get(project=vllm, user=erin).role == "owner"
    assert as_alice.get("/api/v1/projects/vllm/invitations").json() == []


def test_a_bad_invitation_is_refused_with_what_to_fix_and_sends_nothing(vllm, alice):
    _, as_alice = token_for(alice)

    malformed = as_alice.post("/api/v1/projects/vllm/invitations", {"email": "not-an-address"})
    member_already = as_alice.post("/api/v1/projects/vllm/invitations", {"email": "bob@example.com"})
    unknown_role = as_alice.post(
        "/api/v1/projects/vllm/invitations", {"email": "x@example.com", "role": "admin"}
    )

    assert "email" in assert_problem(malformed, 400)["detail"].lower()
    assert "already in the project" in assert_problem(member_already, 400)["detail"]
    assert assert_problem(unknown_role, 400)
    assert not ProjectInvitation.objects.exists() and mail.outbox == []


def test_a_withdrawn_invitation_link_no_longer_works(vllm, alice, django_capture_on_commit_callbacks):
    erin = make_user("erin@example.com")
    _, as_alice = token_for(alice)
    with django_capture_on_commit_callbacks(execute=True):
        invitation = as_alice.post("/api/v1/projects/vllm/invitations", {"email": "erin@example.com"}).json()

    assert as_alice.delete(f"/api/v1/projects/vllm/invitations/{invitation['id']}").status_code == 204

    with pytest.raises(ValidationError, match="already been used or withdrawn"):
        project_services.invitation_accept(user=erin, token=link_token(mail.outbox[0]))
    assert not ProjectMembership.objects.filter(project=vllm, user=erin).exists()


def test_a_member_cannot_invite_see_invitations_or_change_roles(vllm, alice, bob):
    _, as_bob = token_for(bob)

    assert_problem(as_bob.post("/api/v1/projects/vllm/invitations", {"email": "x@example.com"}), 403)
    assert_problem(as_bob.get("/api/v1/projects/vllm/invitations"), 403)
    assert_problem(patch(as_bob, f"/api/v1/projects/vllm/members/{bob.pk}", {"role": "owner"}), 403)
    assert_problem(as_bob.delete(f"/api/v1/projects/vllm/members/{alice.pk}"), 403)
    assert ProjectMembership.objects.get(project=vllm, user=bob).role == "member"


def test_an_outsider_learns_nothing_of_the_project(vllm, alice):
    dave = make_user("dave@example.com")
    _, as_dave = token_for(dave)

    for answer in (
        as_dave.get("/api/v1/projects/vllm/invitations"),
        as_dave.post("/api/v1/projects/vllm/invitations", {"email": "dave@example.com"}),
        patch(as_dave, f"/api/v1/projects/vllm/members/{dave.pk}", {"role": "owner"}),
        as_dave.delete(f"/api/v1/projects/vllm/members/{alice.pk}"),
    ):
        assert_problem(answer, 404)
    assert not ProjectMembership.objects.filter(project=vllm, user=dave).exists()


def test_an_owner_promotes_a_member_and_the_last_owner_cannot_step_down(vllm, alice, bob):
    _, as_alice = token_for(alice)

    last_owner = patch(as_alice, f"/api/v1/projects/vllm/members/{alice.pk}", {"role": "member"})
    promoted = patch(as_alice, f"/api/v1/projects/vllm/members/{bob.pk}", {"role": "owner"})

    assert "make someone else an owner first" in assert_problem(last_owner, 400)["detail"]
    assert promoted.status_code == 200 and promoted.json()["role"] == "owner"
    assert patch(as_alice, f"/api/v1/projects/vllm/members/{alice.pk}", {"role": "member"}).status_code == 200


def test_removing_a_member_stops_their_project_instances_and_leaves_their_own(vllm, alice, bob, cpu):
    give(bob, 5)
    for_project = instance_services.instance_launch(user=bob, size="1x", image_key="cpu", project=vllm)
    own = instance_services.instance_launch(user=bob, size="1x", image_key="cpu")
    _, as_alice = token_for(alice)

    assert as_alice.delete(f"/api/v1/projects/vllm/members/{bob.pk}").status_code == 204

    assert not ProjectMembership.objects.filter(project=vllm, user=bob).exists()
    assert Instance.objects.get(pk=for_project.pk).state not in Instance.LIVE_STATES
    assert Instance.objects.get(pk=own.pk).state in Instance.LIVE_STATES


def test_a_member_leaves_by_removing_themselves(vllm, bob):
    _, as_bob = token_for(bob)

    assert as_bob.delete(f"/api/v1/projects/vllm/members/{bob.pk}").status_code == 204

    assert_problem(as_bob.get("/api/v1/projects/vllm"), 404)
