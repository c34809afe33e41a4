"""The /api/v1/ endpoints. Each one looks up the caller's own object, calls the service the page calls,
and answers JSON; errors become problem details in problems.py.

Every object is looked up through its owner (request.user), so another person's instance, key or
application is a 404, exactly like one that does not exist.
"""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from portal.accounts import selectors as account_selectors
from portal.accounts import services as account_services
from portal.accounts.forms import SshKeyForm
from portal.accounts.models import SshKey
from portal.credits import selectors as credit_selectors
from portal.credits import services as credit_services
from portal.credits.forms import BonusApplyForm
from portal.instances import reservations
from portal.instances import selectors as instance_selectors
from portal.instances import services as instance_services
from portal.instances.forms import LaunchForm
from portal.lib import oidc
from portal.ports import selectors as port_selectors
from portal.ports import services as port_services
from portal.ports.addresses import share_url
from portal.projects import ci_grants, trust
from portal.projects import selectors as project_selectors
from portal.projects import services as project_services

from . import problems, robots, selectors, services
from .models import ApiToken
from .serializers import (
    AvailabilitySerializer,
    BonusApplicationSerializer,
    BonusApplyRequestSerializer,
    BonusProgramSerializer,
    CIGrantApplyRequestSerializer,
    CIGrantStateSerializer,
    CiSigninAnswerSerializer,
    CiSigninSerializer,
    ExposedPortSerializer,
    ExposeSerializer,
    ExtendSerializer,
    ImageSerializer,
    InstanceSerializer,
    LaunchSerializer,
    LedgerEntrySerializer,
    LogsSerializer,
    MeSerializer,
    OidcSettingsSerializer,
    ProblemSerializer,
    ProjectDetailSerializer,
    ProjectInvitationSerializer,
    ProjectLimitsSerializer,
    ProjectMemberSerializer,
    ProjectRoleSerializer,
    ProjectSerializer,
    ReservationCreateSerializer,
    ReservationSerializer,
    RobotTokenCreatedSerializer,
    RobotTokenCreateSerializer,
    RobotTokenSerializer,
    ShareCreateSerializer,
    ShareLinkCreatedSerializer,
    ShareLinkSerializer,
    SizeSerializer,
    SshAccessSerializer,
    SshKeyCreateSerializer,
    SshKeySerializer,
    TrustedPublisherSerializer,
)

IDEMPOTENCY_HEADER = "Idempotency-Key"


def _problems(*statuses: int) -> dict:
    """Schema responses for the problem statuses an endpoint can answer (401 and 429 always)."""
    return {
        (status, problems.CONTENT_TYPE): OpenApiResponse(
            ProblemSerializer, description="A problem (RFC 9457)."
        )
        for status in sorted({401, 429, *statuses})
    }


def _responses(ok: dict, *statuses: int) -> dict:
    return {**ok, **_problems(*statuses)}


def _valid(form) -> dict:
    """The form's cleaned data; raises ValidationError with the form's own messages (the page's)."""
    if not form.is_valid():
        raise ValidationError(form.errors.as_data())
    return form.cleaned_data


def _token(request) -> ApiToken | None:
    """The API token the request came with; None for a browser session."""
    return request.auth if isinstance(request.auth, ApiToken) else None


def _body(serializer_class, request) -> dict:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- Account ---------------------------------------------------------------------------------------


@extend_schema(operation_id="me", responses=_responses({200: MeSerializer}), tags=["account"])
@api_view(["GET"])
def me(request):
    """Who you are: balance, the sizes you may launch (entitlements), limits, and how to reach SSH."""
    token = request.auth if isinstance(request.auth, ApiToken) else None
    return Response(MeSerializer(selectors.account_summary(request.user, token=token)).data)


@extend_schema(operation_id="ssh", responses=_responses({200: SshAccessSerializer}), tags=["account"])
@api_view(["GET"])
def ssh(request):
    """Where `ssh -J` reaches the portal's SSH gateway, its host key to pin (known_hosts lines and
    fingerprint), and the user inside an instance."""
    return Response(SshAccessSerializer(selectors.ssh_access()).data)


class LedgerPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


@extend_schema(tags=["credits"], responses=_responses({}, 404))
class LedgerView(generics.ListAPIView):
    """Your credit ledger, newest first, 50 entries a page (?page=2, ?page_size=200 at most)."""

    serializer_class = LedgerEntrySerializer
    pagination_class = LedgerPagination

    def get_queryset(self):
        return selectors.ledger_of(self.request.user)

    @extend_schema(operation_id="ledger", responses=_responses({200: LedgerEntrySerializer(many=True)}, 404))
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


# --- Catalogue -------------------------------------------------------------------------------------


@extend_schema(
    operation_id="sizes", responses=_responses({200: SizeSerializer(many=True)}), tags=["catalogue"]
)
@api_view(["GET"])
def sizes(request):
    """The sizes, with whether you can launch each now and, if not, why."""
    options = instance_selectors.launch_options(request.user)
    # A refusal of the account as a whole (suspended, unconfirmed, at the live limit) applies to every size.
    whole_account = options.suspension or not options.verified or options.live_count >= options.live_limit
    account_refusal = options.refusal if whole_account else ""
    rows = [
        {
            "key": option.size.key,
            "name": option.size.name,
            "gpus": option.size.gpus,
            "hbm_gb": option.size.hbm_gb,
            "description": option.size.description,
            "gpu_hours_per_hour": option.size.gpu_hours_per_hour,
            "can_launch": option.can_launch and not account_refusal,
            "refusal": account_refusal or option.refusal,
            "session_limit": option.session_limit,
            "resources": option.resources,
        }
        for option in options.sizes
    ]
    return Response(SizeSerializer(rows, many=True).data)


@extend_schema(
    operation_id="images", responses=_responses({200: ImageSerializer(many=True)}), tags=["catalogue"]
)
@api_view(["GET"])
def images(request):
    """The images you can launch, with whether a GPU host has each one ready."""
    return Response(ImageSerializer(instance_selectors.images_with_availability(), many=True).data)


# --- Instances -------------------------------------------------------------------------------------

_IDEMPOTENCY_PARAMETER = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="Any unique string (a UUID) of at most 200 characters. A retried request with the same key "
    "and body launches once and returns the first launch's instance (200, Idempotent-Replayed: true).",
)


@extend_schema(
    methods=["GET"],
    operation_id="instances_list",
    responses=_responses({200: InstanceSerializer(many=True)}),
    tags=["instances"],
)
@extend_schema(
    methods=["POST"],
    operation_id="instances_launch",
    request=LaunchSerializer,
    parameters=[_IDEMPOTENCY_PARAMETER],
    responses=_responses(
        {201: InstanceSerializer, 200: InstanceSerializer}, 400, 402, 403, 404, 409, 415, 422, 503
    ),
    tags=["instances"],
)
@api_view(["GET", "POST"])
def instances(request):
    """GET: your live instances, then your latest ended ones. POST: launch one (queued; poll it), paid by
    you or, with "project", from that project's pool (404 if you are not in it)."""
    if request.method == "GET":
        rows = instance_selectors.instances_of(request.user)
        return Response(InstanceSerializer(rows, many=True, context={"request": request}).data)
    key = request.headers.get(IDEMPOTENCY_HEADER, "")
    if len(key) > services.IDEMPOTENCY_KEY_MAX_LENGTH or not key.isprintable():
        raise serializers.ValidationError(
            {
                IDEMPOTENCY_HEADER: [
                    f"Use a key of at most {services.IDEMPOTENCY_KEY_MAX_LENGTH} printable characters."
                ]
            }
        )
    body = _body(LaunchSerializer, request)
    launch = _valid(LaunchForm(body))
    instance, replayed = services.instance_launch_once(
        user=request.user,
        size=launch["size"],
        image_key=launch["image"],
        idempotency_key=key,
        project=robots.launch_project(_token(request), body["project"] or None),
        stop_after_seconds=launch.get("stop_after_seconds"),
        token=_token(request),
        reservation=body.get("reservation"),
    )
    data = InstanceSerializer(instance, context={"request": request}).data
    if replayed:
        return Response(data, status=200, headers={"Idempotent-Replayed": "true"})
    return Response(data, status=201)


