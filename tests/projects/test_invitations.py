"""Invitations: sent by email from a worker with a token stored only as its digest, accepted by the
invitee signed in with that confirmed address, once."""

import re
from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.utils import timezone

from portal.projects import services
from portal.projects.models import ProjectInvitation, token_digest
from tests.conftest import make_user


def link_token(message) -> str:
    return re.search(r"/projects/invitations/([^/\s]+)/", message.body).group(1)


@pytest.fixture
def erin(db):
    return make_user("erin@example.com", first_name="Erin")


def invite(project, owner, email="erin@example.com", role="member", capture=None):
    with capture(execute=True):
        return services.project_invite(user=owner, project=project, email=email, role=role)


def test_it_emails_a_link_whose_token_is_stored_only_as_its_digest(
    vllm, alice, django_capture_on_commit_callbacks
):
    invitation = invite(vllm, alice, "Erin@Example.com", capture=django_capture_on_commit_callbacks)

    [message] = mail.outbox
    assert message.to == ["erin@example.com"] and "vLLM" in message.subject
    token = link_token(message)
    invitation.refresh_from_db()
    assert invitation.token_digest == token_digest(token) and token not in invitation.token_digest


def test_it_lets_the_invitee_join_with_the_invited_role_once(
    vllm, alice, erin, django_capture_on_commit_callbacks
):
    invite(vllm, alice, role="owner", capture=django_capture_on_commit_callbacks)
    token = link_token(mail.outbox[0])

    membership = services.invitation_accept(user=erin, token=token)

    assert membership.role == "owner" and membership.project == vllm
    with pytest.raises(ValidationError, match="already been used"):
        services.invitation_accept(user=erin, token=token)


def test_it_refuses_anyone_signed_in_with_another_address(
    vllm, alice, bob, django_capture_on_commit_callbacks
):
    invite(vllm, alice, capture=django_capture_on_commit_callbacks)
    with pytest.raises(PermissionDenied, match="erin@example.com"):
        services.invitation_accept(user=bob, token=link_token(mail.outbox[0]))


def test_it_refuses_the_invitee_until_the_address_is_confirmed(
    vllm, alice, django_capture_on_commit_callbacks
):
    unconfirmed = make_user("erin@example.com", verified=False)
    invite(vllm, alice, capture=django_capture_on_commit_callbacks)
    with pytest.raises(PermissionDenied):
        services.invitation_accept(user=unconfirmed, token=link_token(mail.outbox[0]))


def test_it_refuses_an_expired_or_withdrawn_invitation(vllm, alice, erin, django_capture_on_commit_callbacks):
    invitation = invite(vllm, alice, capture=django_capture_on_commit_callbacks)
    token = link_token(mail.outbox[0])
    ProjectInvitation.objects.filter(pk=invitation.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with pytest.raises(ValidationError, match="expired"):
        services.invitation_accept(user=erin, token=token)

    ProjectInvitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() + timedelta(days=1))
    services.invitation_revoke(user=alice, project=vllm, invitation_id=invitation.pk)
    with pytest.raises(ValidationError, match="withdrawn"):
        services.invitation_accept(user=erin, token=token)


def test_it_answers_an_unknown_token_404(vllm, erin):
    with pytest.raises(Http404):
        services.invitation_accept(user=erin, token="not-a-token")


def test_a_new_email_replaces_the_link_of_the_one_before(
    vllm, alice, erin, django_capture_on_commit_callbacks
):
    invitation = invite(vllm, alice, capture=django_capture_on_commit_callbacks)
    services.invitation_send(invitation_id=invitation.pk)
    first, second = (link_token(message) for message in mail.outbox)

    with pytest.raises(Http404):
        services.invitation_accept(user=erin, token=first)
    assert services.invitation_accept(user=erin, token=second).user == erin


def test_it_lets_only_owners_invite(vllm, bob, dave):
    with pytest.raises(PermissionDenied):
        services.project_invite(user=bob, project=vllm, email="erin@example.com")
    with pytest.raises(Http404):
        services.project_invite(user=dave, project=vllm, email="erin@example.com")


def test_it_refuses_a_second_open_invitation_to_the_same_address(
    vllm, alice, django_capture_on_commit_callbacks
):
    invite(vllm, alice, capture=django_capture_on_commit_callbacks)
    with pytest.raises(ValidationError, match="already has an open invitation"):
        services.project_invite(user=alice, project=vllm, email="ERIN@example.com")


def test_a_declined_invitation_cannot_be_accepted(vllm, alice, erin, django_capture_on_commit_callbacks):
    invite(vllm, alice, capture=django_capture_on_commit_callbacks)
    token = link_token(mail.outbox[0])
    services.invitation_decline(user=erin, token=token)
    with pytest.raises(ValidationError):
        services.invitation_accept(user=erin, token=token)
    assert not vllm.memberships.filter(user=erin).exists()
