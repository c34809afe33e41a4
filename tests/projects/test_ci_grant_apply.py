"""An owner applies for the open-source CI programme from the project's page: one open application per
project, an https repository, and nobody else may (a member is refused, an outsider finds no project)."""

import pytest
from django.db import IntegrityError
from django.test import Client
from django.urls import reverse

from portal.projects import ci_grants
from portal.projects.models import CIGrantApplication
from tests.conftest import text

APPLICATION = {
    "repository_url": "https://github.com/vllm-project/vllm",
    "maintainers": "alice-gh, bob@example.com",
    "purpose": "GPU tests of every pull request",
}


def apply_url(project):
    return reverse("projects:ci_grant_apply", args=[project.slug])


@pytest.fixture
def dave_client(dave):
    browser = Client()
    browser.force_login(dave)
    return browser


def test_it_lets_an_owner_apply_from_the_project_page(alice_client, vllm, alice):
    page = alice_client.get(reverse("projects:detail", args=[vllm.slug]))
    assert 'data-testid="ci-apply-form"' in page.content.decode()

    response = alice_client.post(apply_url(vllm), APPLICATION)

    assert response.status_code == 302
    application = CIGrantApplication.objects.get(project=vllm)
    assert (application.status, application.applicant, application.repository_url) == (
        "pending",
        alice,
        APPLICATION["repository_url"],
    )
    after = alice_client.get(reverse("projects:detail", args=[vllm.slug]))
    assert "Latest application" in text(after) and "Pending review" in text(after)
    assert 'data-testid="ci-apply-form"' not in after.content.decode()


def test_it_takes_one_open_application_per_project(alice_client, vllm, alice):
    ci_grants.ci_grant_apply(user=alice, project=vllm, **APPLICATION)

    response = alice_client.post(apply_url(vllm), APPLICATION)

    assert response.status_code == 400
    assert "already has an application waiting for review" in text(response)
    assert CIGrantApplication.objects.filter(project=vllm).count() == 1


def test_the_database_itself_refuses_a_second_open_application(vllm, alice):
    CIGrantApplication.objects.create(project=vllm, applicant=alice, **APPLICATION)

    with pytest.raises(IntegrityError):
        CIGrantApplication.objects.create(project=vllm, applicant=alice, **APPLICATION)


def test_a_rejected_project_may_apply_again(vllm, alice, olivia):
    first = ci_grants.ci_grant_apply(user=alice, project=vllm, **APPLICATION)
    ci_grants.ci_grant_reject(application_id=first.pk, actor=olivia, reason="Add a licence first")

    again = ci_grants.ci_grant_apply(user=alice, project=vllm, **APPLICATION)

    assert again.status == "pending"


def test_a_project_in_the_programme_cannot_apply_again(vllm, alice, olivia):
    first = ci_grants.ci_grant_apply(user=alice, project=vllm, **APPLICATION)
    ci_grants.ci_grant_approve(application_id=first.pk, actor=olivia)

    with pytest.raises(Exception, match="already in the CI programme"):
        ci_grants.ci_grant_apply(user=alice, project=vllm, **APPLICATION)


@pytest.mark.parametrize("url", ["http://github.com/vllm-project/vllm", "ftp://example.com/repo", "vllm"])
def test_it_wants_an_https_repository(vllm, alice, url):
    with pytest.raises(Exception, match="https://"):
        ci_grants.ci_grant_apply(user=alice, project=vllm, **{**APPLICATION, "repository_url": url})

    assert not CIGrantApplication.objects.exists()


def test_a_member_who_is_not_an_owner_is_refused(bob_client, vllm):
    page = bob_client.get(reverse("projects:detail", args=[vllm.slug]))

    response = bob_client.post(apply_url(vllm), APPLICATION)

    assert 'data-testid="ci-apply-form"' not in page.content.decode()
    assert response.status_code == 403
    assert not CIGrantApplication.objects.exists()


def test_an_outsider_finds_no_project(dave_client, vllm):
    response = dave_client.post(apply_url(vllm), APPLICATION)

    assert response.status_code == 404
    assert not CIGrantApplication.objects.exists()
