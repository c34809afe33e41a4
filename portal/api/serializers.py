"""The API's JSON shapes. Input serializers check types only; the pages' forms and services judge the
values, so the API answers with the same messages as the pages."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.credits.models import GPU_SECONDS_PER_HOUR
from portal.instances import selectors as instance_selectors
from portal.instances import sessions
from portal.instances.models import LaunchPolicy

# The longest a key added with an expiry may live (a week); for longer, add it without one.
SSH_KEY_MAX_MINUTES = 7 * 24 * 60


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
    host_key = serializers.CharField(
        allow_null=True,
        help_text="The gateway's host key as known_hosts lines (one per key), e.g. "
        "`[ssh.example.com]:2222 ssh-ed25519 AAAA…`; null while the gateway has no key (see host_key_note).",
    )
    host_key_fingerprint = serializers.CharField(
        allow_null=True, help_text="Its SHA256 fingerprint as `ssh-keygen -l` prints it; null with host_key."
    )
    host_key_note = serializers.CharField(
        help_text="Why host_key is null (the gateway was never started); empty when it is set."
    )
    user = serializers.CharField(help_text="The user inside an instance.")
    example = serializers.CharField()


class MeSerializer(serializers.Serializer):
    email = serializers.EmailField()
    email_verified = serializers.BooleanField()
    suspended = serializers.BooleanField()
    suspension = serializers.CharField(help_text="Why the account is suspended; empty when it is not.")
    balance_gpu_seconds = serializers.IntegerField()
    balance_gpu_hours = serializers.CharField()
    held_gpu_seconds = serializers.IntegerField(
        help_text="Of the balance, what is held for your standing bookings: it cannot be spent elsewhere."
    )
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


class SizeResourcesSerializer(serializers.Serializer):
    cpus = serializers.FloatField()
    memory_gb = serializers.FloatField(help_text="GiB of RAM.")
    shm_gb = serializers.FloatField(help_text="GiB of /dev/shm (it counts against the RAM).")
    gpu_memory_gb = serializers.FloatField(allow_null=True, help_text="GiB of GPU memory; null when unknown.")
    varies = serializers.BooleanField(help_text="Some hosts give more than these figures.")
    text = serializers.CharField()


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
    resources = SizeResourcesSerializer(
        allow_null=True,
        help_text="What an instance of this size gets of its host (the smallest among the hosts in service "
        "that can take it); null when none can now.",
    )


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
    project = serializers.CharField(
        source="project.slug",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The project paying for it (its slug); null if you pay.",
    )
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
    deadline_at = serializers.DateTimeField(
        allow_null=True, help_text="When the portal stops it, as its launch asked (stop_after_seconds)."
    )
    session_ends_at = serializers.SerializerMethodField(
        help_text="When the limits will stop it: the end of its longest session (extensions included) or "
        "its deadline_at, whichever comes first; null when nothing will (or it is not running)."
    )
    extended_seconds = serializers.IntegerField(help_text="Time its owner added to the session (extend).")
    queue_position = serializers.SerializerMethodField(
        help_text="1-based place in the queue's fair-share order while queued; null otherwise."
    )
    queue_reason = serializers.SerializerMethodField(
        help_text="Why it is at that place: your GPU use in the fair-share window and your share, and why "
        "the launches ahead are; empty unless queued."
    )
    estimated_start_at = serializers.SerializerMethodField(
        help_text="When it will likely start while queued; null when not queued or nothing tells."
    )
    estimated_start_basis = serializers.SerializerMethodField(
        help_text="The estimate and its basis in words; empty unless queued."
    )

    def _queue(self, instance):
        # The four queue fields come from one reading of the queue per instance.
        cache = self.context.setdefault("queue_status", {})
        if instance.id not in cache:
            cache[instance.id] = instance_selectors.queue_status(instance)
        return cache[instance.id]

    def get_queue_position(self, instance) -> int | None:
        status = self._queue(instance)
        return status.position if status else None

    def get_queue_reason(self, instance) -> str:
        status = self._queue(instance)
        return status.reason if status else ""

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimated_start_at(self, instance):
        status = self._queue(instance)
        if status is None or status.estimated_start_at is None:
            return None
        return serializers.DateTimeField().to_representation(status.estimated_start_at)

    def get_estimated_start_basis(self, instance) -> str:
        status = self._queue(instance)
        return status.estimate_basis if status else ""

    @extend_schema_field(StepSerializer(many=True))
    def get_steps(self, instance):
        return instance_selectors.progress(instance)

    def get_stop_reason(self, instance) -> str:
        return instance_selectors.stop_reason_text(instance)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_session_ends_at(self, instance):
        if "launch_policy" not in self.context:
            self.context["launch_policy"] = LaunchPolicy.current()  # once per response, not per instance
        ends = sessions.stops_at(instance, self.context["launch_policy"])
        return serializers.DateTimeField().to_representation(ends) if ends else None

    def get_lab_url(self, instance) -> str:
        if instance.state != instance.State.RUNNING:
            return ""
        request = self.context.get("request")
        path = instance_selectors.lab_url(instance)
        return request.build_absolute_uri(path) if request is not None else path


class ExtendSerializer(serializers.Serializer):
    hours = serializers.IntegerField(
        min_value=1,
        help_text="Hours to add to the session; all extensions of one session together may "
        "add at most SESSION_MAX_EXTENSION_HOURS.",
    )


class InstanceListSerializer(serializers.Serializer):
    results = InstanceSerializer(many=True)


class LaunchSerializer(serializers.Serializer):
    size = text_input(help_text="A size key, e.g. 1x")
    image = text_input(help_text="An image key, e.g. pytorch")
    project = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        max_length=50,
        help_text="A project's slug (GET /api/v1/projects) to pay from its pool; omit or null to pay yourself.",
    )

    stop_after_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="Stop the instance this many seconds after the launch (60 to 604800), whatever becomes "
        "of the client: `devcloud run --timeout` sets it. Omitted: only the size's longest session applies.",
    )
    reservation = serializers.UUIDField(
        required=False,
        allow_null=True,
        default=None,
        help_text="One of your bookings whose window is open, to launch on its GPUs. Omitted: a launch "
        "inside an open booking's window (paid the same way) goes on it anyway.",
    )


# --- Reservations ----------------------------------------------------------------------------------


class ReservationSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    short_id = serializers.CharField()
    gpus = serializers.IntegerField(help_text="GPUs booked; 8 is a whole host.")
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    state = serializers.CharField(help_text="booked, settled (its window ended) or cancelled.")
    host = serializers.CharField(source="host.name")
    project = serializers.CharField(source="project.slug", allow_null=True, default=None)
    hold_gpu_seconds = serializers.IntegerField(help_text="GPU-seconds held from the payer while booked.")
    used_gpu_seconds = serializers.IntegerField(help_text="At settlement: what its instances used.")
    unused_charge_gpu_seconds = serializers.IntegerField(help_text="At settlement: the unused time's charge.")
    cancel_reason = serializers.CharField(help_text="An operator's reason, when one cancelled it.")
    created_at = serializers.DateTimeField()


class ReservationCreateSerializer(serializers.Serializer):
    gpus = serializers.IntegerField(help_text="1 to 8; 8 books a whole host.")
    starts_at = serializers.DateTimeField(help_text="ISO 8601; UTC when no offset is given.")
    ends_at = serializers.DateTimeField(help_text="ISO 8601; UTC when no offset is given.")
    project = serializers.CharField(
        required=False, allow_null=True, default=None, max_length=50,
        help_text="A project you own, to pay from its pool; omit or null to pay yourself.",
    )


class AvailabilitySerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    hours = serializers.FloatField()
    free_from = serializers.DateTimeField(
        allow_null=True,
        help_text="The earliest whole hour a window of that size can start; null: none ahead.",
    )


# --- Projects --------------------------------------------------------------------------------------


class ProjectLimitsSerializer(serializers.Serializer):
    max_live_instances = serializers.IntegerField(min_value=0)
    max_run_seconds = serializers.IntegerField(min_value=1, help_text="The longest one session may run.")
    allowed_sizes = serializers.ListField(child=serializers.CharField(max_length=10))
    member_monthly_cap_gpu_seconds = serializers.IntegerField(min_value=0, help_text="0: no cap.")
    entitled_8x = serializers.BooleanField(read_only=True, help_text="Set by the operators only.")


class ProjectSerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    repository_url = serializers.CharField()
    role = serializers.CharField(source="my_role", help_text="owner or member: your role in it.")
    balance_gpu_seconds = serializers.IntegerField(help_text="The shared pool's balance.")
    balance_gpu_hours = serializers.SerializerMethodField()

    def get_balance_gpu_hours(self, project) -> str:
        return gpu_hours(project.balance_gpu_seconds or 0)


class ProjectMemberSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    email = serializers.EmailField(source="user.email")
    role = serializers.CharField()
    joined_at = serializers.DateTimeField(source="created_at")


class ProjectDetailSerializer(ProjectSerializer):
    limits = ProjectLimitsSerializer(source="*")
    members = ProjectMemberSerializer(
        many=True, allow_null=True, help_text="Everyone in the project; null unless you are an owner."
    )
    live_instances = serializers.IntegerField()


class ProjectInvitationSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    email = serializers.EmailField(help_text="Who is invited: they accept signed in with this address.")
    role = serializers.ChoiceField(choices=["member", "owner"], default="member")
    created_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True)


class ProjectRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["member", "owner"])


class RobotTokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    scope = serializers.CharField()
    max_live_instances = serializers.IntegerField(help_text="Its own limit; 0: the project's only.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    from_ci_signin = serializers.SerializerMethodField()

    def get_from_ci_signin(self, token) -> bool:
        return bool(token.oidc_jti)


class RobotTokenCreateSerializer(serializers.Serializer):
    name = text_input(help_text="What uses it, e.g. nightly GPU tests")
    scope = serializers.ChoiceField(choices=["read", "launch"], default="launch")
    days = serializers.IntegerField(default=30)
    max_live_instances = serializers.IntegerField(default=0, min_value=0)


class RobotTokenCreatedSerializer(RobotTokenSerializer):
    token = serializers.CharField(help_text="The token itself, shown this once.")


class TrustedPublisherSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    provider = serializers.CharField(help_text="A CI provider this portal knows (GET /api/v1/oidc).")
    repository = serializers.CharField(help_text="owner/name")
    ref = serializers.CharField(required=False, allow_blank=True, default="")
    workflow = serializers.CharField(required=False, allow_blank=True, default="")
    environment = serializers.CharField(required=False, allow_blank=True, default="")
    created_at = serializers.DateTimeField(read_only=True)


class OidcSettingsSerializer(serializers.Serializer):
    audience = serializers.CharField(help_text="The audience to ask the CI provider's token for.")
    providers = serializers.DictField(child=serializers.CharField(), help_text="name: issuer URL")


class CiSigninSerializer(serializers.Serializer):
    project = serializers.CharField(max_length=50)
    token = serializers.CharField(help_text="The CI run's OpenID Connect token (a JWT).", max_length=20000)


class CiSigninAnswerSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="A DevCloud API token for the project, with the launch scope.")
    expires_at = serializers.DateTimeField()
    project = serializers.CharField()


class CIGrantApplyRequestSerializer(serializers.Serializer):
    repository_url = text_input(help_text="The repository's https:// URL.")
    maintainers = text_input(help_text="GitHub logins or email addresses of the maintainers.")
    purpose = text_input(help_text="What the GPUs are for.")


class CIGrantApplicationSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["pending", "approved", "rejected"])
    repository_url = serializers.CharField()
    maintainers = serializers.CharField()
    purpose = serializers.CharField()
    created_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True)
    decision_reason = serializers.CharField(help_text="Why it was rejected, or the operators' note.")
    monthly_gpu_hours = serializers.SerializerMethodField()

    def get_monthly_gpu_hours(self, application) -> str | None:
        if application.status != "approved":
            return None
        return gpu_hours(application.granted_gpu_seconds)


class CIGrantUseSerializer(serializers.Serializer):
    period = serializers.CharField(help_text="The grant's period, named by the month it starts in.")
    monthly_gpu_hours = serializers.CharField(help_text="0.00 once the operators ended the grant.")
    granted_gpu_hours = serializers.CharField()
    used_gpu_hours = serializers.CharField()
    left_gpu_hours = serializers.CharField()
    renews_at = serializers.DateTimeField(help_text="When this period ends and the next grant is posted.")
    renews = serializers.BooleanField(help_text="False once the operators ended the grant.")


class CIGrantStateSerializer(serializers.Serializer):
    application = CIGrantApplicationSerializer(allow_null=True, help_text="The latest application, if any.")
    grant = CIGrantUseSerializer(allow_null=True, help_text="The grant on the pool now, if any.")


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
    expires_at = serializers.DateTimeField(
        allow_null=True, help_text="When it stops being trusted and is removed; null: never."
    )


class SshKeyCreateSerializer(serializers.Serializer):
    name = text_input(help_text="e.g. laptop")
    public_key = text_input(
        help_text="One OpenSSH public key line, e.g. the contents of ~/.ssh/id_ed25519.pub"
    )
    expires_in_minutes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=SSH_KEY_MAX_MINUTES,
        help_text="Trust it only this long (at most a week), then remove it; for a key made for one job.",
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


class ExposedPortSerializer(serializers.Serializer):
    port = serializers.IntegerField()
    url = serializers.SerializerMethodField(help_text="Where the port is served, on its own host name.")
    created_at = serializers.DateTimeField()
    last_traffic_at = serializers.DateTimeField(allow_null=True)

    def get_url(self, exposed) -> str:
        from portal.ports.addresses import port_url

        return port_url(exposed.host_label)


class ExposeSerializer(serializers.Serializer):
    port = serializers.IntegerField(
        help_text="The port your app listens on inside the instance: 1024 to 65535, not 8888 or 2222."
    )


class ShareLinkSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    prefix = serializers.CharField(help_text="The first characters of the link's secret.")
    email = serializers.SerializerMethodField(help_text="Who may use it; null: anyone with the link.")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    active = serializers.SerializerMethodField()

    def get_email(self, link) -> str | None:
        return link.user.email if link.user_id else None

    def get_active(self, link) -> bool:
        return link.active()


class ShareLinkCreatedSerializer(ShareLinkSerializer):
    url = serializers.CharField(help_text="The link, shown this once: only a digest of its secret is kept.")


class ShareCreateSerializer(serializers.Serializer):
    hours = serializers.IntegerField(
        required=False, default=24, help_text="How long it works: 1 to 720 hours."
    )
    email = serializers.EmailField(
        required=False,
        default="",
        allow_blank=True,
        help_text="Only this DevCloud account may use it; empty: anyone.",
    )