@extend_schema(
    operation_id="instances_get", responses=_responses({200: InstanceSerializer}, 404), tags=["instances"]
)
@api_view(["GET"])
def instance_detail(request, instance_id):
    """One of your instances: state, launch steps, and the JupyterLab link once it runs."""
    instance = instance_selectors.instance_of_owner(request.user, instance_id)
    return Response(InstanceSerializer(instance, context={"request": request}).data)


@extend_schema(
    operation_id="instances_stop",
    request=None,
    responses=_responses({202: InstanceSerializer}, 403, 404, 409),
    tags=["instances"],
)
@api_view(["POST"])
def instance_stop(request, instance_id):
    """Stop one of your instances. Billing stops at once; /workspace is kept."""
    try:
        instance = instance_services.instance_stop(user=request.user, instance_id=instance_id)
    except ValidationError as error:
        return problems.problem(409, "instance-ended", "This instance has ended", " ".join(error.messages))
    return Response(InstanceSerializer(instance, context={"request": request}).data, status=202)


@extend_schema(
    operation_id="instances_extend",
    request=ExtendSerializer,
    responses=_responses({200: InstanceSerializer}, 400, 402, 403, 404, 409),
    tags=["instances"],
)
@api_view(["POST"])
def instance_extend(request, instance_id):
    """Add hours to your running instance's session, so its time limit stops it later ({"hours": N}).
    402 when your credit (or the project's pool) cannot cover them, 409 past the ceiling or once it ended."""
    body = ExtendSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    instance = instance_services.instance_extend(
        user=request.user, instance_id=instance_id, hours=body.validated_data["hours"]
    )
    return Response(InstanceSerializer(instance, context={"request": request}).data)


# --- Exposed ports ---------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    operation_id="ports_list",
    responses=_responses({200: ExposedPortSerializer(many=True)}, 404),
    tags=["ports"],
)
@extend_schema(
    methods=["POST"],
    operation_id="ports_expose",
    request=ExposeSerializer,
    responses=_responses({201: ExposedPortSerializer}, 400, 403, 404, 409),
    tags=["ports"],
)
@api_view(["GET", "POST"])
def instance_ports(request, instance_id):
    """GET: your instance's exposed ports. POST: expose a port ({"port": 8000}) at its own address, for you
    alone until you share it; exposing an open port again answers it as it is."""
    instance = instance_selectors.instance_of_owner(request.user, instance_id)
    if request.method == "GET":
        return Response(ExposedPortSerializer(port_selectors.open_ports_of(instance), many=True).data)
    body = _body(ExposeSerializer, request)
    exposed = port_services.port_expose(user=request.user, instance_id=instance.id, port=body["port"])
    return Response(ExposedPortSerializer(exposed).data, status=201)


@extend_schema(operation_id="ports_close", responses=_responses({204: None}, 403, 404), tags=["ports"])
@api_view(["DELETE"])
def instance_port_close(request, instance_id, port):
    """Close an exposed port: the next request to it is refused, through its share links too."""
    port_services.port_close(user=request.user, instance_id=instance_id, port=port)
    return Response(status=204)


@extend_schema(
    methods=["GET"],
    operation_id="ports_shares_list",
    responses=_responses({200: ShareLinkSerializer(many=True)}, 404),
    tags=["ports"],
)
@extend_schema(
    methods=["POST"],
    operation_id="ports_shares_create",
    request=ShareCreateSerializer,
    responses=_responses({201: ShareLinkCreatedSerializer}, 400, 403, 404),
    tags=["ports"],
)
@api_view(["GET", "POST"])
def instance_port_shares(request, instance_id, port):
    """GET: the share links of an exposed port. POST: make one ({"hours": 24, "email": ""}) for anyone
    holding it, or only for the account with that email. Its URL is in this answer only."""
    instance = instance_selectors.instance_of_owner(request.user, instance_id)
    exposed = port_selectors.open_port_of(instance, port)
    if request.method == "GET":
        return Response(ShareLinkSerializer(port_selectors.share_links_of(exposed), many=True).data)
    body = _body(ShareCreateSerializer, request)
    link, secret = port_services.share_create(
        user=request.user, instance_id=instance.id, port=port, hours=body["hours"], email=body["email"]
    )
    answer = {**ShareLinkSerializer(link).data, "url": share_url(exposed.host_label, secret)}
    return Response(answer, status=201)


