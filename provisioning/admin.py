"""Operator console for GPU hosts: register (with a live engine check), discover, the GPU map, drain, cordon
and evict, retire, and the host's images with pre-pull or build jobs whose progress the page polls.

Whatever asks an engine (the check, discovery, the image list) runs on the provisioning worker
(console_calls.py): this web process has no Docker socket. When the worker does not answer, the page
says so and still renders.

Every state change goes through a confirmation page that asks for the reason, and through services, which
record it in the audit log. The state is not editable on the host's form, so nothing bypasses that.
"""

from dataclasses import dataclass

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince

from portal.audit.services import audit_record
from portal.instances import services as instance_services
from portal.instances.models import Image, Instance
from portal.lib.sealed import Unreadable

from . import console_calls, gpu_health, health, images, selectors, services, shares
from .drivers.docker_engine import limits_policy
from .inventory import InventoryError
from .models import Gpu, GpuHost, ImageJob

# Changing any of these means talking to a different engine (or as someone else): check it again.
ENGINE_FIELDS = ("docker_url", "tls_ca_cert", "tls_client_cert", "tls_client_key")


class GpuHostForm(forms.ModelForm):
    """Refuses to save a host whose Docker engine does not answer, with the engine's own reason, and an
    endpoint services.host_endpoint_check refuses (plain TCP, TLS without a client certificate, this
    machine's socket for another machine, no private address)."""

    tls_client_key = forms.CharField(
        label="TLS client key",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off"}),
        help_text="PEM. Never shown again once saved: leave blank to keep the stored key.",
    )

    class Meta:
        model = GpuHost
        fields = [
            "name",
            "docker_url",
            "tls_ca_cert",
            "tls_client_cert",
            "tls_client_key",
            "private_address",
            "sysfs_root",
            "dev_root",
            "state",
            "cpus_per_gpu_override",
            "memory_mb_per_gpu_override",
            "shm_mb_per_gpu_override",
        ]
        widgets = {
            "tls_ca_cert": forms.Textarea(attrs={"rows": 4}),
            "tls_client_cert": forms.Textarea(attrs={"rows": 4}),
        }
        labels = {
            "docker_url": "Docker engine URL",
            "tls_ca_cert": "TLS CA certificate",
            "tls_client_cert": "TLS client certificate",
            "private_address": "Private address",
            "sysfs_root": "KFD sysfs root",
            "dev_root": "Device root",
            "cpus_per_gpu_override": "CPUs per GPU (override)",
            "memory_mb_per_gpu_override": "Memory per GPU, MB (override)",
            "shm_mb_per_gpu_override": "/dev/shm per GPU, MB (override)",
        }
        help_texts = {
            "tls_ca_cert": "PEM of the CA that signed the engine's certificate (tcp:// endpoints).",
            "tls_client_cert": "PEM of the portal's client certificate for this engine.",
            "docker_url": "tcp://host:2376 with mutual TLS (dockerd --tlsverify; the CA, client certificate "
            "and key below). unix:///var/run/docker.sock only for the machine the portal runs on.",
            "private_address": "The host's address on the private network the gateway reaches it by. "
            "JupyterLab is published only there. Required for tcp:// hosts; 127.0.0.1 when left blank for "
            "this machine's engine.",
            "sysfs_root": "Path ON THE HOST under which sys/class/kfd and sys/class/drm are read (through "
            "its engine): / on a real host.",
            "dev_root": "Path ON THE HOST under which dev/kfd and dev/dri live: / on a real host.",
            "cpus_per_gpu_override": "Blank: an even share of the host's CPUs after its reserve, set at "
            "discovery. May be fractional (0.5).",
            "memory_mb_per_gpu_override": "Blank: an even share of the host's memory after its reserve.",
            "shm_mb_per_gpu_override": "Blank: half the memory share. Counts against the memory share.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The stored key is a secret: the form starts empty and keeps the stored one unless replaced.
        self.initial["tls_client_key"] = ""

    def _stored_key(self) -> str | None:
        """The stored client key, or None when this portal's sealing key cannot open it."""
        try:
            return self.instance.tls_client_key
        except Unreadable:
            return None

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        key = cleaned.get("tls_client_key", "")
        stored_key = self._stored_key()
        if not key and cleaned.get("tls_client_cert") and self.instance.pk:
            if stored_key is None:
                raise ValidationError(
                    "The stored TLS client key cannot be read with this portal's sealing key "
                    "(DEVCLOUD_SEALING_KEY or SECRET_KEY changed): paste the key again."
                )
            cleaned["tls_client_key"] = stored_key
        if not cleaned.get("tls_client_cert"):
            cleaned["tls_client_key"] = ""
        try:
            cleaned["private_address"] = services.host_endpoint_check(
                private_address=cleaned.get("private_address"),
                **{name: cleaned.get(name, "") for name in ENGINE_FIELDS},
            )
        except services.HostError as error:
            raise ValidationError(error.message) from error
        self._check_share_overrides(cleaned)
        is_new = self.instance.pk is None
        stored = {name: getattr(self.instance, name) for name in ENGINE_FIELDS if name != "tls_client_key"}
        stored["tls_client_key"] = stored_key
        engine_changed = any(cleaned.get(name, "") != stored[name] for name in ENGINE_FIELDS)
        self.engine_changed = is_new or engine_changed
        if self.engine_changed:
            try:
                console_calls.engine_ping(**{name: cleaned.get(name, "") for name in ENGINE_FIELDS})
            except services.HostError as error:
                raise ValidationError(f"Not saved: {error.message}") from error
        return cleaned


    def _check_share_overrides(self, cleaned) -> None:
        # Checked against what discovery last read of the host; a new host is checked at its discovery.
        host = self.instance
        errors = shares.overrides_check(
            host_cpus=host.host_cpus,
            host_memory_mb=host.host_memory_mb,
            gpu_count=host.gpus.filter(is_present=True).count() if host.pk else 1,
            cpus=cleaned.get("cpus_per_gpu_override"),
            memory_mb=cleaned.get("memory_mb_per_gpu_override"),
            shm_mb=cleaned.get("shm_mb_per_gpu_override"),
            memory_share_mb=host.memory_mb_per_gpu if host.pk else None,
        )
        for key, name in (("cpus", "cpus_per_gpu_override"), ("memory_mb", "memory_mb_per_gpu_override")):
            value = cleaned.get(name)
            if value is not None and value <= 0:
                errors[key] = "a share must be more than 0; leave it blank for the even share."
        names = {"cpus": "cpus_per_gpu_override", "memory_mb": "memory_mb_per_gpu_override"}
        for key, message in errors.items():
            self.add_error(names.get(key, "shm_mb_per_gpu_override"), f"Not saved: {message}")


class GpuInline(admin.TabularInline):
    """The host's GPUs as discovery last saw them. Read-only: only discovery writes them."""

    model = Gpu
    fields = [
        "node_id",
        "gpu_id",
        "render_minor",
        "render_gid",
        "pci_address",
        "unique_id",
        "vram_gb",
        "is_present",
    ]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="PCI address (location_id)")
    def pci_address(self, gpu):
        return _pci_address(gpu.location_id)

    @admin.display(description="VRAM")
    def vram_gb(self, gpu):
        return f"{gpu.vram_bytes / 2**30:.0f} GiB" if gpu.vram_bytes else "—"


