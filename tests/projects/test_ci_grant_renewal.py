"""The CI programme's grant renews on the renewal day: the previous period's unused grant expires and the
month's grant is posted, once, however often or however concurrently beat runs it; hours granted to the
pool otherwise stay, and an ended grant renews no more (portal/projects/ci_grants.py)."""

from datetime import UTC, datetime

import pytest
from django.conf import settings as django_settings

from portal.credits.models import CreditAccount, LedgerEntry
from portal.credits.services import ledger_post
from portal.projects import ci_grants, services
from portal.projects.tasks import renew_ci_grants
from tests.conftest import make_user
from tests.projects.conftest import HOUR, fund, pool_balance
from tests.support.race import at_once

DEC_10 = datetime(2026, 12, 10, 9, 0, tzinfo=UTC)
JAN_1 = datetime(2027, 1, 1, 0, 30, tzinfo=UTC)
FEB_1 = datetime(2027, 2, 1, 0, 30, tzinfo=UTC)
MAR_1 = datetime(2027, 3, 1, 0, 30, tzinfo=UTC)


def admit(project, owner, operator, *, gpu_hours=100, now=DEC_10):
    application = ci_grants.ci_grant_apply(
        user=owner,
        project=project,
        repository_url="https://github.com/vllm-project/vllm",
        maintainers="alice-gh",
        purpose="GPU CI for every pull request",
    )
    return ci_grants.ci_grant_approve(
        application_id=application.pk, actor=operator, gpu_seconds=gpu_hours * HOUR, now=now
    )


def use(project, gpu_hours, key):
    """The pool pays for `gpu_hours` of GPU time, as a meter tick would."""
    return ledger_post(
        account=CreditAccount.objects.get(project=project),
        kind=LedgerEntry.Kind.USAGE,
        gpu_seconds=-int(gpu_hours * HOUR),
        idempotency_key=f"test-usage:{key}",
        reason="Test usage",
    )


def pool_entries(project, kind):
    return list(
        LedgerEntry.objects.filter(account__project=project, kind=kind)
        .order_by("id")
        .values_list("gpu_seconds", flat=True)
    )


def test_it_expires_what_is_left_of_the_grant_and_grants_the_month_anew(vllm, alice, olivia):
    admit(vllm, alice, olivia)
    use(vllm, 30, "dec")

    renewed = ci_grants.ci_grants_renew(now=JAN_1)

    assert renewed == 1
    assert pool_entries(vllm, LedgerEntry.Kind.EXPIRY) == [-70 * HOUR]
    assert pool_entries(vllm, LedgerEntry.Kind.GRANT) == [100 * HOUR, 100 * HOUR]
    assert pool_balance(vllm) == 100 * HOUR
    assert LedgerEntry.objects.filter(idempotency_key=f"ci-grant:{vllm.pk}:2027-01").exists()


def test_unused_hours_do_not_pile_up_over_three_months(vllm, alice, olivia):
    admit(vllm, alice, olivia)

    balances = []
    for month in (JAN_1, FEB_1, MAR_1):
        ci_grants.ci_grants_renew(now=month)
        balances.append(pool_balance(vllm))

    assert balances == [100 * HOUR, 100 * HOUR, 100 * HOUR]
    assert pool_entries(vllm, LedgerEntry.Kind.EXPIRY) == [-100 * HOUR] * 3


def test_running_it_twice_changes_nothing_more(vllm, alice, olivia):
    admit(vllm, alice, olivia)
    use(vllm, 10, "dec")
    ci_grants.ci_grants_renew(now=JAN_1)
    entries = LedgerEntry.objects.filter(account__project=vllm).count()

    again = ci_grants.ci_grants_renew(now=JAN_1.replace(hour=5))

    assert again == 0
    assert LedgerEntry.objects.filter(account__project=vllm).count() == entries
    assert pool_balance(vllm) == 100 * HOUR


def test_a_renewal_key_posted_already_is_not_posted_again_even_if_the_project_row_says_otherwise(
    vllm, alice, olivia
):
    admit(vllm, alice, olivia)
    ci_grants.ci_grants_renew(now=JAN_1)
    # As if the project's period had been lost: the ledger's keys still stop a second grant.
    type(vllm).objects.filter(pk=vllm.pk).update(ci_grant_period="2026-12")

    ci_grants.ci_grants_renew(now=JAN_1)

    assert pool_entries(vllm, LedgerEntry.Kind.GRANT) == [100 * HOUR, 100 * HOUR]
    assert pool_balance(vllm) == 100 * HOUR


def test_it_leaves_hours_granted_to_the_pool_separately(vllm, alice, olivia):
    fund(vllm, 50)
    admit(vllm, alice, olivia)
    use(vllm, 30, "dec")

    ci_grants.ci_grants_renew(now=JAN_1)

    assert pool_entries(vllm, LedgerEntry.Kind.EXPIRY) == [-70 * HOUR]
    assert pool_balance(vllm) == 150 * HOUR