@extend_schema(
    operation_id="ports_shares_revoke", responses=_responses({204: None}, 403, 404), tags=["ports"]
)
@api_view(["DELETE"])
def instance_port_share_revoke(request, instance_id, port, share_id):
    """Revoke a share link: the next request through it is refused."""
    instance = instance_selectors.instance_of_owner(request.user, instance_id)
    port_selectors.open_port_of(instance, port)
    port_services.share_revoke(user=request.user, instance_id=instance.id, share_id=share_id)
    return Response(status=204)


# --- Reservations ------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    operation_id="reservations_list",
    responses=_responses({200: ReservationSerializer(many=True)}),
    tags=["reservations"],
)
@extend_schema(
    methods=["POST"],
    operation_id="reservations_book",
    request=ReservationCreateSerializer,
    responses=_responses({201: ReservationSerializer}, 400, 402, 403, 404, 409),
    tags=["reservations"],
)
@api_view(["GET", "POST"])
def reservations_view(request):
    """GET: your standing bookings, soonest first, then your latest ended or cancelled ones. POST: book
    GPUs of one host (8: a whole host) for a window; its credit is held until the window ends. 402 without
    the credit, 409 when no host is free for the window or over your weekly hours, 400 for a bad window."""
    if request.method == "GET":
        rows = reservations.reservations_of(request.user)
        return Response(ReservationSerializer(rows, many=True).data)
    body = _body(ReservationCreateSerializer, request)
    booked = reservations.reservation_book(
        user=request.user,
        gpus=body["gpus"],
        starts_at=body["starts_at"],
        ends_at=body["ends_at"],
        project=body["project"] or None,
    )
    return Response(ReservationSerializer(booked).data, status=201)


class _AvailabilityQuery(serializers.Serializer):
    gpus = serializers.IntegerField(min_value=1, max_value=8, default=8)
    hours = serializers.FloatField(min_value=0.25, default=1, help_text="At most RESERVATION_MAX_HOURS.")

    def validate_hours(self, value):
        if value > settings.RESERVATION_MAX_HOURS:
            raise serializers.ValidationError(
                f"A booking lasts at most {settings.RESERVATION_MAX_HOURS} hours."
            )
        return value


@extend_schema(
    operation_id="reservations_availability",
    parameters=[_AvailabilityQuery],
    responses=_responses({200: AvailabilitySerializer}, 400),
    tags=["reservations"],
)
@api_view(["GET"])
def reservations_availability(request):
    """When a window of ?hours=H on ?gpus=N GPUs (8: a whole host) can start: the earliest whole hour."""
    query = _AvailabilityQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    gpus, length = query.validated_data["gpus"], query.validated_data["hours"]
    now = timezone.now()
    free_from = reservations.next_free_start(gpus=gpus, duration=timedelta(hours=length), after=now, now=now)
    return Response(AvailabilitySerializer({"gpus": gpus, "hours": length, "free_from": free_from}).data)


@extend_schema(
    methods=["GET"],
    operation_id="reservations_get",
    responses=_responses({200: ReservationSerializer}, 404),
    tags=["reservations"],
)
@extend_schema(
    methods=["DELETE"],
    operation_id="reservations_cancel",
    responses=_responses({200: ReservationSerializer}, 403, 404, 409),
    tags=["reservations"],
)
@api_view(["GET", "DELETE"])
def reservation_detail(request, reservation_id):
    """GET: one of your bookings. DELETE: cancel it before its window opens (the hold goes, nothing is
    charged); 409 once the window opened or it ended."""
    if request.method == "GET":
        booking = reservations.reservation_of_owner(request.user, reservation_id)
        return Response(ReservationSerializer(booking).data)
    cancelled = reservations.reservation_cancel(user=request.user, reservation_id=reservation_id)
    return Response(ReservationSerializer(cancelled).data)


