"""The /api/v1/ endpoints. Each one looks up the caller's own object, calls the service the page calls,
and answers JSON; errors become problem details in problems.py.

Every object is looked up through its owner (request.user), so another person's instance, key or
application is a 404, exactly like one that does not exist.
"""

from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
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
from portal.instances import selectors as instance_selectors
from portal.instances import services as instance_services
from portal.instances.forms import LaunchForm

from . import problems, selectors, services
from .models import ApiToken
from .serializers import (
    BonusApplicationSerializer,
    BonusApplyRequestSerializer,
    BonusProgramSerializer,
    ImageSerializer,
    InstanceSerializer,
    LaunchSerializer,
    LedgerEntrySerializer,
    LogsSerializer,
    MeSerializer,
    ProblemSerializer,
    SizeSerializer,
    SshAccessSerializer,
    SshKeyCreateSerializer,
    SshKeySerializer,
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
    """Where `ssh -J` reaches the portal's SSH gateway, and the user inside an instance."""
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
        {201: InstanceSerializer, 200: InstanceSerializer}, 400, 402, 403, 409, 415, 422, 503
    ),
    tags=["instances"],
)
@api_view(["GET", "POST"])
def instances(request):
    """GET: your live instances, then your latest ended ones. POST: launch one (queued; poll it)."""
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
        user=request.user, size=launch["size"], image_key=launch["image"], idempotency_key=key
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
    cleaned = _valid(SshKeyForm(_body(SshKeyCreateSerializer, request)))
    key = account_services.sshkey_add(
        user=request.user, name=cleaned["name"], public_key=cleaned["public_key"]
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
