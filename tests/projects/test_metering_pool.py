"""Metering charges the paying account: the project's pool for its instances, the launcher's own account
for personal ones; a pool running dry stops the project's instances only."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from portal.credits import metering
from portal.credits.models import CreditAccount, LedgerEntry
from portal.instances import selectors, services
from portal.instances.models import Instance
from portal.notifications.kinds import render
from portal.notifications.models import Kind, Notification
from portal.projects.models import Project
from tests.conftest import balance, give

from .conftest import HOUR, fund, pool_balance

pytestmark = pytest.mark.usefixtures("cloud", "meter_ticks_every_minute")

T0 = timezone.make_aware(timezone.datetime(2026, 3, 1, 12, 0, 0))
NOW = T0 + timedelta(minutes=3)


class _Undo(Exception):
    pass


def run(user, image, size="1x", project=None, metered_until=T0) -> Instance:
    return Instance.objects.create(
        user=user,
        project=project,
        size=size,
        image=image,
        driver="fake",
        state=Instance.State.RUNNING,
        step=Instance.Step.READY,
        ready_at=T0,
        metered_until=metered_until,
    )


def test_it_charges_a_project_instance_to_the_pool_and_a_personal_one_to_its_owner(vllm, bob, cpu):
    give(bob, 10)
    fund(vllm, 10)
    pooled, personal = run(bob, cpu, project=vllm), run(bob, cpu)

    metering.meter_tick(NOW)

    assert pool_balance(vllm) == 10 * HOUR - 180
    assert balance(bob) == 10 * HOUR - 180
    usage = LedgerEntry.objects.filter(kind="usage")
    assert usage.get(account__project=vllm).instance_id == pooled.id
    assert usage.get(account__user=bob).instance_id == personal.id


def test_it_stops_the_projects_instances_when_the_pool_runs_dry_and_not_the_members_own(
    vllm, alice, bob, cpu
):
    give(bob, 10)
    fund(vllm, 100 / HOUR)  # 100 GPU-seconds: gone within the tick
    pooled = [run(alice, cpu, project=vllm), run(bob, cpu, project=vllm)]
    queued = Instance.objects.create(user=bob, project=vllm, size="1x", image=cpu, driver="fake")
    personal = run(bob, cpu)

    result = metering.meter_tick(NOW)

    assert sorted(result.stopping_ids) == sorted(i.id for i in pooled)
    assert result.stopped_queued_ids == [queued.id]
    for instance in pooled:
        instance.refresh_from_db()
        assert (instance.state, instance.stop_reason) == ("stopping", "credits_exhausted")
    personal.refresh_from_db()
    assert personal.state == "running"
    assert balance(bob) == 10 * HOUR - 180


def test_it_stops_a_members_own_instances_when_they_run_out_and_not_the_projects(vllm, bob, cpu):
    give(bob, 100 / HOUR)
    fund(vllm, 10)
    pooled, personal = run(bob, cpu, project=vllm), run(bob, cpu)

    metering.meter_tick(NOW)

    pooled.refresh_from_db(), personal.refresh_from_db()
    assert pooled.state == "running"
    assert (personal.state, personal.stop_reason) == ("stopping", "credits_exhausted")


def test_it_sends_no_personal_credit_warning_for_a_pool_running_low(vllm, bob, cpu):
    give(bob, 0.5)  # his own half hour would warn at his running GPUs' burn, were they his
    fund(vllm, 0.5)
    run(bob, cpu, project=vllm)

    metering.meter_tick(NOW)

    assert not Notification.objects.filter(kind__in=[Kind.CREDIT_LOW_1H, Kind.CREDIT_LOW_10M]).exists()


def test_it_still_warns_an_owner_whose_own_credit_runs_low(bob, cpu):
    give(bob, 0.5)
    run(bob, cpu)

    metering.meter_tick(NOW)

    assert Notification.objects.filter(user=bob, kind=Kind.CREDIT_LOW_1H).exists()


def test_a_stop_charges_a_project_instance_to_the_pool_up_to_the_stop(vllm, bob, cpu):
    fund(vllm, 1)
    give(bob, 1)
    instance = run(bob, cpu, project=vllm, metered_until=timezone.now() - timedelta(seconds=30))

    services.instance_stop(user=bob, instance_id=instance.id)

    charged = LedgerEntry.objects.get(kind="usage")
    assert charged.account.project_id == vllm.pk and charged.instance_id == instance.id
    assert 30 <= -charged.gpu_seconds <= 32
    assert balance(bob) == HOUR


def _mixed_fleet(vllm, triton, alice, bob, dave, cpu):
    """Personal owners and two pools, one of which runs out part-way through its instances."""
    Project.objects.filter(pk=triton.pk).update(entitled_8x=True)
    give(alice, 10), give(bob, 700 / HOUR), give(dave, 10)
    fund(vllm, 10), fund(triton, 700 / HOUR)
    (
        run(alice, cpu),
        run(alice, cpu, project=vllm),
        run(bob, cpu, project=vllm, metered_until=T0 + timedelta(seconds=0.25)),
    )
    run(bob, cpu), run(bob, cpu, "8x")
    run(dave, cpu, project=triton), run(dave, cpu, "8x", project=triton), run(bob, cpu, project=triton)
    run(dave, cpu, "8x")


def _charges_and_balances():
    entries = sorted(
        LedgerEntry.objects.filter(kind="usage").values_list(
            "account_id", "gpu_seconds", "balance_after", "idempotency_key", "reason", "instance_id"
        )
    )
    balances = dict(CreditAccount.objects.values_list("id", "balance_gpu_seconds"))
    metered = dict(Instance.objects.values_list("id", "charged_gpu_seconds"))
    return entries, balances, metered


def _charge_one_by_one(now):
    for instance_id in Instance.objects.filter(state="running").order_by("id").values_list("id", flat=True):
        with transaction.atomic():
            instance = Instance.objects.get(pk=instance_id)
            metering.payer_locked(instance)
            instance = Instance.objects.select_for_update().get(pk=instance_id)
            metering.charge_until(instance=instance, until=now)


def _in_a_rolled_back_transaction(work):
    found = {}
    try:
        with transaction.atomic():
            found["result"] = work()
            found["after"] = _charges_and_balances()
            raise _Undo
    except _Undo:
        pass
    return found["result"], found["after"]


def test_it_charges_pools_in_bulk_exactly_as_charging_each_instance_does(
    vllm, triton, alice, bob, dave, cpu, monkeypatch
):
    _mixed_fleet(vllm, triton, alice, bob, dave, cpu)
    result, in_sql = _in_a_rolled_back_transaction(lambda: metering.meter_tick(NOW, batch_size=3))
    monkeypatch.setattr(metering, "_charge_in_database", metering._charge_in_python)
    _, in_python = _in_a_rolled_back_transaction(lambda: metering.meter_tick(NOW, batch_size=3))
    monkeypatch.undo()

    _charge_one_by_one(NOW)
    one_by_one = _charges_and_balances()

    assert in_sql == one_by_one
    assert in_python == one_by_one
    pool = CreditAccount.objects.get(project=triton)
    # triton's 1 + 8 + 1 GPUs for 3 minutes is 1800 GPU-seconds; its 700 run out, down to the floor.
    assert one_by_one[1][pool.pk] == -10 * 60
    assert result.instances_charged == len(one_by_one[0])


def test_the_launcher_is_told_the_projects_pool_ran_out_not_their_credit(vllm, bob, cpu):
    give(bob, 10)
    fund(vllm, 100 / HOUR)
    instance = run(bob, cpu, project=vllm)

    metering.meter_tick(NOW)

    rendered = render(Notification.objects.get(user=bob, kind=Kind.INSTANCE_STOPPED))
    assert "vLLM's pool ran out" in rendered.subject
    assert "Your own credit was not touched" in rendered.body
    instance.refresh_from_db()
    assert "its project's pool of GPU-hours ran out" in selectors.stop_reason_text(instance)


@pytest.mark.django_db(transaction=True)
def test_two_ticks_at_once_charge_each_pool_and_person_each_period_once():
    from portal.projects import services as project_services
    from provisioning.drivers import fake
    from tests.conftest import make_user
    from tests.support.race import at_once

    from .conftest import add_member

    image = fake.make_image("cpu")
    people = [make_user(f"member{n}@example.com") for n in range(6)]
    pools = [project_services.project_create(user=people[n], slug=f"p{n}", name=f"P{n}") for n in range(3)]
    for person in people:
        give(person, 10)
    for n, project in enumerate(pools):
        fund(project, 10)
        add_member(project, people[n + 3])
        run(people[n], image, project=project), run(people[n + 3], image, "8x", project=project)
    for person in people:
        run(person, image)

    _, errors = at_once(lambda: metering.meter_tick(T0 + timedelta(seconds=60), batch_size=3))

    assert errors == []
    assert LedgerEntry.objects.filter(kind="usage").count() == Instance.objects.count() == 12
    for project in pools:
        assert pool_balance(project) == 10 * HOUR - 60 - 480
    for person in people:
        assert balance(person) == 10 * HOUR - 60