class _LogQuery(serializers.Serializer):
    lines = serializers.IntegerField(
        required=False, default=100, min_value=1, max_value=selectors.MAX_LOG_LINES
    )


@extend_schema(
    operation_id="instances_logs",
    parameters=[_LogQuery],
    responses=_responses({200: LogsSerializer}, 400, 404),
    tags=["instances"],
)
@api_view(["GET"])
def instance_logs(request, instance_id):
    """The last lines your instance printed (?lines=100, at most 1000), with its secret token hidden."""
    query = _LogQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    instance = instance_selectors.instance_of_owner(request.user, instance_id)
    lines, note = selectors.instance_log_lines(instance, lines=query.validated_data["lines"])
    return Response(LogsSerializer({"lines": lines, "note": note}).data)


# --- Projects --------------------------------------------------------------------------------------


@extend_schema(
    operation_id="projects_list", responses=_responses({200: ProjectSerializer(many=True)}), tags=["projects"]
)
@api_view(["GET"])
def projects(request):
    """The projects you are in, with your role and each shared pool's balance."""
    return Response(ProjectSerializer(project_selectors.projects_of(request.user), many=True).data)


def _project_detail(project) -> dict:
    owner = project_selectors.is_owner(project)
    project.balance_gpu_seconds = project.pool.balance_gpu_seconds if project.pool else 0
    project.members = project_selectors.members_of(project) if owner else None
    project.live_instances = len(project_selectors.live_instances_of(project))
    return ProjectDetailSerializer(project).data


@extend_schema(
    methods=["GET"],
    operation_id="projects_get",
    responses=_responses({200: ProjectDetailSerializer}, 404),
    tags=["projects"],
)
@extend_schema(
    methods=["PATCH"],
    operation_id="projects_limits",
    request=ProjectLimitsSerializer(partial=True),
    responses=_responses({200: ProjectDetailSerializer}, 400, 403, 404, 415),
    tags=["projects"],
)
@api_view(["GET", "PATCH"])
def project_detail(request, slug):
    """GET: one of your projects: the pool's balance, its limits, your role, and (owners only) its members.
    PATCH: an owner changes its limits (any of them; the others stay)."""
    project = project_selectors.project_of_member(request.user, slug)
    if request.method == "PATCH":
        if not isinstance(request.data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Send a JSON object of the limits to change."]}
            )
        current = ProjectLimitsSerializer(project).data
        limits = ProjectLimitsSerializer(data={**current, **request.data})
        limits.is_valid(raise_exception=True)
        changes = {key: value for key, value in limits.validated_data.items() if key != "entitled_8x"}
        project_services.project_limits_update(user=request.user, project=project, **changes)
        project = project_selectors.project_of_member(request.user, slug)
    return Response(_project_detail(project))


@extend_schema(
    methods=["GET"],
    operation_id="projects_invitations_list",
    responses=_responses({200: ProjectInvitationSerializer(many=True)}, 403, 404),
    tags=["projects"],
)
@extend_schema(
    methods=["POST"],
    operation_id="projects_invite",
    request=ProjectInvitationSerializer,
    responses=_responses({201: ProjectInvitationSerializer}, 400, 403, 404, 415),
    tags=["projects"],
)
@api_view(["GET", "POST"])
def project_invitations(request, slug):
    """Owners only. GET: the open invitations. POST: invite an email address as a member or an owner;
    the invitation goes out by email and is accepted by its invitee, signed in with that address."""
    project = project_selectors.project_of_member(request.user, slug)
    if request.method == "GET":
        if not project_selectors.is_owner(project):
            raise PermissionDenied("Only an owner of the project may see its invitations.")
        return Response(
            ProjectInvitationSerializer(project_selectors.pending_invitations(project), many=True).data
        )
    body = _body(ProjectInvitationSerializer, request)
    invitation = project_services.project_invite(user=request.user, project=project, **body)
    return Response(ProjectInvitationSerializer(invitation).data, status=201)


