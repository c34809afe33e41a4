"""Which CI workflows a project trusts to sign in without a stored secret (TrustedPublisher), managed by
its owners. The sign-in itself is portal/api/robots.py's ci_signin."""

import re

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404

from portal.audit.services import audit_record

from .models import Project, ProjectMembership, TrustedPublisher

_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def _owned(*, user, slug: str) -> Project:
    membership = (
        ProjectMembership.objects.select_related("project")
        .filter(project__slug=slug, user_id=user.pk)
        .first()
    )
    if membership is None:
        raise Http404("No such project.")
    if membership.role != ProjectMembership.Role.OWNER:
        raise PermissionDenied("Only an owner of the project may do that.")
    return membership.project


def trusted_publishers_of(*, user, slug: str) -> list[TrustedPublisher]:
    """The project's trusted CI workflows, for its owners."""
    return list(_owned(user=user, slug=slug).trusted_publishers.all())


def trusted_publisher_add(
    *,
    user,
    slug: str,
    provider: str,
    repository: str,
    ref: str = "",
    workflow: str = "",
    environment: str = "",
) -> TrustedPublisher:
    """An owner trusts CI runs of `repository` on `provider` (one of settings.OIDC_PROVIDERS), narrowed
    to `ref`, `workflow` and `environment` when given. Raises ValidationError keyed by field."""
    project = _owned(user=user, slug=slug)
    provider, repository = (provider or "").strip(), (repository or "").strip()
    errors = {}
    if provider not in settings.OIDC_PROVIDERS:
        names = ", ".join(sorted(settings.OIDC_PROVIDERS)) or "none (the operators set OIDC_PROVIDERS)"
        errors["provider"] = f"Choose a CI provider this portal knows: {names}."
    if not _REPOSITORY.match(repository):
        errors["repository"] = "Name the repository as owner/name, e.g. vllm-project/vllm."
    ref, workflow, environment = (ref or "").strip(), (workflow or "").strip(), (environment or "").strip()
    if ref and not ref.startswith("refs/"):
        errors["ref"] = "Give the full ref, e.g. refs/heads/main, or leave it empty for any."
    if errors:
        raise ValidationError(errors)
    try:
        with transaction.atomic():
            publisher = TrustedPublisher.objects.create(
                project=project,
                provider=provider,
                repository=repository,
                ref=ref,
                workflow=workflow,
                environment=environment,
                created_by=user,
            )
            audit_record(actor=user, action="project.trust_add", target=project, reason=str(publisher))
    except IntegrityError:
        raise ValidationError("The project already trusts exactly this.") from None
    return publisher


def trusted_publisher_remove(*, user, slug: str, publisher_id) -> None:
    """An owner stops trusting one workflow. Tokens it already gave keep working until they expire or an
    owner revokes them."""
    project = _owned(user=user, slug=slug)
    publisher = TrustedPublisher.objects.filter(pk=publisher_id, project=project).first()
    if publisher is None:
        raise Http404("No such trusted workflow.")
    with transaction.atomic():
        audit_record(actor=user, action="project.trust_remove", target=project, reason=str(publisher))
        publisher.delete()