def _pci_address(location_id: int) -> str:
    bus, devfn = location_id >> 8, location_id & 0xFF
    return f"{bus:02x}:{devfn >> 3:02x}.{devfn & 0x7} ({location_id})"


def _instance_link(instance) -> str:
    try:
        url = reverse("admin:instances_instance_change", args=[instance.pk])
    except NoReverseMatch:
        # The instance admin is not registered (yet): show the id without a dead link.
        return instance.short_id
    return format_html('<a href="{}">{}</a>', url, instance.short_id)


class ReasonForm(forms.Form):
    """The operator's reason for a host state change: it goes into the audit log (and, for an eviction,
    to every owner whose instance is stopped)."""

    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        max_length=1000,
        help_text="Recorded in the audit log under your name. For an eviction, each owner is emailed it.",
        error_messages={"required": "Give a reason: it is recorded with the action."},
    )


class ImageJobForm(forms.Form):
    """Which catalogue image to put onto the selected hosts."""

    image = forms.ModelChoiceField(
        queryset=Image.objects.filter(is_enabled=True),
        empty_label=None,
        help_text="An image with a build context is built on the host from containers/; others are pulled.",
    )
    reason = forms.CharField(
        required=False, max_length=1000, widget=forms.TextInput(attrs={"size": 60}), help_text="Optional."
    )


