"""The operators' screens: a pool's account page reads (it has no user), and an operator can entitle a
project to 8x."""

from portal.credits.models import CreditAccount
from tests.conftest import text


def test_the_credit_account_screen_shows_a_pool_without_an_owner(olivia_client, vllm):
    pool = CreditAccount.objects.get(project=vllm)
    listed = olivia_client.get("/admin/credits/creditaccount/")
    page = olivia_client.get(f"/admin/credits/creditaccount/{pool.pk}/change/")

    assert listed.status_code == 200 and "vllm" in text(listed)
    assert page.status_code == 200 and "Its owners see its usage on the project" in text(page)


def test_the_operators_project_screen_offers_the_8x_entitlement(olivia_client, vllm):
    page = olivia_client.get(f"/admin/projects/project/{vllm.pk}/change/")
    assert page.status_code == 200 and "entitled_8x" in page.content.decode()


def test_the_console_dashboard_ranks_people_and_still_draws_once_a_pool_has_burned(
    olivia_client, vllm, bob, cpu
):
    from datetime import timedelta

    from django.utils import timezone

    from portal.console import selectors
    from portal.console.timeranges import TimeRange
    from portal.credits import metering
    from portal.instances.models import Instance

    from .conftest import fund

    fund(vllm, 10)
    since = timezone.now() - timedelta(minutes=5)
    Instance.objects.create(
        user=bob, project=vllm, size="1x", image=cpu, driver="fake",
        state="running", step="ready", ready_at=since, metered_until=since,
    )  # fmt: skip
    metering.meter_tick()

    page = olivia_client.get("/console/")

    assert page.status_code == 200
    last_day = TimeRange(
        key="custom", start=timezone.now() - timedelta(days=1), end=timezone.now() + timedelta(minutes=1)
    )
    assert selectors.top_burners(last_day) == []


def test_the_ledger_screen_names_a_pools_entries_by_their_project(olivia_client, vllm):
    from .conftest import fund

    entry = fund(vllm, 1)
    listed = olivia_client.get("/admin/credits/ledgerentry/")
    page = olivia_client.get(f"/admin/credits/ledgerentry/{entry.pk}/change/")

    assert listed.status_code == 200 and "project vllm (its pool)" in text(listed)
    assert page.status_code == 200 and "project vllm (its pool)" in text(page)
