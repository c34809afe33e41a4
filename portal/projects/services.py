"""Operations on projects: creating one, its limits, invitations, and its members' roles and removal.

Who may do what: owners change limits, invite, change roles, remove members and stop any of the
project's instances; a member may leave. The last owner can neither leave, be removed nor be demoted.
Every change of the people of a project takes the project's row lock (FOR NO KEY UPDATE, which does not
block a launch inserting an instance that references the project), so two owners demoting each other
cannot leave the project without one. A removal then stops the member's project instances through the
instance services, which take the account locks in the house order (docs/architecture.md, "Projects").
"""

import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.http import Http404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from portal.credits.models import CreditAccount
from portal.instances import services as instance_services
from portal.instances.models import Instance
from portal.instances.sizes import SIZES
from portal.instances.stop_reasons import StopReason
from portal.lib.tasks import publish

from .models import Project, ProjectInvitation, ProjectMembership, token_digest

Role = ProjectMembership.Role

INVITATION_DAYS = 14
# Words the project pages' URLs use where a project's slug could stand.
RESERVED_SLUGS = {"invitations"}


def _membership(*, user, project: Project) -> ProjectMembership:
    """The user's membership of the project; Http404 when they have none (as for no such project)."""
    membership = ProjectMembership.objects.filter(project=project, user_id=user.pk).first()
    if membership is None:
        raise Http404("No such project.")
    return membership


def _require_owner(*, user, project: Project) -> ProjectMembership:
    """Raises Http404 for a non-member and PermissionDenied for a member who is not an owner."""
    membership = _membership(user=user, project=project)
    if membership.role != Role.OWNER:
        raise PermissionDenied("Only an owner of the project may do that.")
    return membership


def project_create(*, user, slug: str, name: str, repository_url: str = "") -> Project:
    """Create a project with `user` as its owner and an empty pool (its own CreditAccount). Returns it.

    Raises ValidationError for a malformed or taken slug or a blank name.
    """
    if not user.email_verified:
        raise ValidationError("Confirm your email address before creating a project.")
    project = Project(
        slug=(slug or "").strip().lower(), name=(name or "").strip(), repository_url=repository_url
    )
    if project.slug in RESERVED_SLUGS:
        raise ValidationError(f"The name {project.slug!r} is taken; choose another.", code="slug")
    project.created_by = user
    project.full_clean(exclude=["created_by"], validate_unique=False)
    try:
        with transaction.atomic():
            project.save()
            ProjectMembership.objects.create(project=project, user=user, role=Role.OWNER)
            CreditAccount.objects.create(project=project)
    except IntegrityError:
        raise ValidationError(f"The name {project.slug!r} is taken; choose another.", code="slug") from None
    return project


def project_limits_update(
    *,
    user,
    project: Project,
    max_live_instances: int,
    max_run_seconds: int,
    allowed_sizes: list[str],
    member_monthly_cap_gpu_seconds: int,
) -> Project:
    """An owner sets the project's limits. Returns the project.

    Raises Http404 for a non-member, PermissionDenied for a member who is not an owner, and
    ValidationError for an unknown size, 8x without the operators' entitlement, a longest run of zero,
    or a negative number.
    """
    _require_owner(user=user, project=project)
    unknown = [size for size in allowed_sizes if size not in SIZES]
    if unknown:
        raise ValidationError(f"Unknown size {unknown[0]!r}.", code="allowed_sizes")
    if "8x" in allowed_sizes and not project.entitled_8x:
        raise ValidationError(
            "8x MI300X needs the operators' approval for this project; ask them to enable it.",
            code="allowed_sizes",
        )
    if max_run_seconds <= 0:
        raise ValidationError("The longest run must be more than zero.", code="max_run_seconds")
    if max_live_instances < 0 or member_monthly_cap_gpu_seconds < 0:
        raise ValidationError("Limits cannot be negative.")
    Project.objects.filter(pk=project.pk).update(
        max_live_instances=max_live_instances,
        max_run_seconds=max_run_seconds,
        allowed_sizes=[size for size in SIZES if size in allowed_sizes],
        member_monthly_cap_gpu_seconds=member_monthly_cap_gpu_seconds,
    )
    project.refresh_from_db()
    return project


# --- Invitations ---------------------------------------------------------------------------------