@extend_schema(
    operation_id="projects_invitation_revoke",
    request=None,
    responses=_responses({204: None}, 403, 404),
    tags=["projects"],
)
@api_view(["DELETE"])
def project_invitation_revoke(request, slug, invitation_id):
    """Owners only: withdraw an open invitation; its link stops working at once."""
    project = project_selectors.project_of_member(request.user, slug)
    project_services.invitation_revoke(user=request.user, project=project, invitation_id=invitation_id)
    return Response(status=204)


@extend_schema(
    methods=["PATCH"],
    operation_id="projects_member_role",
    request=ProjectRoleSerializer,
    responses=_responses({200: ProjectMemberSerializer}, 400, 403, 404, 415),
    tags=["projects"],
)
@extend_schema(
    methods=["DELETE"],
    operation_id="projects_member_remove",
    request=None,
    responses=_responses({204: None}, 400, 403, 404),
    tags=["projects"],
)
@api_view(["PATCH", "DELETE"])
def project_member(request, slug, user_id):
    """PATCH: an owner makes a member an owner, or an owner a member. DELETE: an owner removes a member,
    or a member leaves (their own id). The project instances the member launched stop at once; their
    own instances are left alone. A project always keeps an owner."""
    project = project_selectors.project_of_member(request.user, slug)
    if request.method == "PATCH":
        body = _body(ProjectRoleSerializer, request)
        membership = project_services.member_role_change(
            user=request.user, project=project, member_id=user_id, role=body["role"]
        )
        return Response(ProjectMemberSerializer(membership).data)
    project_services.member_remove(user=request.user, project=project, member_id=user_id)
    return Response(status=204)


# --- Robot tokens and keyless CI sign-in -----------------------------------------------------------


@extend_schema(
    methods=["GET"],
    operation_id="projects_tokens_list",
    responses=_responses({200: RobotTokenSerializer(many=True)}, 403, 404),
    tags=["projects"],
)
@extend_schema(
    methods=["POST"],
    operation_id="projects_tokens_create",
    request=RobotTokenCreateSerializer,
    responses=_responses({201: RobotTokenCreatedSerializer}, 400, 403, 404, 415),
    tags=["projects"],
)
@api_view(["GET", "POST"])
def project_tokens(request, slug):
    """Owners only. GET: the project's robot tokens and CI sign-in tokens. POST: a new robot token, which
    belongs to the project and launches only for it; its text is in the answer, this once."""
    if request.method == "GET":
        rows = robots.robot_tokens_of(user=request.user, slug=slug)
        return Response(RobotTokenSerializer(rows, many=True).data)
    body = _body(RobotTokenCreateSerializer, request)
    token, text = robots.robot_token_create(user=request.user, slug=slug, **body)
    token.token = text
    return Response(RobotTokenCreatedSerializer(token).data, status=201)


@extend_schema(
    operation_id="projects_tokens_revoke",
    request=None,
    responses=_responses({204: None}, 403, 404),
    tags=["projects"],
)
@api_view(["DELETE"])
def project_token_revoke(request, slug, token_id):
    """Owners only: revoke one of the project's tokens; it stops working at once."""
    robots.robot_token_revoke(user=request.user, slug=slug, token_id=token_id)
    return Response(status=204)


@extend_schema(
    methods=["GET"],
    operation_id="projects_trust_list",
    responses=_responses({200: TrustedPublisherSerializer(many=True)}, 403, 404),
    tags=["projects"],
)
@extend_schema(
    methods=["POST"],
    operation_id="projects_trust_add",
    request=TrustedPublisherSerializer,
    responses=_responses({201: TrustedPublisherSerializer}, 400, 403, 404, 415),
    tags=["projects"],
)
@api_view(["GET", "POST"])
def project_trust(request, slug):
    """Owners only. GET: the CI workflows the project trusts to sign in without a secret. POST: trust
    one more (a provider from GET /api/v1/oidc, a repository, and optionally a ref, workflow and
    environment)."""
    if request.method == "GET":
        rows = trust.trusted_publishers_of(user=request.user, slug=slug)
        return Response(TrustedPublisherSerializer(rows, many=True).data)
    body = _body(TrustedPublisherSerializer, request)
    publisher = trust.trusted_publisher_add(user=request.user, slug=slug, **body)
    return Response(TrustedPublisherSerializer(publisher).data, status=201)