@dataclass(frozen=True)
class HostOperation:
    """One of the state changes an operator confirms with a reason."""

    key: str
    title: str
    explanation: str
    button: str
    danger: bool = False


HOST_OPERATIONS = {
    operation.key: operation
    for operation in (
        HostOperation(
            "drain",
            "Drain",
            "The scheduler places nothing new on these hosts. Instances already there keep running until "
            "their owners stop them.",
            "Drain",
        ),
        HostOperation(
            "evict",
            "Cordon and evict",
            "The hosts stop taking new instances, and every live instance on them is stopped now: billing "
            "ends at once, workspaces are kept, and each owner is emailed your reason.",
            "Stop these instances and cordon",
            danger=True,
        ),
        HostOperation(
            "retire",
            "Retire",
            "The hosts leave service: their GPUs are never allocated again. Only a host without live "
            "instances can be retired; drain it and wait, or cordon and evict it first.",
            "Retire",
            danger=True,
        ),
        HostOperation(
            "activate",
            "Mark active",
            "The scheduler may place new instances on these hosts again.",
            "Mark active",
        ),
    )
}


# Each operation has its own permission (console.OperatorAction), not provisioning.change_gpuhost, which
# also edits the host's engine address and credentials.
OPERATION_PERMISSIONS = {
    "drain": "console.drain_host",
    "evict": "console.evict_host",
    "retire": "console.retire_host",
    "activate": "console.activate_host",
}


# Returning a drained GPU is putting capacity back into service, like activating a host.
GPU_RETURN_PERMISSION = "console.activate_host"


def _gpu_health_cell(host, gpu) -> str:
    """The GPU map's health cell: "ok" with its error counts, or DRAINED, why, and the way back."""
    counts = (
        f" (errors: {gpu.ras_uncorrectable} uncorrectable, {gpu.ras_correctable} correctable)"
        if gpu.ras_uncorrectable is not None
        else ""
    )
    if not gpu.is_drained:
        return format_html("ok{}", counts)
    return format_html(
        '<strong class="errornote" data-testid="gpu-drained">DRAINED</strong> since {} UTC: {}{} '
        '<a href="{}">Return to service</a>',
        gpu.drained_at.strftime("%Y-%m-%d %H:%M") if gpu.drained_at else "—",
        gpu.drained_reason,
        counts,
        reverse("admin:provisioning_gpuhost_gpu_return", args=[host.pk, gpu.pk]),
    )


def _live_on(host):
    return Instance.objects.filter(host=host, state__in=Instance.LIVE_STATES)


