"""Entitlements: which sizes a free account, a bonus holder and a person an operator opened sizes to may
launch, the live-instance limit, and the operators' launch policy page with its audit trail. Every
refusal is checked twice: in the service, and on the launch page before anyone clicks."""

import re

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from django.urls import reverse

from portal.accounts import services as accounts
from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.credits.models import BonusProgram
from portal.instances import entitlements, services
from portal.instances.models import Instance, LaunchPolicy
from provisioning.drivers import fake
from tests.conftest import give, text

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600
REFUSED_8X = (
    "8x MI300X opens once an operator approves one of your bonus-hour applications: "
    "apply through the ROCm Star developer certificate program."
)


@pytest.fixture
def cpu(db):
    fake.make_host("gpu-01")
    return fake.make_image("cpu", sizes=["1x", "8x"])


@pytest.fixture
def rocm_star(db):
    # Seeded by a migration; re-created if a transactional test elsewhere flushed it.
    program, _ = BonusProgram.objects.get_or_create(
        slug="rocm-star", defaults={"name": "ROCm Star developer certificate", "max_gpu_seconds": 50 * HOUR}
    )
    return program


@pytest.fixture
def policy(db, rocm_star):
    """The product's rule: free accounts launch 1x, an approved bonus application opens 8x."""
    LaunchPolicy.current()
    LaunchPolicy.objects.update(free_sizes=["1x"], bonus_sizes=["8x"], max_live_instances=4)
    return LaunchPolicy.current()


def launch_page(user):
    browser = Client()
    browser.force_login(user)
    return browser.get(reverse("instances:list"))


def size_disabled(response, size) -> bool:
    return bool(re.search(rf'name="size" value="{size}"\s+disabled', response.content.decode()))


def launch_disabled(response) -> bool:
    return bool(re.search(r'<button[^>]*data-testid="launch"[^>]*disabled', response.content.decode()))


# --- Sizes by tier ---------------------------------------------------------------------------------------


def test_a_free_account_is_refused_8x_in_the_service_with_the_way_to_open_it(alice, cpu, policy):
    give(alice, 25)

    with pytest.raises(ValidationError) as refused:
        services.instance_launch(user=alice, size="8x", image_key="cpu")

    assert refused.value.messages == [REFUSED_8X]
    assert not Instance.objects.exists()
    assert services.instance_launch(user=alice, size="1x", image_key="cpu").size == "1x"


def test_the_launch_page_explains_the_8x_refusal_before_the_click(alice, cpu, policy):
    give(alice, 25)

    response = launch_page(alice)

    assert size_disabled(response, "8x") and not size_disabled(response, "1x")
    assert not launch_disabled(response)
    refusal = re.search(r'data-testid="size-8x-refusal">(.*?)</span>', response.content.decode(), re.S).group(
        1
    )
    assert REFUSED_8X in refusal
    assert f'<a href="{reverse("credits:bonus")}">Apply for bonus hours</a>' in refusal


def test_a_pending_application_is_named_while_it_waits(alice, cpu, policy, rocm_star):
    give(alice, 25)
    credits.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    with pytest.raises(
        ValidationError, match="yours for ROCm Star developer certificate is waiting for review"
    ):
        services.instance_launch(user=alice, size="8x", image_key="cpu")
    assert "See your applications" in text(launch_page(alice))


def test_an_approved_bonus_application_opens_8x(alice, olivia, cpu, policy, rocm_star):
    give(alice, 25)
    application = credits.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")
    credits.bonus_approve(application_id=application.pk, actor=olivia)

    response = launch_page(alice)

    assert not size_disabled(response, "8x")
    assert 'data-testid="size-8x-refusal"' not in response.content.decode()
    assert services.instance_launch(user=alice, size="8x", image_key="cpu").size == "8x"


def test_a_rejected_application_does_not_open_8x(alice, olivia, cpu, policy, rocm_star):
    give(alice, 25)
    application = credits.bonus_apply(user=alice, program=rocm_star, evidence="nonsense")
    credits.bonus_reject(application_id=application.pk, actor=olivia, reason="Not a certificate")

    with pytest.raises(ValidationError, match="8x MI300X opens once an operator approves"):
        services.instance_launch(user=alice, size="8x", image_key="cpu")


