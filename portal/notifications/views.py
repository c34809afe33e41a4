"""The user's notifications: the full list, mark all read, and email preferences.

Every read and write is scoped to request.user; no page takes a notification or user id.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from . import selectors, services
from .forms import EmailPreferencesForm


@login_required
@require_GET
def notification_list(request):
    return render(
        request,
        "notifications/list.html",
        {"notifications": selectors.all_for(request.user), "unread": selectors.unread_count(request.user)},
    )


@login_required
@require_POST
def notification_mark_all_read(request):
    services.notifications_mark_all_read(user=request.user)
    # The dashboard's partial posts here too and wants the user back where they were.
    next_url = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(next_url)
    return redirect("notifications:list")


@login_required
@require_http_methods(["GET", "POST"])
def preferences(request):
    status = 200
    if request.method == "POST":
        form = EmailPreferencesForm(request.POST)
        if form.is_valid():
            try:
                services.email_preferences_set(
                    user=request.user, emailed_kinds=form.cleaned_data["emailed_kinds"]
                )
            except ValidationError as error:
                form.add_error(None, error)
            else:
                messages.success(request, "Your email preferences were saved.")
                return redirect("notifications:preferences")
        status = 400
    else:
        form = EmailPreferencesForm(initial={"emailed_kinds": sorted(selectors.emailed_kinds(request.user))})
    return render(
        request,
        "notifications/preferences.html",
        {"form": form, "mandatory_kinds": selectors.mandatory_kinds()},
        status=status,
    )