@admin.register(GpuHost)
class GpuHostAdmin(admin.ModelAdmin):
    form = GpuHostForm
    list_display = [
        "name",
        "state",
        "docker_url",
        "private_address",
        "gpus_used",
        "last_seen_at",
        "short_error",
    ]
    list_filter = ["state"]
    search_fields = ["name", "docker_url"]
    readonly_fields = [
        "gpu_map",
        "kfd_gid",
        "last_seen_at",
        "last_error",
        "created_at",
        "host_size",
        "shares_given",
    ]
    inlines = [GpuInline]
    actions = [
        "discover_gpus",
        "check_engines",
        "drain_hosts",
        "evict_hosts",
        "retire_hosts",
        "activate_hosts",
        "ensure_image_on_hosts",
    ]
    change_form_template = "admin/provisioning/gpuhost/change_form.html"

    def get_queryset(self, request):
        # Slurm partitions have no engine: their cluster has a page of its own (provisioning/slurm/admin.py).
        return selectors.hosts_with_usage().exclude(backend=GpuHost.Backend.SLURM)

    def get_inlines(self, request, obj):
        # GPUs exist only once discovery has run on a saved host.
        return self.inlines if obj is not None else []

    def get_readonly_fields(self, request, obj=None):
        # A saved host changes state only through the confirmed, audited operations.
        return [*self.readonly_fields, "state"] if obj is not None else self.readonly_fields

    def get_fieldsets(self, request, obj=None):
        engine_fields = [
            "name",
            "docker_url",
            "tls_ca_cert",
            "tls_client_cert",
            "tls_client_key",
            "private_address",
        ]
        placement_fields = ["state", "sysfs_root", "dev_root"]
        override_fields = ["cpus_per_gpu_override", "memory_mb_per_gpu_override", "shm_mb_per_gpu_override"]
        engine = ("Engine", {"fields": engine_fields})
        placement = ("Placement", {"fields": placement_fields})
        shares_set = (
            "Per-GPU shares",
            {
                "fields": ["host_size", "shares_given", *override_fields],
                "description": "What each GPU's instance gets of the host: an even share of what discovery "
                "read, after the host's reserve (docs/architecture.md, Right-sized instances), unless "
                "overridden here.",
            },
        )
        if obj is None:
            return [engine, placement, ("Per-GPU shares", {"fields": override_fields})]
        health = ("Health", {"fields": ["kfd_gid", "last_seen_at", "last_error", "created_at"]})
        return [("GPU map", {"fields": ["gpu_map"]}), engine, placement, shares_set, health]

    @admin.display(description="What the host has (last discovery)")
    def host_size(self, host):
        if not host.host_cpus and not host.host_memory_mb:
            return 'Not read yet: run the "Discover GPUs" action.'
        disk = f", {host.host_disk_gb} GB disk" if host.host_disk_gb else ""
        return f"{host.host_cpus or '?'} CPUs, {(host.host_memory_mb or 0) / 1024:.0f} GiB memory{disk}"

    @admin.display(description="Each GPU's instance gets")
    def shares_given(self, host):
        shm = (
            f"{host.shm_mb_per_gpu / 1024:.1f} GiB"
            if host.shm_mb_per_gpu
            else "half the memory (at most 64 GiB)"
        )
        return f"{host.cpus_per_gpu:g} CPUs, {host.memory_mb_per_gpu / 1024:.1f} GiB memory, /dev/shm {shm}"

    @admin.display(description="GPUs in use")
    def gpus_used(self, host):
        return f"{host.used_count} / {host.present_count}"

    @admin.display(description="Last error")
    def short_error(self, host):
        return host.last_error[:80]

    @admin.display(description="Which instance holds which GPU")
    def gpu_map(self, host):
        rows = selectors.gpu_map(host)
        if not rows:
            return 'No GPUs discovered yet: run the "Discover GPUs" action.'
        now = timezone.now()
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>/dev/dri/renderD{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    row.gpu.node_id,
                    row.gpu.render_minor,
                    _pci_address(row.gpu.location_id),
                    "yes" if row.gpu.is_present else "VANISHED",
                    _gpu_health_cell(host, row.gpu),
                    _instance_link(row.instance) if row.instance else "free",
                    row.owner_email or "—",
                    row.held_since.strftime("%Y-%m-%d %H:%M UTC") if row.held_since else "—",
                    # "2 hours, 5 minutes", with no-break spaces that keep each cell on one line.
                    timesince(row.held_since, now) if row.held_since else "—",
                )
                for row in rows
            ),
        )
        return format_html(
            "<table><thead><tr><th>KFD node</th><th>Render node</th><th>Location (PCI)</th><th>Present</th><th>Health</th>"
            "<th>Instance</th><th>Owner</th><th>Since</th><th>Held for</th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change:
            if any(name.endswith("_override") for name in form.changed_data):
                services.host_shares_apply(host_id=obj.pk)
            if getattr(form, "engine_changed", False):
                request.devcloud_host_saved = (obj.pk, False)
            return
        audit_record(
            actor=request.user,
            action="host.add",
            target=obj,
            details={"docker_url": obj.docker_url, "state": obj.state},
        )
        request.devcloud_host_saved = (obj.pk, True)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # The admin saves inside a transaction; the worker that checks and discovers the host can see it
        # only once that has committed, so the engine work follows the save instead of being part of it.
        response = super().changeform_view(request, object_id, form_url, extra_context)
        saved = getattr(request, "devcloud_host_saved", None)
        if saved is not None:
            self._engine_after_save(request, *saved)
        return response

    def _engine_after_save(self, request, host_id: int, is_new: bool) -> None:
        """The engine check of a host just saved (on the worker: it records last_seen_at and what disk
        limits the engine can enforce) with the disk-limit warning, so the operator learns it now rather
        than at the first launch; then, for a new host, GPU discovery and the catalogue's images."""
        try:
            console_calls.host_check(host_id=host_id)
        except services.HostError as error:
            self.message_user(request, f"Saved, but the engine check failed: {error.message}", messages.WARNING)
        else:
            host = GpuHost.objects.get(pk=host_id)
            note = selectors.disk_limits_note(host, policy=limits_policy())
            self.message_user(
                request, f"{host.name}: {note.text}", messages.SUCCESS if note.ok else messages.WARNING
            )
        if not is_new:
            return
        try:
            summary = console_calls.host_discover(host_id=host_id)
        except (InventoryError, services.HostError) as error:
            reason = error.message if isinstance(error, services.HostError) else error
            self.message_user(request, f"Saved, but GPU discovery failed: {reason}", messages.WARNING)
        else:
            self.message_user(request, f"Discovered {summary}", messages.SUCCESS)
        host = GpuHost.objects.get(pk=host_id)
        jobs = images.host_images_prefetch(host=host, actor=request.user)
        if jobs:
            self.message_user(
                request,
                f"Putting {len(jobs)} catalogue image(s) onto {host.name}; their progress shows on this host's page.",
                messages.INFO,
            )

    # --- Change page: images and jobs ---------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = extra_context or {}
        host = self.get_object(request, object_id)
        if host is not None:
            found = images.host_images(host)
            jobs = list(ImageJob.objects.filter(host=host).select_related("host", "image")[:10])
            extra_context.update(
                host_images=found,
                host_operations=[
                    (operation, reverse("admin:provisioning_gpuhost_state", args=[host.pk, operation.key]))
                    for operation in HOST_OPERATIONS.values()
                    if request.user.has_perm(OPERATION_PERMISSIONS[operation.key])
                ],
                image_jobs=[images.image_job_status(job) for job in jobs],
                image_jobs_status_url=reverse("admin:provisioning_gpuhost_image_jobs_status")
                + f"?host={host.pk}",
                ensure_image_url=reverse("admin:provisioning_gpuhost_ensure_image", args=[host.pk]),
                can_ensure_images=self.has_ensure_images_permission(request),
                health_history=health.health_history(host),
                disk_limits=selectors.disk_limits_note(host, policy=limits_policy()),
                heartbeat_seconds=health.heartbeat_seconds(),
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self):
        # Before the default URLs, whose "<path:object_id>/" would swallow these.
        view = self.admin_site.admin_view
        return [
            path(
                "<int:host_id>/state/<slug:operation>/",
                view(self.state_view),
                name="provisioning_gpuhost_state",
            ),
            path(
                "<int:host_id>/images/ensure/",
                view(self.ensure_image_view),
                name="provisioning_gpuhost_ensure_image",
            ),
            path(
                "<int:host_id>/gpus/<int:gpu_id>/return/",
                view(self.gpu_return_view),
                name="provisioning_gpuhost_gpu_return",
            ),
            path("image-jobs/", view(self.image_jobs_view), name="provisioning_gpuhost_image_jobs"),
            path(
                "image-jobs/status.json",
                view(self.image_jobs_status_view),
                name="provisioning_gpuhost_image_jobs_status",
            ),
        ] + super().get_urls()

    # --- Host state: drain, evict, retire, activate -------------------------------------------------

    def state_view(self, request, host_id, operation):
        """One host's state change from its page: the confirmation page, then the change."""
        if operation not in HOST_OPERATIONS or not request.user.has_perm(OPERATION_PERMISSIONS[operation]):
            raise PermissionDenied
        host = get_object_or_404(GpuHost, pk=host_id)
        response = self._change_state(request, [host], HOST_OPERATIONS[operation], from_action=False)
        return response or redirect("admin:provisioning_gpuhost_change", host.pk)

    def gpu_return_view(self, request, host_id, gpu_id):
        """Return a drained GPU to service (provisioning/gpu_health.py): a page asking why, then the change."""
        if not request.user.has_perm(GPU_RETURN_PERMISSION):
            raise PermissionDenied
        gpu = get_object_or_404(Gpu.objects.select_related("host"), pk=gpu_id, host_id=host_id)
        form = ReasonForm(request.POST if request.method == "POST" else None)
        error = ""
        if request.method == "POST" and form.is_valid():
            try:
                gpu_health.gpu_return(gpu_id=gpu.pk, actor=request.user, reason=form.cleaned_data["reason"])
            except gpu_health.GpuReturnError as refused:
                error = str(refused)
            else:
                self.message_user(request, f"{gpu} is back in service: it takes new instances.", messages.SUCCESS)
                return redirect("admin:provisioning_gpuhost_change", gpu.host_id)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Return {gpu} to service",
            "gpu": gpu,
            "form": form,
            "error": error,
        }
        return TemplateResponse(request, "admin/provisioning/gpuhost/return_gpu.html", context)

    # Admin action permissions: Django calls has_<name>_permission(request).
    def has_drain_permission(self, request):
        return request.user.has_perm(OPERATION_PERMISSIONS["drain"])

    def has_evict_permission(self, request):
        return request.user.has_perm(OPERATION_PERMISSIONS["evict"])

    def has_retire_permission(self, request):
        return request.user.has_perm(OPERATION_PERMISSIONS["retire"])

    def has_activate_permission(self, request):
        return request.user.has_perm(OPERATION_PERMISSIONS["activate"])

    def has_discover_permission(self, request):
        return request.user.has_perm("console.discover_gpus")

    def has_check_engine_permission(self, request):
        return request.user.has_perm("console.check_engine")

    def has_ensure_images_permission(self, request):
        return request.user.has_perm("console.ensure_images")

    @admin.action(description="Drain (no new instances; running ones continue)", permissions=["drain"])
    def drain_hosts(self, request, queryset):
        return self._change_state(request, list(queryset), HOST_OPERATIONS["drain"])

    @admin.action(
        description="Cordon and evict (stop their instances, tell the owners)", permissions=["evict"]
    )
    def evict_hosts(self, request, queryset):
        return self._change_state(request, list(queryset), HOST_OPERATIONS["evict"])

    @admin.action(description="Retire (only hosts without live instances)", permissions=["retire"])
    def retire_hosts(self, request, queryset):
        return self._change_state(request, list(queryset), HOST_OPERATIONS["retire"])

    @admin.action(description="Mark active (accept new instances)", permissions=["activate"])
    def activate_hosts(self, request, queryset):
        return self._change_state(request, list(queryset), HOST_OPERATIONS["activate"])

    def _change_state(self, request, hosts, operation: HostOperation, *, from_action: bool = True):
        """The confirmation page (listing what will happen) until a reason is posted; then the change,
        reported host by host. Returns the page, or None once done (the caller goes back to the list)."""
        confirmed = request.method == "POST" and "_confirm" in request.POST
        form = ReasonForm(request.POST if confirmed else None)
        if confirmed and form.is_valid():
            for host in hosts:
                self._apply(request, host, operation, form.cleaned_data["reason"])
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{operation.title}: {', '.join(host.name for host in hosts)}",
            "operation": operation,
            "form": form,
            "hosts": [self._host_summary(host) for host in hosts],
            "from_action": from_action,
            "action_name": request.POST.get("action", ""),
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "cancel_url": (
                reverse("admin:provisioning_gpuhost_changelist")
                if from_action or len(hosts) != 1
                else reverse("admin:provisioning_gpuhost_change", args=[hosts[0].pk])
            ),
        }
        return TemplateResponse(request, "admin/provisioning/gpuhost/confirm_state.html", context)

    @staticmethod
    def _host_summary(host) -> dict:
        return {
            "host": host,
            "live": list(_live_on(host).select_related("user", "image").order_by("created_at")),
        }

    def _apply(self, request, host, operation: HostOperation, reason: str) -> None:
        actor = request.user
        try:
            if operation.key == "drain":
                services.host_drain(host_id=host.pk, actor=actor, reason=reason)
                running = _live_on(host).count()
                self.message_user(
                    request,
                    f"Draining {host.name}: nothing new is placed there; {running} live instance(s) keep running.",
                    messages.SUCCESS,
                )
            elif operation.key == "evict":
                summary = instance_services.host_evict(host_id=host.pk, actor=actor, reason=reason)
                self.message_user(request, str(summary), messages.SUCCESS)
            elif operation.key == "retire":
                services.host_retire(host_id=host.pk, actor=actor, reason=reason)
                self.message_user(
                    request, f"Retired {host.name}: its GPUs get no new instances.", messages.SUCCESS
                )
            else:
                services.host_activate(host_id=host.pk, actor=actor, reason=reason)
                self.message_user(
                    request, f"Activated {host.name}: it takes new instances.", messages.SUCCESS
                )
        except services.HostError as error:
            self.message_user(request, f"Not changed: {error.message}", messages.ERROR)

    # --- Engine actions ----------------------------------------------------------------------------

    # Both write to the host (its GPU rows, last_seen_at, last_error), so both are audited, failures too.

    @admin.action(
        description="Discover GPUs (KFD sysfs and device groups, through the engine)", permissions=["discover"]
    )
    def discover_gpus(self, request, queryset):
        for host in queryset:
            try:
                summary = console_calls.host_discover(host_id=host.pk)
            except (InventoryError, services.HostError) as error:
                reason = error.message if isinstance(error, services.HostError) else str(error)
                audit_record(actor=request.user, action="host.discover", target=host, details={"error": reason})
                self.message_user(request, f"{host.name}: {reason}", messages.ERROR)
            else:
                audit_record(
                    actor=request.user, action="host.discover", target=host, details={"found": str(summary)}
                )
                level = messages.WARNING if summary.vanished_held else messages.SUCCESS
                self.message_user(request, str(summary), level)

    @admin.action(description="Check the Docker engine connection", permissions=["check_engine"])
    def check_engines(self, request, queryset):
        for host in queryset:
            try:
                version = console_calls.host_check(host_id=host.pk)
            except services.HostError as error:
                audit_record(
                    actor=request.user, action="host.check", target=host, details={"error": error.message}
                )
                self.message_user(request, f"{host.name}: {error.message}", messages.ERROR)
            else:
                audit_record(
                    actor=request.user,
                    action="host.check",
                    target=host,
                    details={"docker_version": version.get("Version", "?")},
                )
                self.message_user(request, f"{host.name}: Docker {version.get('Version', '?')} answered.")
                host.refresh_from_db()
                note = selectors.disk_limits_note(host, policy=limits_policy())
                self.message_user(
                    request, f"{host.name}: {note.text}", messages.SUCCESS if note.ok else messages.WARNING
                )

    # --- Images ------------------------------------------------------------------------------------

    @admin.action(description="Pre-pull or build an image", permissions=["ensure_images"])
    def ensure_image_on_hosts(self, request, queryset):
        """A page to pick the image; its form posts back here, and the jobs' progress page follows."""
        hosts = list(queryset)
        confirmed = request.method == "POST" and "_confirm" in request.POST
        form = ImageJobForm(request.POST if confirmed else None)
        if confirmed and form.is_valid():
            jobs = self._request_jobs(request, hosts, form.cleaned_data["image"], form.cleaned_data["reason"])
            if not jobs:
                return None
            ids = ",".join(str(job.pk) for job in jobs)
            return redirect(reverse("admin:provisioning_gpuhost_image_jobs") + f"?ids={ids}")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Pre-pull or build an image",
            "form": form,
            "hosts": hosts,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/provisioning/gpuhost/ensure_image.html", context)

    def ensure_image_view(self, request, host_id):
        """The buttons of the host page's image list: this image on this host, or on every host."""
        host = get_object_or_404(GpuHost, pk=host_id)
        if request.method != "POST" or not self.has_ensure_images_permission(request):
            raise PermissionDenied
        image = Image.objects.filter(key=request.POST.get("image", ""), is_enabled=True).first()
        if image is None:
            self.message_user(request, "Choose an enabled catalogue image.", messages.ERROR)
            return redirect("admin:provisioning_gpuhost_change", host.pk)
        if request.POST.get("all_hosts"):
            jobs = self._request_jobs(
                request, list(GpuHost.objects.exclude(state=GpuHost.State.RETIRED)), image, ""
            )
            ids = ",".join(str(job.pk) for job in jobs)
            return redirect(reverse("admin:provisioning_gpuhost_image_jobs") + f"?ids={ids}")
        self._request_jobs(request, [host], image, "")
        return redirect(reverse("admin:provisioning_gpuhost_change", args=[host.pk]) + "#host-images")

    def _request_jobs(self, request, hosts, image, reason) -> list[ImageJob]:
        try:
            jobs = images.image_jobs_request(hosts=hosts, image=image, actor=request.user, reason=reason)
        except ValueError as error:
            self.message_user(request, str(error), messages.ERROR)
            return []
        skipped = len(hosts) - len(jobs)
        if jobs:
            self.message_user(
                request,
                f"Putting {image.reference} onto {', '.join(job.host.name for job in jobs)}: progress below.",
                messages.SUCCESS,
            )
        if skipped:
            self.message_user(request, f"Skipped {skipped} retired host(s).", messages.WARNING)
        return jobs

    def image_jobs_view(self, request):
        """Progress of the jobs named in ?ids=, updated live by the page's poll."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs = self._jobs_from(request)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Pre-pull and build jobs",
            "image_jobs": [images.image_job_status(job) for job in jobs],
            "image_jobs_status_url": reverse("admin:provisioning_gpuhost_image_jobs_status")
            + f"?ids={','.join(str(job.pk) for job in jobs)}",
        }
        return TemplateResponse(request, "admin/provisioning/gpuhost/image_jobs.html", context)

    def image_jobs_status_view(self, request):
        """JSON for the progress poll: the jobs named in ?ids=, or the latest ten of ?host=."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs = self._jobs_from(request)
        response = JsonResponse({"jobs": [images.image_job_status(job) for job in jobs]})
        response["Cache-Control"] = "no-store"
        return response

    @staticmethod
    def _jobs_from(request) -> list[ImageJob]:
        jobs = ImageJob.objects.select_related("host", "image")
        if "host" in request.GET:
            host_id = request.GET["host"]
            return list(jobs.filter(host_id=int(host_id))[:10]) if host_id.isdigit() else []
        ids = [int(part) for part in request.GET.get("ids", "").split(",") if part.strip().isdigit()]
        return list(jobs.filter(pk__in=ids[:200]).order_by("host__name", "pk"))


# The Slurm clusters' screens live beside the code they drive; Django finds admin registrations here.
from .models import SlurmCluster  # noqa: E402
from .slurm.admin import SlurmClusterAdmin  # noqa: E402

admin.site.register(SlurmCluster, SlurmClusterAdmin)
