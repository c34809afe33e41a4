"""The project's CI access page as its owners use it: trust a repository, make a robot token (its text
shown once), revoke it, and read the usage by token; a member is refused and a stranger sees nothing."""

import pytest
from django.test import Client

from portal.api.models import ApiToken
from portal.projects.models import TrustedPublisher
from tests.conftest import text

pytestmark = pytest.mark.usefixtures("cloud")


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_owner_trusts_a_repository_and_makes_and_revokes_a_robot_token(vllm, alice):
    owner = browser(alice)

    trusted = owner.post(
        "/projects/vllm/ci/",
        {"action": "trust", "provider": "github", "repository": "vllm-project/vllm"},
        follow=True,
    )
    made = owner.post("/projects/vllm/ci/", {"action": "token", "name": "nightly", "days": "7"})

    assert "now trusts that workflow" in text(trusted)
    assert TrustedPublisher.objects.get(project=vllm).repository == "vllm-project/vllm"
    token = ApiToken.objects.get(project=vllm)
    assert made.status_code == 200 and 'data-testid="new-token"' in made.content.decode()
    assert f"dcp_{token.prefix}_" in made.content.decode()  # shown this once
    page = owner.get("/projects/vllm/ci/")
    assert "nightly" in text(page) and f"dcp_{token.prefix}_" not in page.content.decode()

    owner.post("/projects/vllm/ci/", {"action": "revoke", "id": token.pk})
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_bad_repository_name_is_refused_with_the_reason_and_nothing_is_trusted(vllm, alice):
    page = browser(alice).post(
        "/projects/vllm/ci/", {"action": "trust", "provider": "github", "repository": "not a repo"}
    )

    assert page.status_code == 400
    assert "owner/name" in text(page)
    assert not TrustedPublisher.objects.exists()


def test_a_member_is_refused_and_a_stranger_sees_nothing(vllm, bob, dave):
    assert browser(bob).get("/projects/vllm/ci/").status_code == 403
    assert browser(bob).post("/projects/vllm/ci/", {"action": "token", "name": "mine"}).status_code == 403
    assert browser(dave).get("/projects/vllm/ci/").status_code == 404
    assert not ApiToken.objects.filter(project=vllm).exists()


def test_the_owners_page_links_to_ci_access(vllm, alice, bob):
    assert 'data-testid="ci-access-link"' in browser(alice).get("/projects/vllm/").content.decode()
    assert 'data-testid="ci-access-link"' not in browser(bob).get("/projects/vllm/").content.decode()