def test_an_operator_opens_8x_to_one_person_only_and_it_is_audited(alice, bob, olivia, cpu, policy):
    give(alice, 25)
    give(bob, 25)

    accounts.user_launch_sizes_set(user=alice, actor=olivia, sizes=["8x"], reason="AMD partner lab")

    assert services.instance_launch(user=alice, size="8x", image_key="cpu").size == "8x"
    with pytest.raises(ValidationError, match="8x MI300X opens once"):
        services.instance_launch(user=bob, size="8x", image_key="cpu")
    entry = AuditEntry.objects.get(action="setting.change")
    assert (entry.actor, entry.target_id, entry.reason) == (olivia, str(alice.pk), "AMD partner lab")
    assert entry.details["changes"] == {"extra_sizes": {"old": [], "new": ["8x"]}}


def test_closing_the_extra_size_again_refuses_8x(alice, olivia, cpu, policy):
    give(alice, 25)
    accounts.user_launch_sizes_set(user=alice, actor=olivia, sizes=["8x"], reason="Trial")
    accounts.user_launch_sizes_set(user=alice, actor=olivia, sizes=[], reason="Trial over")
    accounts.user_launch_sizes_set(user=alice, actor=olivia, sizes=[], reason="Nothing to change")

    with pytest.raises(ValidationError, match="8x MI300X opens once"):
        services.instance_launch(user=alice, size="8x", image_key="cpu")
    assert AuditEntry.objects.filter(action="setting.change").count() == 2


def test_only_operators_open_sizes_and_only_known_ones(alice, bob, olivia, policy):
    with pytest.raises(PermissionDenied):
        accounts.user_launch_sizes_set(user=alice, actor=bob, sizes=["8x"], reason="Friend")
    with pytest.raises(ValidationError, match="Unknown size '4x'"):
        accounts.user_launch_sizes_set(user=alice, actor=olivia, sizes=["4x"], reason="Typo")
    alice.refresh_from_db()
    assert alice.extra_sizes == []
    assert not AuditEntry.objects.exists()


def test_an_operator_opens_sizes_from_the_user_page(alice, olivia_client, policy):
    url = f"/admin/accounts/user/{alice.pk}/launch-sizes/"
    assert "Tier: Free (no approved bonus application). May launch: 1x MI300X." in text(
        olivia_client.get(f"/admin/accounts/user/{alice.pk}/change/")
    )

    response = olivia_client.post(url, {"sizes": ["8x"], "reason": "AMD partner lab"}, follow=True)

    assert "Sizes opened to alice@example.com: 8x MI300X." in text(response)
    assert "May launch: 1x MI300X, 8x MI300X (opened by an operator: 8x MI300X)." in text(response)
    alice.refresh_from_db()
    assert alice.extra_sizes == ["8x"]
    assert AuditEntry.objects.get(action="setting.change").reason == "AMD partner lab"


def test_a_size_no_tier_has_is_refused_with_whom_to_ask(alice, cpu, policy):
    give(alice, 25)
    LaunchPolicy.objects.update(bonus_sizes=[])

    with pytest.raises(ValidationError, match="8x MI300X is not open to accounts right now. Contact support"):
        services.instance_launch(user=alice, size="8x", image_key="cpu")


# --- Live instances --------------------------------------------------------------------------------------


def test_it_limits_live_instances_and_explains_it_before_the_click(alice, cpu, policy):
    give(alice, 25)
    LaunchPolicy.objects.update(max_live_instances=2)
    first = services.instance_launch(user=alice, size="1x", image_key="cpu")
    services.instance_launch(user=alice, size="1x", image_key="cpu")
    limit = (
        "You already have 2 instances running or starting; the limit is 2 at once. "
        "Stop one to launch another."
    )

    with pytest.raises(ValidationError) as refused:
        services.instance_launch(user=alice, size="1x", image_key="cpu")
    assert refused.value.messages == [limit]
    response = launch_page(alice)
    assert launch_disabled(response)
    assert limit in text(response)

    services.instance_stop(user=alice, instance_id=first.id)
    assert not launch_disabled(launch_page(alice))
    assert services.instance_launch(user=alice, size="1x", image_key="cpu").state == Instance.State.QUEUED


def test_the_page_says_how_long_each_size_may_run(alice, cpu, policy):
    give(alice, 25)

    page = text(launch_page(alice))

    assert "Instances at this size stop after 12 hours; an idle one is warned after 60 minutes" in page
    assert "Instances at this size stop after 4 hours; an idle one is warned after 30 minutes" in page
    assert "You may have up to 4 instances running or starting at once." in page


# --- The policy and its page -------------------------------------------------------------------------------


