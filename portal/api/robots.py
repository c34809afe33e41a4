"""Tokens that belong to a project, not to a person: robot tokens its owners make, and the short-lived
tokens a CI run gets by trading its CI provider's OpenID Connect token (keyless CI sign-in).

Both act as the project's bot account (Project.bot, made on first use): a member of the project with no
password and no email, whose launches are paid from the project's pool under the same limits and locks
as a person's (portal/instances/services.py). A robot token launches only for its project
(launch_project), may carry a live-instance limit of its own, and is listed, made and revoked by the
project's owners only. docs/architecture.md, "Robot tokens and keyless CI sign-in".
"""

import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone

from portal.audit.services import audit_record
from portal.lib import oidc
from portal.projects.models import Project, ProjectMembership, TrustedPublisher

from .models import ApiToken
from .services import TOKEN_PREFIX, _digest

Role = ProjectMembership.Role
# Where bot accounts' addresses live: a reserved name (RFC 2606) that no mail server answers for.
BOT_EMAIL_DOMAIN = "bots.devcloud.invalid"


def _owner_project(*, user, slug: str) -> Project:
    """The project `slug` if `user` owns it. Http404 for a non-member (as for no such project),
    PermissionDenied for a member who is not an owner."""
    membership = (
        ProjectMembership.objects.select_related("project")
        .filter(project__slug=slug, user_id=user.pk)
        .first()
    )
    if membership is None:
        raise Http404("No such project.")
    if membership.role != Role.OWNER:
        raise PermissionDenied("Only an owner of the project may do that.")
    return membership.project


def project_bot(project: Project):
    """The project's bot account, made (with its membership) on first use, under the project's row lock
    so that two first uses make one."""
    if project.bot_id:
        return project.bot
    with transaction.atomic():
        locked = Project.objects.select_for_update().get(pk=project.pk)
        if locked.bot_id is None:
            bot = get_user_model().objects.create(
                email=f"project-{locked.pk}@{BOT_EMAIL_DOMAIN}",
                first_name=f"{locked.name} CI",
                password=make_password(None),
                email_verified_at=timezone.now(),
                project_bot=True,
            )
            ProjectMembership.objects.get_or_create(project=locked, user=bot, defaults={"role": Role.MEMBER})
            locked.bot = bot
            locked.save(update_fields=["bot"])
        project.bot = locked.bot
    return project.bot


def _mint(*, project: Project, name: str, scope: str, expires_at, max_live_instances: int = 0, oidc_jti=None):
    prefix, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=project_bot(project),
        project=project,
        name=name[:100],
        scope=scope,
        prefix=prefix,
        secret_sha256=_digest(secret),
        expires_at=expires_at,
        max_live_instances=max_live_instances,
        oidc_jti=oidc_jti,
    )
    return token, f"{TOKEN_PREFIX}_{prefix}_{secret}"


def robot_token_create(
    *, user, slug: str, name: str, scope: str, days: int, max_live_instances: int = 0
) -> tuple[ApiToken, str]:
    """An owner makes a token that belongs to the project. Returns (ApiToken, its text, shown once).
    Raises Http404/PermissionDenied (not an owner) and ValidationError keyed by field."""
    project = _owner_project(user=user, slug=slug)
    errors = {}
    name = (name or "").strip()
    if not name:
        errors["name"] = "Give the token a name, e.g. “nightly GPU tests”."
    if scope not in ApiToken.Scope.values:
        errors["scope"] = "Choose read, or read and launch."
    if not isinstance(days, int) or not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        errors["days"] = f"A token lives between 1 and {settings.API_TOKEN_MAX_DAYS} days."
    if not isinstance(max_live_instances, int) or max_live_instances < 0:
        errors["max_live_instances"] = "A number of instances, 0 for the project's own limit only."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        token, text = _mint(
            project=project,
            name=name,
            scope=scope,
            expires_at=timezone.now() + timedelta(days=days),
            max_live_instances=max_live_instances,
        )
        audit_record(
            actor=user,
            action="project.robot_token_create",
            target=project,
            reason=f"{token.name} ({token.scope})",
        )
    return token, text


