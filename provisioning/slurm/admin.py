"""Operator console for Slurm clusters: register one (checked live against its slurmrestd), replace its
token, and see its nodes, their GPUs and what runs on them from Slurm's own view."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from portal.audit.services import audit_record

from ..models import SlurmCluster
from . import clusters
from .rest import SlurmError

# What may change after registration without a new check of the cluster.
PATH_FIELDS = ("image_root", "workspace_root", "job_root", "device_dir", "callback_url")


class SlurmClusterForm(forms.ModelForm):
    """Registration: refuses a cluster whose slurmrestd does not answer, refuses the token, or lacks a
    partition or the GRES, saying which and what to do (clusters.cluster_probe). On an existing cluster a
    new token is checked the same way before it replaces the stored one."""

    token = forms.CharField(
        label="JWT",
        required=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}),
        help_text="From `scontrol token username=<user> lifespan=<seconds>` on the cluster. Stored sealed; "
        "never shown again. On a registered cluster, leave blank to keep the stored one.",
    )
    partition_names = forms.CharField(
        label="Partitions",
        required=False,
        help_text="The partitions DevCloud may submit to, separated by commas, as `sinfo -s` names them.",
    )

    class Meta:
        model = SlurmCluster
        fields = ["name", "rest_url", "rest_user", "gres_name", *PATH_FIELDS]
        labels = {
            "rest_url": "slurmrestd URL",
            "rest_user": "Slurm user",
            "gres_name": "GPU GRES name",
            "image_root": "Image root (shared)",
            "workspace_root": "Workspace root (shared)",
            "job_root": "Job directory (shared)",
            "device_dir": "Device directory on the nodes",
            "callback_url": "Portal URL as the nodes reach it",
        }
        help_texts = {
            "rest_url": "e.g. http://slurm-head:6820, slurmrestd with JWT authentication.",
            "rest_user": "The Slurm user DevCloud's jobs run as; the JWT must be this user's.",
            "image_root": "One directory per image holds its root filesystem (its name: the image reference "
            "with every character but letters, digits, _ . and - as _), on storage every node sees.",
            "workspace_root": "A directory per person, on storage every node sees.",
            "job_root": "Each job's bundle, home and output, on storage every node sees.",
            "device_dir": "Where /dev/kfd and /dev/dri are on a node: /dev on real nodes; {node} stands "
            "for the node's name.",
            "callback_url": "Where a job reports its node and ports, e.g. https://devcloud.example.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            # What the cluster was checked with stays; a viewer's form has none of these fields.
            for name in ("name", "rest_url", "rest_user", "gres_name", "partition_names"):
                if name in self.fields:
                    self.fields[name].disabled = True
            self.initial["partition_names"] = ", ".join(
                self.instance.partitions.values_list("slurm_partition", flat=True)
            )

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        partitions = [name.strip() for name in cleaned.get("partition_names", "").split(",") if name.strip()]
        cleaned["partitions"] = partitions
        token = cleaned.get("token", "").strip()
        cleaned["token"] = token
        if self.instance.pk and not token:
            return cleaned
        if not token:
            raise ValidationError({"token": "Paste the JWT DevCloud uses for this cluster."})
        try:
            clusters.cluster_probe(
                rest_url=cleaned["rest_url"] if not self.instance.pk else self.instance.rest_url,
                rest_user=cleaned["rest_user"] if not self.instance.pk else self.instance.rest_user,
                token=token,
                partitions=partitions or list(self.instance.partitions.values_list("slurm_partition", flat=True)),
                gres_name=cleaned.get("gres_name") or self.instance.gres_name,
            )
        except clusters.ClusterRefused as refused:
            target = "partition_names" if refused.field == "partitions" else refused.field
            raise ValidationError({target if target in self.fields else None: f"Not saved: {refused.message}"})
        return cleaned


class SlurmClusterAdmin(admin.ModelAdmin):
    form = SlurmClusterForm
    list_display = ["name", "rest_url", "health", "last_seen_at", "last_error"]
    readonly_fields = ["health", "last_error", "last_seen_at"]
    change_form_template = "admin/provisioning/slurmcluster/change_form.html"

    def get_fields(self, request, obj=None):
        fields = ["name", "rest_url", "rest_user", "token", "partition_names", "gres_name", *PATH_FIELDS]
        return fields + (self.readonly_fields if obj else [])

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if not change:
            try:
                registered = clusters.cluster_register(
                    actor=request.user, name=data["name"], rest_url=data["rest_url"], rest_user=data["rest_user"],
                    token=data["token"], partitions=data["partitions"], gres_name=data["gres_name"],
                    **{name: data[name] for name in PATH_FIELDS},
                )
            except clusters.ClusterRefused as refused:
                messages.error(request, f"Not saved: {refused.message}")
                return
            obj.pk = registered.pk
            return
        if data.get("token"):
            clusters.cluster_token_replace(actor=request.user, cluster=obj, token=data["token"])
        changed = {name: data[name] for name in PATH_FIELDS if name in form.changed_data}
        if changed:
            SlurmCluster.objects.filter(pk=obj.pk).update(**changed)
            audit_record(actor=request.user, action="slurm.cluster_changed", target=obj, details=changed)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = dict(extra_context or {})
        cluster = self.get_object(request, object_id)
        if cluster is not None:
            try:
                extra["nodes"] = clusters.cluster_nodes(cluster)
            except (SlurmError, ValueError) as error:
                extra["nodes_error"] = getattr(error, "message", str(error))
        return super().change_view(request, object_id, form_url, extra_context=extra)
