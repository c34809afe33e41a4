"""Tokens that belong to a project: robot tokens its owners make, and keyless CI sign-in, where a CI run's
OpenID Connect token from the tests' local issuer is traded for a short-lived DevCloud token.

Each is tried as its user would (a CI job launching, paid by the pool) and as an attacker would: another
repository's token, the wrong audience, an expired or forged token, a replayed one, a robot token of one
project launching for another, a member making or revoking the project's tokens."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.api.models import ApiToken, TokenLaunch
from portal.credits import metering
from portal.credits.models import LedgerEntry
from portal.instances.models import Instance
from portal.projects import trust
from tests.api.conftest import TokenClient, assert_problem, token_for
from tests.support.oidc_issuer import (
    DEFAULT_REPOSITORY,
    DEFAULT_WORKFLOW,
    oidc_issuer_fixture,  # noqa: F401  (registers oidc_issuer)
)

from .conftest import fund, pool_balance

pytestmark = pytest.mark.django_db
AUDIENCE = "https://devcloud.example.com"


@pytest.fixture(autouse=True)
def trusting_the_local_issuer(settings, oidc_issuer):
    settings.OIDC_PROVIDERS = {"github": oidc_issuer.url}
    settings.OIDC_AUDIENCE = AUDIENCE


@pytest.fixture
def ci_project(vllm, alice, cpu):
    """vllm, funded, trusting CI runs of the default repository's main branch."""
    fund(vllm, 10)
    trust.trusted_publisher_add(
        user=alice, slug="vllm", provider="github", repository=DEFAULT_REPOSITORY, ref="refs/heads/main"
    )
    return vllm


def sign_in(project: str, id_token: str):
    return Client().post(
        "/api/v1/oidc/token", {"project": project, "token": id_token}, content_type="application/json"
    )


def test_a_ci_run_signs_in_with_its_oidc_token_and_launches_paid_by_the_pool(
    ci_project, oidc_issuer, alice, bob
):
    answer = sign_in("vllm", oidc_issuer.token(aud=AUDIENCE))

    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["project"] == "vllm"
    token = ApiToken.objects.get(project=ci_project)
    assert token.scope == "launch" and token.user.project_bot
    assert "octo-org/gpu-project run 7000000001/1" in token.name
    # Launching without naming the project launches for it: a CI token belongs to its project.
    launched = TokenClient(body["token"]).post("/api/v1/instances", {"size": "1x", "image": "cpu"})
    assert launched.status_code == 201, launched.content
    assert launched.json()["project"] == "vllm"
    instance = Instance.objects.get(pk=launched.json()["id"])
    assert TokenLaunch.objects.get(instance=instance).token == token
    # The pool pays; no person's credit is touched.
    personal = LedgerEntry.objects.filter(account__user__in=[alice, bob]).count()
    before = pool_balance(ci_project)
    ten_minutes_ago = timezone.now() - timedelta(minutes=10)
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING, ready_at=ten_minutes_ago, metered_until=ten_minutes_ago
    )
    metering.charge_until(instance=Instance.objects.get(pk=instance.pk), until=timezone.now())
    assert pool_balance(ci_project) < before
    assert LedgerEntry.objects.filter(account__user__in=[alice, bob]).count() == personal


@pytest.mark.parametrize(
    "claims, says",
    [
        ({"repository": "mallory/fork", "aud": AUDIENCE}, "mallory/fork"),
        ({"aud": "https://other-portal.example.com"}, "audience"),
        (
            {
                "aud": AUDIENCE,
                "exp": int(timezone.now().timestamp()) - 600,
                "iat": int(timezone.now().timestamp()) - 900,
            },
            "expired",
        ),
        ({"aud": AUDIENCE, "ref": "refs/heads/evil"}, "refs/heads/evil"),
    ],
    ids=["another repository", "wrong audience", "expired", "another branch"],
)
def test_a_token_the_project_does_not_trust_gets_nothing(ci_project, oidc_issuer, claims, says):
    body = assert_problem(sign_in("vllm", oidc_issuer.token(**claims)), 403, kind="ci-signin-refused")

    assert says in body["detail"]
    assert not ApiToken.objects.filter(project=ci_project).exists()


def test_a_forged_token_gets_nothing(ci_project, oidc_issuer):
    assert_problem(sign_in("vllm", oidc_issuer.outsider_token(aud=AUDIENCE)), 403, kind="ci-signin-refused")
    assert not ApiToken.objects.filter(project=ci_project).exists()


def test_a_ci_token_is_exchanged_once(ci_project, oidc_issuer):
    id_token = oidc_issuer.token(aud=AUDIENCE)
    assert sign_in("vllm", id_token).status_code == 201

    body = assert_problem(sign_in("vllm", id_token), 403, kind="ci-signin-refused")
    assert "already exchanged" in body["detail"]
    assert ApiToken.objects.filter(project=ci_project).count() == 1


def test_a_project_that_trusts_nothing_and_one_that_does_not_exist_refuse_alike(vllm, triton, oidc_issuer):
    unknown = assert_problem(sign_in("nope", oidc_issuer.token(aud=AUDIENCE)), 403)
    untrusting = assert_problem(sign_in("triton", oidc_issuer.token(aud=AUDIENCE)), 403)

    assert unknown["detail"].replace("'nope'", "X") == untrusting["detail"].replace("'triton'", "X")


