"""The API's JSON shapes. Input serializers check types only; the pages' forms and services judge the
values, so the API answers with the same messages as the pages."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.credits.models import GPU_SECONDS_PER_HOUR
from portal.instances import selectors as instance_selectors


def _valid_unicode(value: str) -> None:
    # JSON can carry lone surrogates ("\ud800"), which no UTF-8 database column can store.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise serializers.ValidationError("Send valid UTF-8 text.") from None


def text_input(**kwargs) -> serializers.CharField:
    """A string field of a request body. Lengths and meaning are the pages' forms' to judge."""
    return serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        validators=[_valid_unicode],
        **kwargs,
    )


def gpu_hours(gpu_seconds: int) -> str:
    return f"{gpu_seconds / GPU_SECONDS_PER_HOUR:.2f}"


class ProblemSerializer(serializers.Serializer):
    type = serializers.CharField(
        help_text="A URN naming the kind of problem, e.g. urn:devcloud:problem:validation."
    )
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField(help_text="What went wrong and what to do, in the pages' words.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="For 400: messages per request field (non_field_errors for the request as a whole).",
    )


# --- Account ---------------------------------------------------------------------------------------


class EntitlementsSerializer(serializers.Serializer):
    tier = serializers.CharField(help_text="free, or bonus after an approved bonus application.")
    sizes = serializers.ListField(
        child=serializers.CharField(), help_text="Size keys this account may launch."
    )


class LimitsSerializer(serializers.Serializer):
    max_live_instances = serializers.IntegerField()
    live_instances = serializers.IntegerField()
    launch_min_credit_minutes = serializers.IntegerField()
    bonus_cap_gpu_hours = serializers.IntegerField()


class TokenInfoSerializer(serializers.Serializer):
    name = serializers.CharField()
    scope = serializers.CharField()
    expires_at = serializers.DateTimeField()


class SshAccessSerializer(serializers.Serializer):
    gateway_host = serializers.CharField()
    gateway_port = serializers.IntegerField()
    proxy_jump = serializers.CharField(help_text="The value for `ssh -J`, e.g. 127.0.0.1:2222.")
    user = serializers.CharField(help_text="The user inside an instance.")
    example = serializers.CharField()


class MeSerializer(serializers.Serializer):
    email = serializers.EmailField()
    email_verified = serializers.BooleanField()
    suspended = serializers.BooleanField()
    suspension = serializers.CharField(help_text="Why the account is suspended; empty when it is not.")
    balance_gpu_seconds = serializers.IntegerField()
    balance_gpu_hours = serializers.CharField()
    entitlements = EntitlementsSerializer()
    limits = LimitsSerializer()
    token = TokenInfoSerializer(allow_null=True, help_text="The token of this request; null for a session.")
    ssh = SshAccessSerializer()


class LedgerEntrySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    gpu_seconds = serializers.IntegerField()
    gpu_hours = serializers.SerializerMethodField()
    balance_after_gpu_seconds = serializers.IntegerField(source="balance_after")
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()

    def get_gpu_hours(self, entry) -> str:
        return gpu_hours(entry.gpu_seconds)


# --- Catalogue -------------------------------------------------------------------------------------


class SizeSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    gpus = serializers.IntegerField()
    hbm_gb = serializers.IntegerField()
    description = serializers.CharField()
    gpu_hours_per_hour = serializers.IntegerField()
    can_launch = serializers.BooleanField()
    refusal = serializers.CharField(
        help_text="Why this account cannot launch this size now; empty when it can."
    )
    session_limit = serializers.CharField()


class ImageSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    frameworks = serializers.ListField(child=serializers.CharField())
    sizes = serializers.ListField(child=serializers.CharField())
    is_default = serializers.BooleanField()
    availability = serializers.SerializerMethodField(help_text="ready, preparing, missing or unknown.")
    launchable = serializers.SerializerMethodField()

    def get_availability(self, image) -> str:
        return image.availability.state

    def get_launchable(self, image) -> bool:
        return image.availability.launchable


# --- Instances -------------------------------------------------------------------------------------


class StepSerializer(serializers.Serializer):
    step = serializers.CharField()
    label = serializers.CharField()
    status = serializers.CharField(help_text="done, current, failed or todo.")


class InstanceSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    short_id = serializers.CharField()
    size = serializers.CharField()
    image = serializers.CharField(source="image.key")
    image_name = serializers.CharField(source="image.name")
    state = serializers.CharField()
    step = serializers.CharField()
    steps = serializers.SerializerMethodField()
    failure_reason = serializers.CharField()
    stop_reason = serializers.SerializerMethodField()
    lab_url = serializers.SerializerMethodField(
        help_text="Where a browser opens JupyterLab; empty unless running."
    )
    charged_gpu_seconds = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    ready_at = serializers.DateTimeField(allow_null=True)
    stopped_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(StepSerializer(many=True))
    def get_steps(self, instance):
        return instance_selectors.progress(instance)

    def get_stop_reason(self, instance) -> str:
        return instance_selectors.stop_reason_text(instance)

    def get_lab_url(self, instance) -> str:
        if instance.state != instance.State.RUNNING:
            return ""
        request = self.context.get("request")
        path = instance_selectors.lab_url(instance)
        return request.build_absolute_uri(path) if request is not None else path


class InstanceListSerializer(serializers.Serializer):
    results = InstanceSerializer(many=True)


class LaunchSerializer(serializers.Serializer):
    size = text_input(help_text="A size key, e.g. 1x")
    image = text_input(help_text="An image key, e.g. pytorch")


class LogsSerializer(serializers.Serializer):
    lines = serializers.ListField(child=serializers.CharField(allow_blank=True))
    note = serializers.CharField(help_text="Why there are no lines, when there are none.")


# --- SSH keys and bonus applications ---------------------------------------------------------------


class SshKeySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    key_type = serializers.CharField()
    public_key = serializers.CharField()
    fingerprint = serializers.CharField()
    created_at = serializers.DateTimeField()


class SshKeyCreateSerializer(serializers.Serializer):
    name = text_input(help_text="e.g. laptop")
    public_key = text_input(
        help_text="One OpenSSH public key line, e.g. the contents of ~/.ssh/id_ed25519.pub"
    )


class BonusProgramSerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    evidence_label = serializers.CharField()
    max_gpu_hours = serializers.CharField(source="max_hours")


class BonusApplicationSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    program = serializers.CharField(source="program.slug")
    program_name = serializers.CharField(source="program.name")
    evidence = serializers.CharField()
    status = serializers.CharField()
    granted_gpu_hours = serializers.CharField(source="granted_hours")
    decision_reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True)


class BonusApplyRequestSerializer(serializers.Serializer):
    program = text_input(help_text="A program's slug (GET /api/v1/bonus-programs)")
    evidence = text_input(help_text="Certificate ID or URL")