@extend_schema(
    operation_id="projects_trust_remove",
    request=None,
    responses=_responses({204: None}, 403, 404),
    tags=["projects"],
)
@api_view(["DELETE"])
def project_trust_remove(request, slug, publisher_id):
    """Owners only: stop trusting one CI workflow."""
    trust.trusted_publisher_remove(user=request.user, slug=slug, publisher_id=publisher_id)
    return Response(status=204)


# --- The open-source CI programme -------------------------------------------------------------------


def _ci_grant_state(project) -> dict:
    grant = project_selectors.ci_grant_use(project)
    return CIGrantStateSerializer(
        {
            "application": project_selectors.ci_grant_application_of(project),
            "grant": grant
            and {
                "period": grant.period,
                "monthly_gpu_hours": grant.monthly_hours,
                "granted_gpu_hours": grant.granted_hours,
                "used_gpu_hours": grant.used_hours,
                "left_gpu_hours": grant.left_hours,
                "renews_at": grant.renews_at,
                "renews": grant.renews,
            },
        }
    ).data


@extend_schema(
    methods=["GET"],
    operation_id="projects_ci_grant_get",
    responses=_responses({200: CIGrantStateSerializer}, 403, 404),
    tags=["projects"],
)
@extend_schema(
    methods=["POST"],
    operation_id="projects_ci_grant_apply",
    request=CIGrantApplyRequestSerializer,
    responses=_responses({201: CIGrantStateSerializer}, 400, 403, 404, 409, 415),
    tags=["projects"],
)
@api_view(["GET", "POST"])
def project_ci_grant(request, slug):
    """Owners only. GET: the project's latest application for the open-source CI programme and the
    grant on its pool now. POST: apply (one open application at a time; 409 while one is pending or the
    project is already in the programme)."""
    project = project_selectors.project_of_member(request.user, slug)
    if request.method == "GET":
        if not project_selectors.is_owner(project):
            raise PermissionDenied("Only an owner of the project may see its CI programme application.")
        return Response(_ci_grant_state(project))
    body = _body(CIGrantApplyRequestSerializer, request)
    ci_grants.ci_grant_apply(user=request.user, project=project, **body)
    return Response(_ci_grant_state(project), status=201)


@extend_schema(operation_id="oidc_settings", responses={200: OidcSettingsSerializer}, tags=["ci sign-in"])
@api_view(["GET"])
@permission_classes([AllowAny])
def oidc_settings(request):
    """What a CI job needs to sign in without a secret: the audience to ask its CI provider's token for,
    and the providers this portal trusts."""
    return Response({"audience": settings.OIDC_AUDIENCE, "providers": settings.OIDC_PROVIDERS})


@extend_schema(
    operation_id="oidc_token",
    request=CiSigninSerializer,
    responses=_responses({201: CiSigninAnswerSerializer}, 400, 403, 415),
    tags=["ci sign-in"],
)
@api_view(["POST"])
@permission_classes([AllowAny])
def oidc_token(request):
    """Keyless CI sign-in: trade a CI run's OpenID Connect token for a short-lived DevCloud token of the
    project, if the project trusts that repository (and ref, workflow, environment). 403 with the reason
    otherwise."""
    body = _body(CiSigninSerializer, request)
    try:
        token, text = robots.ci_signin(slug=body["project"], id_token=body["token"])
    except oidc.OidcRefused as refused:
        return problems.problem(403, "ci-signin-refused", "CI sign-in refused", str(refused))
    return Response(
        CiSigninAnswerSerializer(
            {"token": text, "expires_at": token.expires_at, "project": token.project.slug}
        ).data,
        status=201,
    )