def project_invite(*, user, project: Project, email: str, role: str = Role.MEMBER) -> ProjectInvitation:
    """An owner invites `email` as `role`; the email goes out from a worker once this commits. Returns
    the invitation.

    Raises Http404/PermissionDenied as project_limits_update, and ValidationError for an unknown role,
    a person already in the project, or an invitation to that address still open.
    """
    _require_owner(user=user, project=project)
    email = (email or "").strip().lower()
    if role not in Role.values:
        raise ValidationError(f"Unknown role {role!r}.", code="role")
    if not email or "@" not in email:
        raise ValidationError("Enter the email address to invite.", code="email")
    if ProjectMembership.objects.filter(project=project, user__email__iexact=email).exists():
        raise ValidationError(f"{email} is already in the project.", code="email")
    try:
        with transaction.atomic():
            invitation = ProjectInvitation.objects.create(
                project=project,
                email=email,
                role=role,
                invited_by=user,
                expires_at=timezone.now() + timedelta(days=INVITATION_DAYS),
            )
    except IntegrityError:
        raise ValidationError(f"{email} already has an open invitation.", code="email") from None
    transaction.on_commit(lambda: _invitation_publish(invitation.pk))
    return invitation


def _invitation_publish(invitation_id: int) -> None:
    from .tasks import send_invitation

    publish(
        send_invitation,
        args=[invitation_id],
        inline=lambda: invitation_send(invitation_id=invitation_id),
    )


def invitation_send(*, invitation_id: int) -> bool:
    """Email an open invitation with a fresh token (only its digest is stored, so each email replaces the
    link of the one before). Returns False when the invitation is no longer open.

    Raises whatever the mail backend raises, so the task can retry.
    """
    token = secrets.token_urlsafe(32)
    claimed = ProjectInvitation.objects.filter(
        pk=invitation_id, accepted_at=None, declined_at=None, revoked_at=None, expires_at__gt=timezone.now()
    ).update(token_digest=token_digest(token))
    if not claimed:
        return False
    invitation = ProjectInvitation.objects.select_related("project", "invited_by").get(pk=invitation_id)
    context = {
        "invitation": invitation,
        "project": invitation.project,
        "inviter": invitation.invited_by.get_full_name() or invitation.invited_by.email
        if invitation.invited_by
        else "An owner",
        "link": settings.SITE_URL + reverse("projects:invitation", args=[token]),
        "site_name": settings.SITE_NAME,
        "expires_at": invitation.expires_at,
    }
    subject = " ".join(render_to_string("emails/project_invitation_subject.txt", context).split())
    send_mail(subject, render_to_string("emails/project_invitation.txt", context), None, [invitation.email])
    return True


def invitation_for_token(token: str) -> ProjectInvitation:
    """The invitation a link's token names; Http404 for an unknown token."""
    invitation = (
        ProjectInvitation.objects.select_related("project")
        .filter(token_digest=token_digest(token or ""))
        .first()
        if token
        else None
    )
    if invitation is None:
        raise Http404("No such invitation.")
    return invitation


def _check_invitee(*, user, invitation: ProjectInvitation) -> None:
    if not invitation.is_open:
        raise ValidationError("This invitation has already been used or withdrawn.", code="closed")
    if invitation.expires_at <= timezone.now():
        raise ValidationError("This invitation has expired; ask an owner of the project for a new one.")
    if not user.email_verified or user.email.lower() != invitation.email.lower():
        raise PermissionDenied(
            f"This invitation is for {invitation.email}. Sign in with that address (confirmed) to accept it."
        )


def invitation_accept(*, user, token: str) -> ProjectMembership:
    """The invitee, signed in with the invited address confirmed, joins the project. Returns the
    membership.

    Raises Http404 for an unknown token, PermissionDenied for anyone but the invitee, and ValidationError
    for an invitation that expired or was already used, declined or withdrawn.
    """
    invitation = invitation_for_token(token)
    _check_invitee(user=user, invitation=invitation)
    now = timezone.now()
    with transaction.atomic():
        Project.objects.select_for_update(no_key=True).get(pk=invitation.project_id)
        claimed = ProjectInvitation.objects.filter(
            pk=invitation.pk, accepted_at=None, declined_at=None, revoked_at=None
        ).update(accepted_at=now, accepted_by=user)
        if not claimed:
            raise ValidationError("This invitation has already been used or withdrawn.", code="closed")
        membership, _ = ProjectMembership.objects.get_or_create(
            project_id=invitation.project_id, user=user, defaults={"role": invitation.role}
        )
    return membership