def robot_tokens_of(*, user, slug: str) -> list[ApiToken]:
    """The project's robot and CI tokens, newest first, for its owners."""
    project = _owner_project(user=user, slug=slug)
    return list(ApiToken.objects.filter(project=project).order_by("-created_at", "-id"))


def robot_token_revoke(*, user, slug: str, token_id) -> ApiToken:
    """An owner revokes one of the project's tokens; it stops working at once. Http404 for a token of
    another project."""
    project = _owner_project(user=user, slug=slug)
    token = ApiToken.objects.filter(pk=token_id, project=project).first()
    if token is None:
        raise Http404("No such token.")
    with transaction.atomic():
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        audit_record(actor=user, action="project.robot_token_revoke", target=project, reason=token.name)
    token.refresh_from_db()
    return token


def launch_project(token: ApiToken | None, asked: str | None) -> str | None:
    """The project a launch made with `token` is for: a robot token's own project (asking for another
    one is answered as for a project that does not exist); otherwise what was asked."""
    if token is None or token.project_id is None:
        return asked
    own = token.project.slug
    if asked and asked != own:
        raise Http404("No such project.")
    return own


# --- Keyless CI sign-in -------------------------------------------------------------------------------


def _policy(publisher: TrustedPublisher) -> oidc.TrustPolicy | None:
    issuer = settings.OIDC_PROVIDERS.get(publisher.provider)
    if issuer is None:
        return None  # a provider the operators have since removed
    return oidc.TrustPolicy(
        issuer=issuer,
        audience=settings.OIDC_AUDIENCE,
        repository=publisher.repository,
        ref=publisher.ref or None,
        workflow=publisher.workflow or None,
        environment=publisher.environment or None,
    )


def ci_signin(*, slug: str, id_token: str) -> tuple[ApiToken, str]:
    """Trade a CI run's OpenID Connect token for a DevCloud token of project `slug`, if one of the
    project's trusted publishers accepts it. Returns (ApiToken, its text).

    The new token launches for the project only, lives OIDC_TOKEN_MINUTES, and is made once per CI token
    (its issuer and `jti`). Raises oidc.OidcRefused with a message for the CI log: no such project and a
    project that trusts nothing read alike, so a refusal does not tell which projects exist.
    """
    project = Project.objects.filter(slug=(slug or "").strip().lower()).first()
    policies = [
        policy
        for policy in (
            _policy(publisher) for publisher in (project.trusted_publishers.all() if project else [])
        )
        if policy is not None
    ]
    if not policies:
        raise oidc.OidcRefused(
            f"No project {slug!r} trusts CI sign-in here. An owner of the project adds this repository under "
            "the project's CI access.",
            reason="issuer",
        )
    refusals = []
    for policy in policies:
        try:
            claims = oidc.verify(id_token, policy)
            break
        except oidc.OidcRefused as refused:
            refusals.append(refused)
    else:
        # The most telling refusal: one from a policy whose issuer matched (repository, audience, ...).
        telling = [refused for refused in refusals if refused.reason != "issuer"]
        raise (telling or refusals)[0]
    values = claims.claims
    jti = values.get("jti")
    run = (
        f"run {values.get('run_id', '?')}/{values.get('run_attempt', '1')}" if values.get("run_id") else "CI"
    )
    try:
        with transaction.atomic():
            token, text = _mint(
                project=project,
                name=f"CI sign-in: {values.get('repository', '')} {run}",
                scope=ApiToken.Scope.LAUNCH,
                expires_at=timezone.now() + timedelta(minutes=settings.OIDC_TOKEN_MINUTES),
                oidc_jti=f"{policy.issuer} {jti}"[:400] if jti else None,
            )
            audit_record(actor=None, action="project.ci_signin", target=project, reason=token.name)
    except IntegrityError:
        raise oidc.OidcRefused(
            "This CI token was already exchanged once; ask the CI provider for a new one.", reason="replayed"
        ) from None
    return token, text