# --- SSH keys --------------------------------------------------------------------------------------


@extend_schema(
    methods=["GET"],
    operation_id="ssh_keys_list",
    responses=_responses({200: SshKeySerializer(many=True)}),
    tags=["ssh keys"],
)
@extend_schema(
    methods=["POST"],
    operation_id="ssh_keys_add",
    request=SshKeyCreateSerializer,
    responses=_responses({201: SshKeySerializer}, 400, 403, 415),
    tags=["ssh keys"],
)
@api_view(["GET", "POST"])
def ssh_keys(request):
    """GET: your SSH public keys. POST: add one (the Settings page's checks and messages)."""
    if request.method == "GET":
        return Response(SshKeySerializer(account_selectors.ssh_keys_for(request.user), many=True).data)
    body = _body(SshKeyCreateSerializer, request)
    minutes = body.pop("expires_in_minutes", None)
    cleaned = _valid(SshKeyForm(body))
    token = request.auth if isinstance(request.auth, ApiToken) else None
    origin = (
        account_services.origin_of_token(token.prefix)
        if token is not None
        else account_services.origin_of_session(request.session)
    )
    key = account_services.sshkey_add(
        user=request.user,
        name=cleaned["name"],
        public_key=cleaned["public_key"],
        added_from=origin,
        expires_at=timezone.now() + timedelta(minutes=minutes) if minutes else None,
    )
    return Response(SshKeySerializer(key).data, status=201)


@extend_schema(operation_id="ssh_keys_delete", responses=_responses({204: None}, 403, 404), tags=["ssh keys"])
@api_view(["DELETE"])
def ssh_key_delete(request, key_id):
    """Remove one of your SSH keys; the next SSH connection with it is refused."""
    key = get_object_or_404(SshKey, pk=key_id, user=request.user)
    account_services.sshkey_delete(key=key)
    return Response(status=204)


# --- Bonus applications ----------------------------------------------------------------------------


@extend_schema(
    operation_id="bonus_programs",
    responses=_responses({200: BonusProgramSerializer(many=True)}),
    tags=["credits"],
)
@api_view(["GET"])
def bonus_programs(request):
    """The bonus programs taking applications now."""
    return Response(BonusProgramSerializer(credit_selectors.open_programs(), many=True).data)


@extend_schema(
    methods=["GET"],
    operation_id="bonus_applications_list",
    responses=_responses({200: BonusApplicationSerializer(many=True)}),
    tags=["credits"],
)
@extend_schema(
    methods=["POST"],
    operation_id="bonus_applications_apply",
    request=BonusApplyRequestSerializer,
    responses=_responses({201: BonusApplicationSerializer}, 400, 403, 415),
    tags=["credits"],
)
@api_view(["GET", "POST"])
def bonus_applications(request):
    """GET: your bonus applications. POST: apply (the page's rules, including its rate limits)."""
    if request.method == "GET":
        rows = credit_selectors.applications_for(request.user).order_by("-created_at", "-id")
        return Response(BonusApplicationSerializer(rows, many=True).data)
    body = _body(BonusApplyRequestSerializer, request)
    programs = credit_selectors.open_programs()
    program = programs.filter(slug=body["program"]).first() if body["program"] else None
    # The form takes the program's primary key; an unknown slug gets the form's own "not taking
    # applications" message (a key no row has), and a missing one its "required" message.
    choice = program.pk if program else ("-1" if body["program"] else "")
    cleaned = _valid(BonusApplyForm({"program": choice, "evidence": body["evidence"]}, programs=programs))
    application = credit_services.bonus_apply(
        user=request.user, program=cleaned["program"], evidence=cleaned["evidence"]
    )
    return Response(BonusApplicationSerializer(application).data, status=201)


@extend_schema(exclude=True)
@api_view(["GET", "POST", "PUT", "PATCH", "DELETE"])
@permission_classes([AllowAny])
def not_found(request, *args, **kwargs):
    """Any other path under /api/: a problem, not the portal's HTML 404 page."""
    return problems.problem(404, "not-found", "Not found", "There is no such API endpoint. See /api/docs/.")
