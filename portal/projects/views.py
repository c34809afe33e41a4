"""Project pages: the list of mine (and creating one), a project's people, pool, limits, usage and live
instances, and the invitation page.

Every view looks the project up through the caller's membership (selectors.project_of_member), so a
project someone is not in is a 404, exactly like one that does not exist. Changes are POSTs that call one
service and go back to the project's page.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.credits.models import hours

from . import ci_grants, selectors, services
from .forms import CIGrantApplyForm, InviteForm, LimitsForm, ProjectCreateForm


def _refusal_text(refusal) -> str:
    return " ".join(getattr(refusal, "messages", None) or [str(refusal)])


@login_required
def project_list(request):
    form = ProjectCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            project = services.project_create(user=request.user, **form.cleaned_data)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, f"Created {project.name}. Invite its people from here.")
            return redirect("projects:detail", slug=project.slug)
    status = 400 if request.method == "POST" else 200
    context = {"projects": selectors.projects_of(request.user), "form": form}
    return render(request, "projects/list.html", context, status=status)


def _detail_page(request, project, *, invite_form=None, limits_form=None, ci_form=None, status=200):
    owner = selectors.is_owner(project)
    context = {
        "ci_grant": selectors.ci_grant_use(project),
        "project": project,
        "owner": owner,
        "balance_hours": hours(project.pool.balance_gpu_seconds if project.pool else 0),
        "balance_gpu_seconds": project.pool.balance_gpu_seconds if project.pool else 0,
        "members": selectors.members_of(project),
        "live_instances": selectors.live_instances_of(project),
        "max_run_hours": f"{project.max_run_seconds / 3600:g}",
        "cap_hours": hours(project.member_monthly_cap_gpu_seconds),
    }
    if owner:
        usage = selectors.project_usage(project)
        context.update(
            invitations=selectors.pending_invitations(project),
            invite_form=invite_form or InviteForm(),
            limits_form=limits_form or LimitsForm.for_project(project),
            usage=usage,
            usage_by_member=[(email, hours(spent)) for _, email, spent in usage.by_member],
            usage_by_day=[(day, hours(spent)) for day, spent in usage.by_day],
            ci_application=selectors.ci_grant_application_of(project),
            ci_form=ci_form or CIGrantApplyForm(initial={"repository_url": project.repository_url}),
        )
    return render(request, "projects/detail.html", context, status=status)


@login_required
@require_GET
def project_detail(request, slug):
    return _detail_page(request, selectors.project_of_member(request.user, slug))


@login_required
@require_POST
def project_invite(request, slug):
    project = selectors.project_of_member(request.user, slug)
    form = InviteForm(request.POST)
    if form.is_valid():
        try:
            services.project_invite(user=request.user, project=project, **form.cleaned_data)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, f"Invitation sent to {form.cleaned_data['email']}.")
            return redirect("projects:detail", slug=slug)
    return _detail_page(request, project, invite_form=form, status=400)


@login_required
@require_POST
def project_limits(request, slug):
    project = selectors.project_of_member(request.user, slug)
    form = LimitsForm(request.POST)
    if form.is_valid():
        try:
            services.project_limits_update(user=request.user, project=project, **form.limits())
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, "Limits saved.")
            return redirect("projects:detail", slug=slug)
    return _detail_page(request, project, limits_form=form, status=400)


@login_required
@require_POST
def ci_grant_apply(request, slug):
    project = selectors.project_of_member(request.user, slug)
    if not selectors.is_owner(project):
        raise PermissionDenied("Only an owner of the project may apply.")
    form = CIGrantApplyForm(request.POST)
    if form.is_valid():
        try:
            ci_grants.ci_grant_apply(user=request.user, project=project, **form.cleaned_data)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, "Applied for the open-source CI programme. An operator will review it.")
            return redirect("projects:detail", slug=slug)
    return _detail_page(request, project, ci_form=form, status=400)


def _member_action(request, slug, action):
    """Run `action(project)` (a service call) and go back to the page, with its refusal if any."""
    project = selectors.project_of_member(request.user, slug)
    try:
        done = action(project)
    except (ValidationError, PermissionDenied) as refusal:
        messages.error(request, _refusal_text(refusal))
    else:
        messages.success(request, done)
    if selectors.project_or_none(request.user, slug) is None:
        return redirect("projects:list")
    return redirect("projects:detail", slug=slug)


@login_required
@require_POST
def member_remove(request, slug, user_id):
    def remove(project):
        stopped = services.member_remove(user=request.user, project=project, member_id=user_id)
        left = "You left" if user_id == request.user.pk else "Removed them from"
        return f"{left} {project.name}; {len(stopped)} of their project instance(s) stopped."

    return _member_action(request, slug, remove)


@login_required
@require_POST
def member_role(request, slug, user_id):
    role = request.POST.get("role", "")

    def change(project):
        services.member_role_change(user=request.user, project=project, member_id=user_id, role=role)
        return f"Role changed to {role}."

    return _member_action(request, slug, change)


@login_required
@require_POST
def invitation_revoke(request, slug, invitation_id):
    def revoke(project):
        services.invitation_revoke(user=request.user, project=project, invitation_id=invitation_id)
        return "Invitation withdrawn."

    return _member_action(request, slug, revoke)


@login_required
@require_POST
def instance_stop(request, slug, instance_id):
    def stop(project):
        services.project_instance_stop(user=request.user, project=project, instance_id=instance_id)
        return "Stopping. Billing has stopped."

    return _member_action(request, slug, stop)


@login_required
def invitation(request, token):
    invitation = services.invitation_for_token(token)
    error = ""
    if request.method == "POST":
        try:
            if request.POST.get("decision") == "decline":
                services.invitation_decline(user=request.user, token=token)
                messages.success(request, f"You declined the invitation to {invitation.project.name}.")
                return redirect("projects:list")
            services.invitation_accept(user=request.user, token=token)
        except (ValidationError, PermissionDenied) as refusal:
            error = _refusal_text(refusal)
        else:
            messages.success(request, f"You joined {invitation.project.name}.")
            return redirect("projects:detail", slug=invitation.project.slug)
    return render(
        request,
        "projects/invitation.html",
        {"invitation": invitation, "error": error},
        status=400 if error else 200,
    )