def test_the_policy_starts_from_the_settings(db, settings):
    settings.SIZES_REQUIRING_BONUS = ["8x"]
    settings.MAX_LIVE_INSTANCES_PER_USER = 3

    policy = LaunchPolicy.current()

    assert (policy.free_sizes, policy.bonus_sizes, policy.max_live_instances) == (["1x"], ["8x"], 3)
    assert (policy.max_session_hours_for("1x"), policy.max_session_hours_for("8x")) == (12, 4)
    assert (policy.idle_minutes_for("1x"), policy.idle_minutes_for("8x"), policy.idle_grace_minutes) == (
        60,
        30,
        15,
    )
    assert LaunchPolicy.objects.count() == 1


def policy_form(**changes):
    form = {
        "free_sizes": ["1x", "8x"],
        "bonus_sizes": [],
        "max_live_instances": "4",
        "max_session_hours_1x": "12",
        "max_session_hours_8x": "4",
        "idle_minutes_1x": "60",
        "idle_minutes_8x": "30",
        "idle_grace_minutes": "15",
        "reason": "",
    }
    form.update(changes)
    return form


def test_changing_the_policy_in_the_console_is_audited_with_old_and_new_values(
    alice, olivia, olivia_client, cpu, rocm_star, settings
):
    settings.SIZES_REQUIRING_BONUS = []
    give(alice, 25)
    page = olivia_client.get("/admin/instances/launchpolicy/", follow=True)
    change_url = page.redirect_chain[-1][0]
    assert change_url == f"/admin/instances/launchpolicy/{LaunchPolicy.SINGLETON_PK}/change/"

    response = olivia_client.post(
        change_url,
        policy_form(free_sizes=["1x"], bonus_sizes=["8x"], max_session_hours_8x="2", reason="8x is scarce"),
        follow=True,
    )

    assert "Launch policy changed" in text(response)
    entry = AuditEntry.objects.get(action="setting.change")
    assert (entry.actor, entry.reason, entry.target_repr) == (olivia, "8x is scarce", "Launch policy")
    assert entry.details["changes"] == {
        "free_sizes": {"old": ["1x", "8x"], "new": ["1x"]},
        "bonus_sizes": {"old": [], "new": ["8x"]},
        "max_session_hours": {"old": {"1x": 12, "8x": 4}, "new": {"1x": 12, "8x": 2}},
    }
    # It applies to the next launch.
    with pytest.raises(ValidationError, match="8x MI300X opens once"):
        services.instance_launch(user=alice, size="8x", image_key="cpu")
    assert "Instances at this size stop after 2 hours" in text(launch_page(alice))


def test_the_policy_page_needs_a_reason_and_saving_nothing_new_records_nothing(olivia_client, settings):
    settings.SIZES_REQUIRING_BONUS = []
    url = f"/admin/instances/launchpolicy/{LaunchPolicy.current().pk}/change/"

    no_reason = olivia_client.post(url, policy_form(free_sizes=["1x"]))
    unchanged = olivia_client.post(url, policy_form(reason="Just looking"), follow=True)

    assert no_reason.status_code == 200 and "This field is required." in text(no_reason)
    assert LaunchPolicy.current().free_sizes == ["1x", "8x"]
    assert "Nothing changed." in text(unchanged)
    assert not AuditEntry.objects.exists()


def test_alice_cannot_change_the_policy(alice, bob, client, settings):
    settings.SIZES_REQUIRING_BONUS = []
    url = f"/admin/instances/launchpolicy/{LaunchPolicy.current().pk}/change/"
    client.force_login(alice)

    response = client.post(url, policy_form(free_sizes=[], reason="Mine"))

    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    with pytest.raises(PermissionDenied):
        entitlements.launch_policy_update(actor=bob, reason="Mine", free_sizes=[])
    assert LaunchPolicy.current().free_sizes == ["1x", "8x"]
    assert not AuditEntry.objects.exists()


def test_the_service_refuses_nonsense_values(olivia, policy):
    with pytest.raises(ValidationError, match="Unknown size '4x'"):
        entitlements.launch_policy_update(actor=olivia, reason="Typo", free_sizes=["4x"])
    with pytest.raises(ValidationError, match="cannot be negative"):
        entitlements.launch_policy_update(actor=olivia, reason="Typo", max_session_hours={"1x": -1})
    with pytest.raises(ValidationError, match="Say why"):
        entitlements.launch_policy_update(actor=olivia, reason=" ", max_live_instances=1)
    assert LaunchPolicy.current().free_sizes == ["1x"]