def invitation_decline(*, user, token: str) -> None:
    """The invitee declines. Raises as invitation_accept."""
    invitation = invitation_for_token(token)
    _check_invitee(user=user, invitation=invitation)
    ProjectInvitation.objects.filter(
        pk=invitation.pk, accepted_at=None, declined_at=None, revoked_at=None
    ).update(declined_at=timezone.now())


def invitation_revoke(*, user, project: Project, invitation_id: int) -> None:
    """An owner withdraws an open invitation; its link stops working. Raises Http404/PermissionDenied."""
    _require_owner(user=user, project=project)
    ProjectInvitation.objects.filter(
        pk=invitation_id, project=project, accepted_at=None, declined_at=None, revoked_at=None
    ).update(revoked_at=timezone.now())


# --- Members -------------------------------------------------------------------------------------


def _owners_after(project: Project, *, without_user_id) -> int:
    return (
        ProjectMembership.objects.filter(project=project, role=Role.OWNER)
        .exclude(user_id=without_user_id)
        .count()
    )


def _person(*, project: Project, member_id) -> ProjectMembership:
    """A person's membership of the project. Http404 for an unknown member and for the project's bot
    account, which owners manage through its tokens (portal/api/robots.py), never as a person: made an
    owner, its robot tokens could change the project."""
    membership = (
        ProjectMembership.objects.select_related("user").filter(project=project, user_id=member_id).first()
    )
    if membership is None or membership.user.project_bot:
        raise Http404("No such member.")
    return membership


def member_role_change(*, user, project: Project, member_id: int, role: str) -> ProjectMembership:
    """An owner makes a member an owner or an owner a member. Returns the membership.

    Raises Http404 for a non-member caller or an unknown member, PermissionDenied for a caller who is
    not an owner, and ValidationError for an unknown role or when it would leave the project without an
    owner.
    """
    if role not in Role.values:
        raise ValidationError(f"Unknown role {role!r}.", code="role")
    with transaction.atomic():
        Project.objects.select_for_update(no_key=True).get(pk=project.pk)
        _require_owner(user=user, project=project)
        membership = _person(project=project, member_id=member_id)
        if (
            role == Role.MEMBER
            and membership.role == Role.OWNER
            and not _owners_after(project, without_user_id=member_id)
        ):
            raise ValidationError(
                "A project needs an owner: make someone else an owner first.", code="last_owner"
            )
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def member_remove(*, user, project: Project, member_id: int) -> list:
    """An owner removes a member (or a member leaves: member_id is their own). The project instances the
    member launched are stopped at once (stop reason removed_from_project: billing ends, the containers
    and so SSH to them go); their personal instances are left alone. Returns the ids of the stopped
    instances.

    Raises Http404 for a non-member caller or an unknown member, PermissionDenied for a member removing
    someone else, and ValidationError when it would remove the last owner.
    """
    with transaction.atomic():
        Project.objects.select_for_update(no_key=True).get(pk=project.pk)
        caller = _membership(user=user, project=project)
        if member_id != user.pk and caller.role != Role.OWNER:
            raise PermissionDenied("Only an owner of the project may remove someone else.")
        membership = _person(project=project, member_id=member_id)
        if membership.role == Role.OWNER and not _owners_after(project, without_user_id=member_id):
            raise ValidationError(
                "The last owner cannot be removed: make someone else an owner first.", code="last_owner"
            )
        membership.delete()
        stopped = instance_services.stop_all_of(
            Instance.objects.filter(project=project, user_id=member_id),
            user_ids=[member_id],
            reason=StopReason.REMOVED_FROM_PROJECT,
            message=f"Stopped: its owner was removed from the project {project.name}.",
        )
    return [str(instance_id) for instance_id in stopped.stopping_ids + stopped.stopped_queued_ids]


def project_instance_stop(*, user, project: Project, instance_id) -> Instance:
    """An owner stops one of the project's instances (or a member their own). Returns it.

    Raises Http404 for a non-member and for an instance that is not the project's, alike.
    """
    _membership(user=user, project=project)
    if not Instance.objects.filter(id=instance_id, project=project).exists():
        raise Http404("No such instance.")
    return instance_services.instance_stop(user=user, instance_id=instance_id)
