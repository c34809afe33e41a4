"""The instance's Ports page: expose and close ports, make and revoke share links. Each view looks up the
owner's instance, calls one service, and shows the page again with what happened."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from portal.instances.selectors import instance_of_owner

from . import selectors, services
from .addresses import port_url, share_url
from .forms import ExposeForm, ShareForm


def _page(request, instance, *, new_link: str = "", status: int = 200):
    rows = [
        {
            "exposed": exposed,
            "url": port_url(exposed.host_label),
            "links": selectors.share_links_of(exposed),
            "share_form": ShareForm(auto_id=f"share-{exposed.port}-%s"),
        }
        for exposed in selectors.open_ports_of(instance)
    ]
    context = {
        "instance": instance,
        "ports": rows,
        "expose_form": ExposeForm(auto_id="expose-%s"),
        "new_link": new_link,
    }
    return render(request, "ports/ports.html", context, status=status)


@login_required
@require_GET
def ports_page(request, instance_id):
    return _page(request, instance_of_owner(request.user, instance_id))


@login_required
@require_POST
def port_expose(request, instance_id):
    form = ExposeForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(form.errors["port"]))
        return redirect("ports:page", instance_id=instance_id)
    try:
        exposed = services.port_expose(
            user=request.user, instance_id=instance_id, port=form.cleaned_data["port"]
        )
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"Port {exposed.port} is at {port_url(exposed.host_label)}, for you alone.")
    return redirect("ports:page", instance_id=instance_id)


@login_required
@require_POST
def port_close(request, instance_id, port):
    exposed = services.port_close(user=request.user, instance_id=instance_id, port=port)
    messages.success(request, f"Port {exposed.port} is closed, and its share links with it.")
    return redirect("ports:page", instance_id=instance_id)


@login_required
@require_POST
def share_create(request, instance_id, port):
    instance = instance_of_owner(request.user, instance_id)
    form = ShareForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(message for errors in form.errors.values() for message in errors))
        return redirect("ports:page", instance_id=instance_id)
    try:
        link, secret = services.share_create(
            user=request.user,
            instance_id=instance.id,
            port=port,
            hours=form.cleaned_data["hours"],
            email=form.cleaned_data["email"],
        )
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("ports:page", instance_id=instance_id)
    # Shown here, once, and never stored: no redirect, so the secret is in no message or session.
    return _page(request, instance, new_link=share_url(link.exposed_port.host_label, secret), status=201)


@login_required
@require_POST
def share_revoke(request, instance_id, share_id):
    services.share_revoke(user=request.user, instance_id=instance_id, share_id=share_id)
    messages.success(request, "The share link is revoked; it lets nobody in any more.")
    return redirect("ports:page", instance_id=instance_id)