def test_use_beyond_the_grant_spent_the_separate_hours_and_nothing_expires(vllm, alice, olivia):
    fund(vllm, 50)
    admit(vllm, alice, olivia)
    use(vllm, 120, "dec")

    ci_grants.ci_grants_renew(now=JAN_1)

    assert pool_entries(vllm, LedgerEntry.Kind.EXPIRY) == []
    assert pool_balance(vllm) == (30 + 100) * HOUR


def test_an_ended_grant_expires_its_leftover_and_renews_no_more(vllm, alice, olivia):
    admit(vllm, alice, olivia)
    use(vllm, 40, "dec")
    ci_grants.ci_grant_end(project_id=vllm.pk, actor=olivia, reason="The project moved its CI elsewhere")

    ci_grants.ci_grants_renew(now=JAN_1)
    ci_grants.ci_grants_renew(now=FEB_1)

    assert pool_entries(vllm, LedgerEntry.Kind.GRANT) == [100 * HOUR]
    assert pool_entries(vllm, LedgerEntry.Kind.EXPIRY) == [-60 * HOUR]
    assert pool_balance(vllm) == 0
    assert ci_grants.ci_grants_due(FEB_1) == []


def test_it_waits_for_the_renewal_day(vllm, alice, olivia, settings):
    settings.CI_GRANT_RENEWAL_DAY = 15
    admit(vllm, alice, olivia, now=datetime(2026, 12, 20, tzinfo=UTC))

    before = ci_grants.ci_grants_renew(now=datetime(2027, 1, 14, 23, 59, tzinfo=UTC))
    on_the_day = ci_grants.ci_grants_renew(now=datetime(2027, 1, 15, 0, 1, tzinfo=UTC))

    assert (before, on_the_day) == (0, 1)
    assert LedgerEntry.objects.filter(idempotency_key=f"ci-grant:{vllm.pk}:2027-01").exists()


def test_a_grant_approved_before_the_renewal_day_belongs_to_the_previous_period(
    vllm, alice, olivia, settings
):
    settings.CI_GRANT_RENEWAL_DAY = 15
    admit(vllm, alice, olivia, now=datetime(2027, 1, 3, tzinfo=UTC))

    assert LedgerEntry.objects.filter(idempotency_key=f"ci-grant:{vllm.pk}:2026-12").exists()
    assert ci_grants.period_end("2026-12") == datetime(2027, 1, 15, tzinfo=UTC)


def test_beat_runs_the_renewal_every_hour():
    entry = django_settings.CELERY_BEAT_SCHEDULE["ci-grants-renew"]

    assert entry["task"] == renew_ci_grants.name == "projects.renew_ci_grants"
    assert entry["schedule"] == 3600.0


@pytest.mark.django_db(transaction=True)
def test_two_renewals_at_once_post_one_grant_and_one_expiry():
    alice, olivia = make_user("alice@example.com"), make_user("olivia@ops.example.com", staff=True)
    project = services.project_create(user=alice, slug="vllm", name="vLLM")
    admit(project, alice, olivia)
    use(project, 25, "dec")

    results, errors = at_once(lambda: ci_grants.ci_grants_renew(now=JAN_1), count=2)

    assert errors == []
    assert sorted(results) == [0, 1]
    assert pool_entries(project, LedgerEntry.Kind.GRANT) == [100 * HOUR, 100 * HOUR]
    assert pool_entries(project, LedgerEntry.Kind.EXPIRY) == [-75 * HOUR]
    assert pool_balance(project) == 100 * HOUR


def test_a_project_admitted_again_in_the_same_period_gets_the_new_amount_from_the_next_renewal(
    vllm, alice, olivia
):
    admit(vllm, alice, olivia)
    ci_grants.ci_grant_end(project_id=vllm.pk, actor=olivia, reason="Paused")
    admit(vllm, alice, olivia, gpu_hours=50, now=DEC_10.replace(day=20))

    same_period = pool_balance(vllm)
    ci_grants.ci_grants_renew(now=JAN_1)

    assert same_period == 100 * HOUR
    assert pool_entries(vllm, LedgerEntry.Kind.GRANT) == [100 * HOUR, 50 * HOUR]
    assert pool_balance(vllm) == 50 * HOUR


def test_a_worker_whose_clock_is_behind_does_not_renew_backwards(vllm, alice, olivia):
    admit(vllm, alice, olivia)
    ci_grants.ci_grants_renew(now=JAN_1)
    entries = LedgerEntry.objects.filter(account__project=vllm).count()

    late = ci_grants.ci_grant_renew(project_id=vllm.pk, now=datetime(2026, 12, 31, 23, 59, tzinfo=UTC))

    assert late is False
    assert LedgerEntry.objects.filter(account__project=vllm).count() == entries
