from pytest_django.asserts import assertContains, assertNotContains

from portal.credits import services
from portal.credits.models import LedgerEntry
from tests.conftest import give


def rows(response):
    return response.content.decode().split('id="result_list"', 1)[1].split("</table>", 1)[0]


def test_it_lists_entries_filtered_by_kind(alice, bob, olivia_client):
    services.credits_grant_signup(user=alice)
    give(bob, -1, reason="Correction for bob")

    adjustments = rows(olivia_client.get("/admin/credits/ledgerentry/?kind__exact=adjustment"))

    assert "Correction for bob" in adjustments
    assert "Early-registrant grant" not in adjustments


def test_it_searches_entries_by_user_email(alice, bob, olivia_client):
    give(alice, 1, reason="For alice")
    give(bob, 1, reason="For bob")

    found = rows(olivia_client.get("/admin/credits/ledgerentry/?q=alice@example.com"))

    assert "For alice" in found and "For bob" not in found


def test_it_links_from_the_user_page_to_that_users_whole_ledger(alice, bob, olivia_client):
    give(alice, 1, reason="For alice")
    give(bob, 1, reason="For bob")
    account_id = LedgerEntry.objects.get(reason="For alice").account_id

    assertContains(
        olivia_client.get(f"/admin/accounts/user/{alice.pk}/change/"), f"?account__id__exact={account_id}"
    )
    found = rows(olivia_client.get(f"/admin/credits/ledgerentry/?account__id__exact={account_id}"))
    assert "For alice" in found and "For bob" not in found


def test_it_shows_an_entry_without_any_way_to_change_it(alice, olivia_client):
    entry = give(alice, 5, reason="Voucher")

    page = olivia_client.get(f"/admin/credits/ledgerentry/{entry.pk}/change/")

    assertContains(page, "Voucher")
    assertNotContains(page, 'name="_save"')
    assertNotContains(page, "deletelink")


def test_it_refuses_to_add_change_or_delete_entries(alice, olivia_client):
    entry = give(alice, 5, reason="Voucher")

    assert olivia_client.get("/admin/credits/ledgerentry/add/").status_code == 403
    change = olivia_client.post(
        f"/admin/credits/ledgerentry/{entry.pk}/change/", {"reason": "Edited", "_save": "Save"}
    )
    delete = olivia_client.post(f"/admin/credits/ledgerentry/{entry.pk}/delete/", {"post": "yes"})
    bulk_delete = olivia_client.post(
        "/admin/credits/ledgerentry/",
        {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"},
    )

    assert (change.status_code, delete.status_code) == (403, 403)
    assert bulk_delete.status_code in (200, 302)  # the action does not exist, so it is ignored
    entry.refresh_from_db()
    assert entry.reason == "Voucher"


def test_it_shows_balances_read_only_on_credit_accounts(alice, olivia_client):
    entry = give(alice, 5, reason="Voucher")

    page = olivia_client.get(f"/admin/credits/creditaccount/{entry.account_id}/change/")
    edit = olivia_client.post(
        f"/admin/credits/creditaccount/{entry.account_id}/change/",
        {"balance_gpu_seconds": "999999", "_save": "Save"},
    )

    assertContains(page, "5.00")
    assertContains(page, f"/admin/credits/creditaccount/adjust/{alice.pk}/")
    assert edit.status_code == 403
    entry.account.refresh_from_db()
    assert entry.account.balance_gpu_seconds == 5 * 3600
