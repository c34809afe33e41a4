"""The project's CI access page: the CI workflows it trusts to sign in without a secret, its robot tokens
(a new one's text shown once), and its usage by token. Owners only: a member gets 403, anyone else 404.

It lives with the API because the tokens do (robots.py); the project's other pages are portal/projects'.
"""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Sum
from django.shortcuts import redirect, render

from portal.credits.models import LedgerEntry, hours
from portal.projects import selectors as project_selectors
from portal.projects import trust

from . import robots
from .models import TokenLaunch


def _refusal(error: ValidationError) -> str:
    return " ".join(error.messages)


def usage_by_token(project) -> list[tuple[str, str]]:
    """(token name, GPU-hours) the project's pool paid for what each of its tokens launched, most first."""
    spent = (
        LedgerEntry.objects.filter(
            account__project=project,
            kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REVERSAL],
            instance__in=TokenLaunch.objects.filter(token__project=project).values("instance"),
        )
        .values("instance")
        .annotate(total=Sum("gpu_seconds"))
    )
    by_instance = {row["instance"]: -row["total"] for row in spent}
    totals: dict[str, int] = {}
    for launch in TokenLaunch.objects.filter(instance__in=by_instance).select_related("token"):
        totals[launch.token.name] = totals.get(launch.token.name, 0) + by_instance[launch.instance_id]
    return [(name, hours(total)) for name, total in sorted(totals.items(), key=lambda item: -item[1])]


@login_required
def ci_access(request, slug):
    # Owners only, and the same answers as the API: robots' and trust's own checks raise 404/403.
    publishers = trust.trusted_publishers_of(user=request.user, slug=slug)
    project = project_selectors.project_of_member(request.user, slug)
    new_token = None
    status = 200
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "trust":
                trust.trusted_publisher_add(
                    user=request.user,
                    slug=slug,
                    **{
                        name: request.POST.get(name, "")
                        for name in ("provider", "repository", "ref", "workflow", "environment")
                    },
                )
                messages.success(request, "The project now trusts that workflow to sign in.")
            elif action == "untrust":
                trust.trusted_publisher_remove(
                    user=request.user, slug=slug, publisher_id=request.POST.get("id")
                )
                messages.success(request, "No longer trusted. Tokens it got keep working until they expire.")
            elif action == "token":
                _, new_token = robots.robot_token_create(
                    user=request.user,
                    slug=slug,
                    name=request.POST.get("name", ""),
                    scope=request.POST.get("scope", "launch"),
                    days=int(request.POST.get("days") or 30),
                    max_live_instances=int(request.POST.get("max_live_instances") or 0),
                )
            elif action == "revoke":
                robots.robot_token_revoke(user=request.user, slug=slug, token_id=request.POST.get("id"))
                messages.success(request, "Revoked. It stopped working at once.")
            if new_token is None:
                return redirect("project_ci_access", slug=slug)
        except (ValidationError, ValueError) as error:
            messages.error(
                request, _refusal(error) if isinstance(error, ValidationError) else "Give whole numbers."
            )
            status = 400
        publishers = trust.trusted_publishers_of(user=request.user, slug=slug)
    context = {
        "project": project,
        "publishers": publishers,
        "providers": sorted(settings.OIDC_PROVIDERS),
        "audience": settings.OIDC_AUDIENCE,
        "tokens": robots.robot_tokens_of(user=request.user, slug=slug),
        "new_token": new_token,
        "usage_by_token": usage_by_token(project),
    }
    return render(request, "projects/ci_access.html", context, status=status)
