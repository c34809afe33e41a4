"""instance_launch(project=...): who may launch for a project, what it allows, and what it refuses under
the pool's lock (also when two launches race for the last hour or the last slot)."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404
from django.utils import timezone

from portal.credits.models import LedgerEntry
from portal.instances import selectors, services
from portal.instances.models import Instance
from portal.projects import services as project_services
from portal.projects.models import Project
from provisioning.drivers import fake
from tests.conftest import balance, give, make_user
from tests.support.race import at_once

from .conftest import HOUR, add_member, fund, pool_balance

pytestmark = pytest.mark.usefixtures("cloud")


def test_it_lets_a_member_launch_on_the_pool_without_personal_credit(vllm, bob, cpu):
    fund(vllm, 10)

    instance = services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")

    assert instance.project == vllm and instance.user == bob
    assert balance(bob) == 0


def test_it_answers_a_non_member_as_if_the_project_did_not_exist(vllm, dave, cpu):
    fund(vllm, 10)
    with pytest.raises(Http404):
        services.instance_launch(user=dave, size="1x", image_key="cpu", project="vllm")
    with pytest.raises(Http404):
        services.instance_launch(user=dave, size="1x", image_key="cpu", project="no-such-project")
    assert not Instance.objects.exists()


def test_it_refuses_a_size_the_project_does_not_allow(vllm, bob, cpu):
    fund(vllm, 100)
    with pytest.raises(ValidationError, match="does not allow 8x"):
        services.instance_launch(user=bob, size="8x", image_key="cpu", project=vllm)


def test_it_allows_8x_only_once_the_operators_entitle_the_project(vllm, bob, cpu):
    fund(vllm, 100)
    Project.objects.filter(pk=vllm.pk).update(allowed_sizes=["1x", "8x"])
    with pytest.raises(ValidationError, match="does not allow 8x"):
        services.instance_launch(user=bob, size="8x", image_key="cpu", project="vllm")

    Project.objects.filter(pk=vllm.pk).update(entitled_8x=True)
    assert services.instance_launch(user=bob, size="8x", image_key="cpu", project="vllm").size == "8x"


def test_it_refuses_when_the_pool_cannot_cover_the_launch_minimum(vllm, bob, cpu):
    give(bob, 100)  # his own credit does not pay for the project
    fund(vllm, 0.2)  # 12 minutes of one GPU, the minimum is 15
    with pytest.raises(ValidationError, match="pool cannot cover"):
        services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")


def test_it_counts_what_the_projects_other_live_instances_will_burn(vllm, alice, bob, cpu):
    fund(vllm, 0.5)  # two launches' 15 minutes, not three
    services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")
    services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    Project.objects.filter(pk=vllm.pk).update(max_live_instances=5)
    with pytest.raises(ValidationError, match="pool cannot cover"):
        services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")


def test_it_limits_the_projects_live_instances_whoever_launched_them(vllm, alice, bob, cpu):
    fund(vllm, 100)
    services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")
    services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    with pytest.raises(ValidationError, match="limit is 2 at once"):
        services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")


def test_it_does_not_count_project_instances_against_personal_credit(vllm, bob, cpu):
    fund(vllm, 100)
    give(bob, 0.25)  # exactly one personal 1x launch
    services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    assert services.instance_launch(user=bob, size="1x", image_key="cpu").project is None


def test_it_refuses_a_launch_past_the_members_monthly_cap(vllm, bob, cpu):
    fund(vllm, 100)
    Project.objects.filter(pk=vllm.pk).update(member_monthly_cap_gpu_seconds=HOUR)
    spent = services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    services.instance_request_stop(instance_id=spent.id, reason="user")
    # The pool paid 50 minutes of bob's instance this month: 10 left, a launch needs 15.
    LedgerEntry.objects.create(
        account=vllm.credit_account, kind="usage", gpu_seconds=-50 * 60, balance_after=0,
        idempotency_key="usage:test", reason="test usage", instance=spent,
    )  # fmt: skip

    with pytest.raises(ValidationError, match="monthly cap of 1.00 GPU-hours"):
        services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")


def test_it_counts_only_this_months_usage_and_only_the_members_own_against_the_cap(vllm, alice, bob, cpu):
    fund(vllm, 100)
    alices = services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")
    bobs = services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    for instance, minutes in ((alices, 60), (bobs, 20)):
        LedgerEntry.objects.create(
            account=vllm.credit_account, kind="usage", gpu_seconds=-minutes * 60, balance_after=0,
            idempotency_key=f"usage:{instance.id}", reason="test usage", instance=instance,
        )  # fmt: skip
    now = timezone.now()
    next_month = (now.replace(day=1) + timedelta(days=32)).replace(day=1, hour=1)

    assert services.member_usage_this_month(project_id=vllm.pk, user=bob, now=now) == 20 * 60
    # The ledger cannot be backdated, so the month turns instead: nothing of it counts then.
    assert services.member_usage_this_month(project_id=vllm.pk, user=bob, now=next_month) == 0


def test_it_counts_the_members_live_project_instances_against_the_cap(vllm, bob, cpu):
    fund(vllm, 100)
    Project.objects.filter(pk=vllm.pk).update(member_monthly_cap_gpu_seconds=25 * 60, max_live_instances=5)
    services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    # 15 minutes committed by the live one, plus 15 for this launch, is past 25.
    with pytest.raises(ValidationError, match="monthly cap"):
        services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")


def test_it_writes_the_project_on_the_instance_and_leaves_personal_launches_alone(vllm, alice, cpu):
    give(alice, 1)
    fund(vllm, 1)
    personal = services.instance_launch(user=alice, size="1x", image_key="cpu")
    project = services.instance_launch(user=alice, size="1x", image_key="cpu", project=vllm)

    assert personal.project_id is None and project.project_id == vllm.pk
    assert pool_balance(vllm) == HOUR and balance(alice) == HOUR


# --- Races: two members at once, each on their own connection ------------------------------------------


def _racing_members(monkeypatch, *, pool_hours, max_live=2):
    """alice (owner) and bob (member) of vllm, funded with `pool_hours`. Each launch dawdles a moment
    after reading the project's live instances, so without the pool's lock both would read before either
    inserts."""
    fake.make_image("cpu")
    alice = make_user("alice@example.com")
    bob = make_user("bob@example.com")
    project = project_services.project_create(user=alice, slug="vllm", name="vLLM")
    add_member(project, bob)
    Project.objects.filter(pk=project.pk).update(max_live_instances=max_live)
    fund(project, pool_hours)
    read = selectors.project_burning

    def slow_read(*args, **kwargs):
        found = read(*args, **kwargs)
        time.sleep(0.5)
        return found

    monkeypatch.setattr(selectors, "project_burning", slow_read)
    return alice, bob


def _launch_each(users):
    """Launch for vllm as each of `users` at once, on their own connections: (launched, refused)."""
    turn, taking = iter(users), threading.Lock()

    def launch():
        with taking:
            user = next(turn)
        return services.instance_launch(user=user, size="1x", image_key="cpu", project="vllm")

    return at_once(launch, count=len(users))


@pytest.mark.django_db(transaction=True)
def test_it_lets_exactly_one_of_two_members_racing_for_the_pools_last_hour_through(monkeypatch):
    alice, bob = _racing_members(monkeypatch, pool_hours=0.4)  # 24 minutes: one launch's 15, not two

    launched, refused = _launch_each([alice, bob])

    assert len(launched) == 1 and len(refused) == 1
    assert isinstance(refused[0], ValidationError) and "pool cannot cover" in str(refused[0])
    assert Instance.objects.filter(project__slug="vllm").count() == 1


@pytest.mark.django_db(transaction=True)
def test_it_lets_exactly_one_of_two_members_racing_for_the_projects_last_slot_through(monkeypatch):
    alice, bob = _racing_members(monkeypatch, pool_hours=100, max_live=1)

    launched, refused = _launch_each([alice, bob])

    assert len(launched) == 1 and len(refused) == 1
    assert isinstance(refused[0], ValidationError) and "limit is 1 at once" in str(refused[0])
    assert Instance.objects.filter(project__slug="vllm").count() == 1
