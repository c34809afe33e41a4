"""Operator console for GPU hosts: register (with a live engine check), discover, drain, and the GPU map."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from . import selectors, services
from .inventory import InventoryError
from .models import Gpu, GpuHost

# Changing any of these means talking to a different engine (or as someone else): check it again.
ENGINE_FIELDS = ("docker_url", "tls_ca_cert", "tls_client_cert", "tls_client_key")


class GpuHostForm(forms.ModelForm):
    """Refuses to save a host whose Docker engine does not answer, with the engine's own reason."""

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
            "sysfs_root",
            "dev_root",
            "state",
            "cpus_per_gpu",
            "memory_mb_per_gpu",
        ]
        widgets = {
            "tls_ca_cert": forms.Textarea(attrs={"rows": 4}),
            "tls_client_cert": forms.Textarea(attrs={"rows": 4}),
        }
        labels = {
            "docker_url": "Docker engine URL",
            "tls_ca_cert": "TLS CA certificate",
            "tls_client_cert": "TLS client certificate",
            "sysfs_root": "KFD sysfs root",
            "dev_root": "Device root",
        }
        help_texts = {
            "tls_ca_cert": "PEM of the CA that signed the engine's certificate (tcp:// endpoints).",
            "tls_client_cert": "PEM of the portal's client certificate for this engine.",
            "docker_url": "unix:///var/run/docker.sock, or tcp://host:2376 with the TLS fields below.",
            "sysfs_root": "Where this portal reads the host's /sys/class/kfd from: / on the host itself, "
            "otherwise a mount or copy of the remote host's sysfs.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The stored key is a secret: the form starts empty and keeps the stored one unless replaced.
        self.initial["tls_client_key"] = ""

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        key = cleaned.get("tls_client_key", "")
        if not key and cleaned.get("tls_client_cert") and self.instance.pk:
            cleaned["tls_client_key"] = self.instance.tls_client_key
        if not cleaned.get("tls_client_cert"):
            cleaned["tls_client_key"] = ""
        is_new = self.instance.pk is None
        engine_changed = any(cleaned.get(name, "") != getattr(self.instance, name) for name in ENGINE_FIELDS)
        if is_new or engine_changed:
            try:
                services.engine_ping(**{name: cleaned.get(name, "") for name in ENGINE_FIELDS})
            except services.HostError as error:
                raise ValidationError(f"Not saved: {error.message}") from error
        return cleaned


class GpuInline(admin.TabularInline):
    """The host's GPUs as discovery last saw them. Read-only: only discovery writes them."""

    model = Gpu
    fields = ["node_id", "gpu_id", "render_minor", "pci_address", "unique_id", "vram_gb", "is_present"]
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


@admin.register(GpuHost)
class GpuHostAdmin(admin.ModelAdmin):
    form = GpuHostForm
    list_display = ["name", "state", "docker_url", "gpus_used", "last_seen_at", "short_error"]
    list_filter = ["state"]
    search_fields = ["name", "docker_url"]
    readonly_fields = ["gpu_map", "last_seen_at", "last_error", "created_at"]
    inlines = [GpuInline]
    actions = ["discover_gpus", "check_engines", "drain_hosts", "activate_hosts"]

    def get_queryset(self, request):
        return selectors.hosts_with_usage()

    def get_inlines(self, request, obj):
        # GPUs exist only once discovery has run on a saved host.
        return self.inlines if obj is not None else []

    def get_fieldsets(self, request, obj=None):
        engine_fields = ["name", "docker_url", "tls_ca_cert", "tls_client_cert", "tls_client_key"]
        placement_fields = ["state", "sysfs_root", "dev_root", "cpus_per_gpu", "memory_mb_per_gpu"]
        engine = ("Engine", {"fields": engine_fields})
        placement = ("Placement", {"fields": placement_fields})
        if obj is None:
            return [engine, placement]
        health = ("Health", {"fields": ["last_seen_at", "last_error", "created_at"]})
        return [("GPU map", {"fields": ["gpu_map"]}), engine, placement, health]

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
            return "No GPUs discovered yet: run the \"Discover GPUs\" action."
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>/dev/dri/renderD{}</td><td>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    row.gpu.node_id,
                    row.gpu.render_minor,
                    _pci_address(row.gpu.location_id),
                    "yes" if row.gpu.is_present else "VANISHED",
                    _instance_link(row.instance) if row.instance else "free",
                    row.owner_email or "—",
                    row.held_since.strftime("%Y-%m-%d %H:%M UTC") if row.held_since else "—",
                )
                for row in rows
            ),
        )
        return format_html(
            "<table><thead><tr><th>KFD node</th><th>Render node</th><th>Location (PCI)</th><th>Present</th>"
            "<th>Instance</th><th>Owner</th><th>Since</th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change:
            return
        # The form just reached the engine, so the host was seen now.
        GpuHost.objects.filter(pk=obj.pk).update(last_seen_at=timezone.now())
        try:
            summary = services.host_discover(host_id=obj.pk)
        except InventoryError as error:
            self.message_user(request, f"Saved, but GPU discovery failed: {error}", messages.WARNING)
        else:
            self.message_user(request, f"Discovered {summary}", messages.SUCCESS)

    @admin.action(description="Discover GPUs (read KFD sysfs)")
    def discover_gpus(self, request, queryset):
        for host in queryset:
            try:
                summary = services.host_discover(host_id=host.pk)
            except InventoryError as error:
                self.message_user(request, f"{host.name}: {error}", messages.ERROR)
            else:
                level = messages.WARNING if summary.vanished_held else messages.SUCCESS
                self.message_user(request, str(summary), level)

    @admin.action(description="Check the Docker engine connection")
    def check_engines(self, request, queryset):
        for host in queryset:
            try:
                version = services.host_check(host_id=host.pk)
            except services.HostError as error:
                self.message_user(request, f"{host.name}: {error.message}", messages.ERROR)
            else:
                self.message_user(request, f"{host.name}: Docker {version.get('Version', '?')} answered.")

    @admin.action(description="Drain (no new instances; running ones continue)")
    def drain_hosts(self, request, queryset):
        for host in queryset:
            services.host_drain(host_id=host.pk)
        self.message_user(
            request, f"Draining {len(queryset)} host(s): the scheduler places nothing new there."
        )

    @admin.action(description="Mark active (accept new instances)")
    def activate_hosts(self, request, queryset):
        for host in queryset:
            services.host_activate(host_id=host.pk)
        self.message_user(request, f"{len(queryset)} host(s) active.")
