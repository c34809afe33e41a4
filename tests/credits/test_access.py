"""Who may see what: developers see only their own credits; the console is for operators only."""

import pytest
from django.test import Client
from pytest_django.asserts import assertContains, assertNotContains

from portal.credits import services
from portal.credits.models import BonusApplication, LedgerEntry
from tests.conftest import give


@pytest.fixture
def alices_credits(alice, olivia, rocm_star):
    """Alice's balance (37.25 h), ledger and applications, each with a marker bob must never see."""
    give(alice, 37.25, reason="Alice private voucher", actor=olivia)
    first = services.bonus_apply(user=alice, program=rocm_star, evidence="ALICE-CERT-0001")
    services.bonus_reject(application_id=first.pk, actor=olivia, reason="Alice rejection reason")
    services.bonus_apply(user=alice, program=rocm_star, evidence="ALICE-CERT-0002")
    return alice


ALICE_MARKERS = [
    "37.25",
    "Alice private voucher",
    "ALICE-CERT",
    "Alice rejection reason",
    "alice@example.com",
]


@pytest.mark.parametrize("url", ["/", "/bonus/"])
def test_it_never_shows_bob_alices_credits(alices_credits, bob, bob_client, url):
    give(bob, 3, reason="Bob voucher")

    page = bob_client.get(url)

    assert page.status_code == 200
    for marker in ALICE_MARKERS:
        assertNotContains(page, marker)


def test_it_shows_bob_his_own_credits(alices_credits, bob, bob_client):
    give(bob, 3, reason="Bob voucher")

    page = bob_client.get("/")

    assertContains(page, '<span class="balance-badge" data-testid="balance">3.00 GPU-hours</span>', html=True)
    assertContains(page, "Bob voucher")
    assertNotContains(page, 'data-testid="bonus-summary"')  # alice's applications are not his


def test_it_files_bobs_application_under_bob_only(alices_credits, bob, bob_client, rocm_star):
    bob_client.post("/bonus/", {"program": rocm_star.pk, "evidence": "BOB-CERT"})

    assert BonusApplication.objects.get(evidence="BOB-CERT").user == bob
    assert BonusApplication.objects.filter(user=alices_credits).count() == 2


def test_it_sends_anonymous_visitors_to_login(client):
    response = client.get("/bonus/")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_it_shows_anonymous_visitors_what_devcloud_is_with_sign_up_and_log_in_and_no_ledger(client, db):
    response = client.get("/")

    assert response.status_code == 200
    assertContains(response, "25.00 free GPU-hours")
    assertContains(response, "8x MI300X")
    assertContains(response, 'href="/accounts/signup/"')
    assertContains(response, 'href="/accounts/login/"')
    assertNotContains(response, 'data-testid="ledger"')


def test_it_files_nothing_for_an_anonymous_post(client, rocm_star):
    client.post("/bonus/", {"program": rocm_star.pk, "evidence": "ANON-CERT"})

    assert not BonusApplication.objects.exists()


def console_urls(alice):
    application = BonusApplication.objects.filter(user=alice).first()
    entry = LedgerEntry.objects.filter(account__user=alice).first()
    return [
        "/admin/",
        "/admin/accounts/user/",
        f"/admin/accounts/user/{alice.pk}/change/",
        "/admin/credits/creditaccount/",
        f"/admin/credits/creditaccount/{entry.account_id}/change/",
        f"/admin/credits/creditaccount/adjust/{alice.pk}/",
        "/admin/credits/ledgerentry/",
        f"/admin/credits/ledgerentry/{entry.pk}/change/",
        "/admin/credits/bonusapplication/",
        f"/admin/credits/bonusapplication/{application.pk}/change/",
        "/admin/credits/bonusprogram/",
        "/admin/credits/signupgrantprogram/",
    ]


def test_it_sends_developers_and_anonymous_visitors_away_from_every_console_page(alices_credits, bob_client):
    for client in (bob_client, Client()):
        for url in console_urls(alices_credits):
            response = client.get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith("/admin/login/"), url


def test_it_refuses_a_developers_review_decision(alices_credits, bob_client):
    pending = BonusApplication.objects.get(user=alices_credits, status="pending")

    bob_client.post(
        f"/admin/credits/bonusapplication/{pending.pk}/change/",
        {"approve-hours": "50", "_approve": "Approve"},
    )

    pending.refresh_from_db()
    assert pending.status == "pending"


def test_it_refuses_staff_without_permissions_on_credit_pages(alices_credits, oscar):
    client = Client()
    client.force_login(oscar)
    pending = BonusApplication.objects.get(user=alices_credits, status="pending")

    for url in console_urls(alices_credits)[1:]:
        assert client.get(url).status_code == 403, url
    client.post(
        f"/admin/credits/bonusapplication/{pending.pk}/change/", {"approve-hours": "50", "_approve": "1"}
    )
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_it_lets_an_operator_open_every_console_page(alices_credits, olivia_client):
    for url in console_urls(alices_credits):
        assert olivia_client.get(url).status_code == 200, url
