from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django.asserts import assertContains, assertNotContains

from portal.credits import services
from portal.credits.models import BonusApplication, CreditAccount
from tests.conftest import give

from .conftest import HOUR


def test_it_shows_the_signup_grant_in_balance_and_history(alice, alice_client):
    services.credits_grant_signup(user=alice)

    response = alice_client.get("/")

    assertContains(
        response, '<span class="balance-badge" data-testid="balance">25.00 GPU-hours</span>', html=True
    )
    ledger = response.content.decode().split('data-testid="ledger"', 1)[1]
    for cell in ("Grant", "Early-registrant grant", "+25.00", "system"):
        assert cell in ledger


def test_it_shows_both_sizes_with_price_and_how_long_the_balance_lasts(alice, alice_client):
    give(alice, 25)

    response = alice_client.get("/")

    assertContains(response, "1x MI300X")
    assertContains(response, "1 GPU-hour per hour")
    assertContains(response, "8x MI300X")
    assertContains(response, "8 GPU-hours per hour")
    # 25 GPU-hours last 25 h on one GPU and 25/8 h = 3 h 07 min on eight.
    assertContains(response, "<strong>25 h 00 min</strong>", html=True)
    assertContains(response, "<strong>3 h 07 min</strong>", html=True)


def test_it_offers_a_launch_link_for_each_size(alice_client):
    response = alice_client.get("/")

    assertContains(response, 'href="/instances/?size=1x"')
    assertContains(response, 'href="/instances/?size=8x"')


def test_it_shows_each_movement_with_sign_balance_after_and_operator(alice, alice_client, olivia):
    give(alice, 10, reason="Workshop voucher", actor=olivia)
    give(alice, -2.5, reason="Double grant corrected", actor=olivia)

    response = alice_client.get("/")

    ledger = response.content.decode().split('data-testid="ledger"', 1)[1]
    assert "Workshop voucher" in ledger and "+10.00" in ledger
    assert "Double grant corrected" in ledger and "-2.50" in ledger
    assert "7.50" in ledger
    assert "Olivia Operator" in ledger
    # Newest first.
    assert ledger.index("Double grant corrected") < ledger.index("Workshop voucher")


def test_a_charge_of_a_few_seconds_shows_in_the_ledger_as_more_than_nothing(alice, alice_client):
    give(alice, 25)
    give(alice, -10 / HOUR, reason="Ten seconds")

    response = alice_client.get("/")

    ledger = response.content.decode().split('data-testid="ledger"', 1)[1]
    row = ledger[ledger.index("Ten seconds") :].split("</tr>", 1)[0]
    assert "-0.0028" in row and "-0.00<" not in row
    assert "25.00" in row  # the balance after it still shows in hundredths


def test_it_shows_zero_and_what_confirming_unlocks_to_an_unverified_user(charlie, charlie_client):
    services.credits_grant_signup(user=charlie)  # no verified identity: nothing granted

    response = charlie_client.get("/")

    assertContains(
        response, '<span class="balance-badge empty" data-testid="balance">0.00 GPU-hours</span>', html=True
    )
    assertContains(response, "Confirm your email address to unlock")
    assertContains(response, "the 25.00 free GPU-hours of the early-registrant grant")


def test_it_does_not_show_the_unlock_note_to_a_verified_user(alice_client):
    assertNotContains(alice_client.get("/"), 'data-testid="unverified-note"')


def test_it_summarises_bonus_applications_and_links_to_the_bonus_page(alice, alice_client, rocm_star):
    services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-1")

    response = alice_client.get("/")

    summary = response.content.decode().split('data-testid="bonus-summary"', 1)[1]
    assert "Pending review" in summary
    assertContains(response, 'href="/bonus/"')


def test_it_summarises_a_rejection(alice, alice_client, rocm_star, olivia):
    application = services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-1")
    services.bonus_reject(application_id=application.pk, actor=olivia, reason="Certificate not found")

    response = alice_client.get("/")

    assert BonusApplication.objects.get().status == "rejected"
    summary = response.content.decode().split('data-testid="bonus-summary"', 1)[1]
    assert "Rejected" in summary


def test_the_dashboard_reads_the_database_six_times_however_long_the_history(alice, alice_client, olivia):
    # Session, user, the latest entries with the balance, bonus applications, the latest instance, and the
    # notifications with their unread count: what 50 people polling it cost the database.
    def dashboard_queries():
        with CaptureQueriesContext(connection) as captured:
            response = alice_client.get("/")
        assert response.status_code == 200
        return captured

    give(alice, 10, reason="Workshop voucher", actor=olivia)
    few = dashboard_queries()
    for number in range(30):
        give(alice, -0.1, reason=f"Use {number}", actor=olivia)
    many = dashboard_queries()

    assert len(few) == len(many) == 6, [query["sql"][:80] for query in many.captured_queries]
    # The balance comes with the entries and is the account's own, not an entry's running total.
    CreditAccount.objects.filter(user=alice).update(balance_gpu_seconds=7 * 3600)
    badge = '<span class="balance-badge" data-testid="balance">7.00 GPU-hours</span>'
    assertContains(alice_client.get("/"), badge, html=True)
