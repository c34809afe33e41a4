"""The dashboard shows the latest credit movements; the history page pages through every one of them."""

from pytest_django.asserts import assertContains, assertNotContains

from portal.credits.selectors import DASHBOARD_LEDGER_ROWS, HISTORY_PAGE_ROWS
from tests.conftest import give


def _ledger(response) -> str:
    return response.content.decode().split('data-testid="ledger"', 1)[1]


def test_the_dashboard_shows_the_latest_movements_and_links_to_the_full_history(alice, alice_client):
    for number in range(DASHBOARD_LEDGER_ROWS + 2):
        give(alice, 1, reason=f"Voucher number {number:03d}")

    response = alice_client.get("/")

    ledger = _ledger(response)
    assert f"Voucher number {DASHBOARD_LEDGER_ROWS + 1:03d}" in ledger
    assert "Voucher number 001" not in ledger
    assert ledger.count("<tr>") == DASHBOARD_LEDGER_ROWS + 1  # header row plus the movements shown
    assertContains(response, 'href="/history/"')


def test_the_dashboard_has_no_history_link_when_it_shows_everything(alice, alice_client):
    give(alice, 1, reason="Only voucher")

    assertNotContains(alice_client.get("/"), 'data-testid="full-history"')


def test_the_history_pages_through_every_movement_newest_first(alice, alice_client):
    total = HISTORY_PAGE_ROWS + 3
    for number in range(total):
        give(alice, 1, reason=f"Voucher number {number:03d}")

    first = alice_client.get("/history/")
    second = alice_client.get("/history/?page=2")

    assert first.status_code == 200 and second.status_code == 200
    assert f"Voucher number {total - 1:03d}" in _ledger(first)
    assert "Voucher number 002" not in _ledger(first)
    assert all(f"Voucher number {n:03d}" in _ledger(second) for n in range(3))
    assertContains(first, "Page 1 of 2")
    assertContains(first, 'href="?page=2"')
    assertContains(alice_client.get("/history/"), f"{total}.00 GPU-hours")


def test_the_history_shows_only_the_persons_own_movements_and_survives_a_bad_page_number(
    alice, alice_client, bob
):
    give(alice, 2, reason="Alice's voucher")
    give(bob, 3, reason="Bob's voucher")

    response = alice_client.get("/history/?page=banana")

    assert response.status_code == 200
    assertContains(response, "Alice&#x27;s voucher")
    assertNotContains(response, "Bob")


def test_the_history_asks_a_visitor_to_log_in(client):
    response = client.get("/history/")

    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