def test_the_ci_token_of_one_project_launches_nothing_for_another(ci_project, triton, dave, oidc_issuer):
    fund(triton, 10)
    text = sign_in("vllm", oidc_issuer.token(aud=AUDIENCE)).json()["token"]

    answer = TokenClient(text).post("/api/v1/instances", {"size": "1x", "image": "cpu", "project": "triton"})

    assert_problem(answer, 404)
    assert not Instance.objects.exists()
    assert pool_balance(triton) == 10 * 3600


def test_an_owner_makes_a_robot_token_that_launches_for_the_project_within_its_own_limit(ci_project, alice):
    _, owner = token_for(alice)
    made = owner.post("/api/v1/projects/vllm/tokens", {"name": "nightly", "days": 7, "max_live_instances": 1})
    assert made.status_code == 201, made.content
    robot = TokenClient(made.json()["token"])

    first = robot.post("/api/v1/instances", {"size": "1x", "image": "cpu"})
    second = robot.post("/api/v1/instances", {"size": "1x", "image": "cpu"})

    assert first.status_code == 201 and first.json()["project"] == "vllm"
    body = assert_problem(second, 409)
    assert "may have 1 instance(s)" in body["detail"]
    listed = owner.get("/api/v1/projects/vllm/tokens").json()
    assert [row["name"] for row in listed] == ["nightly"]
    assert "token" not in listed[0]  # shown once, when made


def test_a_member_can_neither_make_nor_list_nor_revoke_the_projects_tokens(ci_project, alice, bob, dave):
    _, owner = token_for(alice)
    made = owner.post("/api/v1/projects/vllm/tokens", {"name": "nightly"}).json()
    _, member = token_for(bob)
    _, outsider = token_for(dave)

    assert_problem(member.post("/api/v1/projects/vllm/tokens", {"name": "mine"}), 403)
    assert_problem(member.get("/api/v1/projects/vllm/tokens"), 403)
    assert_problem(member.delete(f"/api/v1/projects/vllm/tokens/{made['id']}"), 403)
    assert_problem(outsider.get("/api/v1/projects/vllm/tokens"), 404)
    assert_problem(
        member.post(
            "/api/v1/projects/vllm/trusted-publishers", {"provider": "github", "repository": "bob/fork"}
        ),
        403,
    )
    assert ApiToken.objects.filter(project=ci_project).count() == 1
    assert ApiToken.objects.get(project=ci_project).revoked_at is None


def test_a_revoked_robot_token_stops_working_at_once(ci_project, alice):
    _, owner = token_for(alice)
    made = owner.post("/api/v1/projects/vllm/tokens", {"name": "nightly"}).json()

    assert owner.delete(f"/api/v1/projects/vllm/tokens/{made['id']}").status_code == 204

    assert_problem(TokenClient(made["token"]).get("/api/v1/instances"), 401)


def test_the_bot_is_never_emailed(ci_project, oidc_issuer):
    from portal.notifications.services import _email_wanted

    sign_in("vllm", oidc_issuer.token(aud=AUDIENCE))
    bot = ci_project.__class__.objects.get(pk=ci_project.pk).bot
    assert bot.project_bot and not bot.has_usable_password()
    assert not _email_wanted(bot, "instance_stopped")


def test_the_portal_tells_a_ci_job_which_audience_to_ask_for(oidc_issuer):
    body = Client().get("/api/v1/oidc").json()

    assert body == {"audience": AUDIENCE, "providers": {"github": oidc_issuer.url}}


def test_an_owner_names_a_provider_the_portal_knows_never_a_url(vllm, alice):
    _, owner = token_for(alice)
    body = assert_problem(
        owner.post(
            "/api/v1/projects/vllm/trusted-publishers",
            {"provider": "http://169.254.169.254/latest", "repository": DEFAULT_REPOSITORY},
        ),
        400,
    )
    assert "Choose a CI provider this portal knows: github" in body["detail"]
    added = owner.post(
        "/api/v1/projects/vllm/trusted-publishers",
        {"provider": "github", "repository": DEFAULT_REPOSITORY, "workflow": DEFAULT_WORKFLOW},
    )
    assert added.status_code == 201, added.content


def test_a_robot_token_can_neither_raise_the_limits_nor_make_tokens(ci_project, alice):
    _, owner = token_for(alice)
    robot = TokenClient(owner.post("/api/v1/projects/vllm/tokens", {"name": "nightly"}).json()["token"])

    raised = robot.http.patch(
        "/api/v1/projects/vllm",
        {"max_live_instances": 99},
        content_type="application/json",
        headers={"Authorization": f"Bearer {robot.token_text}"},
    )

    assert_problem(raised, 403)
    assert_problem(robot.post("/api/v1/projects/vllm/tokens", {"name": "mine"}), 403)
    ci_project.refresh_from_db()
    assert ci_project.max_live_instances != 99


def test_the_bot_is_not_a_person_owners_can_promote_or_remove(ci_project, alice):
    from django.http import Http404

    from portal.api.robots import project_bot
    from portal.projects import selectors, services

    bot = project_bot(ci_project)

    with pytest.raises(Http404):
        services.member_role_change(user=alice, project=ci_project, member_id=bot.pk, role="owner")
    with pytest.raises(Http404):
        services.member_remove(user=alice, project=ci_project, member_id=bot.pk)
    assert bot.pk not in [membership.user_id for membership in selectors.members_of(ci_project)]
