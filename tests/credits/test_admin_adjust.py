import re
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from pytest_django.asserts import assertContains, assertRedirects

from portal.credits.models import CreditAccount
from tests.conftest import give

from .conftest import entries_of, shown_messages

HOUR = 3600


def adjust_url(user):
    return f"/admin/credits/creditaccount/adjust/{user.pk}/"


def rendered_key(client, user):
    """The idempotency key the form carries, as a browser would submit it."""
    page = client.get(adjust_url(user))
    return re.search(r'name="idempotency_key" value="([0-9a-f-]+)"', page.content.decode()).group(1)


def balance_of(user):
    return CreditAccount.objects.get(user=user).balance_gpu_seconds


def test_it_shows_the_form_with_the_current_balance(alice, olivia_client):
    give(alice, 12)

    page = olivia_client.get(adjust_url(alice))

    assertContains(page, "Grant or correct credits: alice@example.com")
    assertContains(page, '<strong data-testid="balance">12.00 GPU-hours</strong>', html=True)
    assert rendered_key(olivia_client, alice) != rendered_key(olivia_client, alice)


def test_it_links_to_the_form_from_the_user_page(alice, olivia_client):
    assertContains(olivia_client.get(f"/admin/accounts/user/{alice.pk}/change/"), adjust_url(alice))


def test_it_grants_hours_with_a_reason_and_records_the_operator(alice, olivia, olivia_client):
    key = rendered_key(olivia_client, alice)

    response = olivia_client.post(
        adjust_url(alice), {"hours": "5", "reason": "Conference voucher", "idempotency_key": key}, follow=True
    )

    assertRedirects(response, f"/admin/accounts/user/{alice.pk}/change/")
    assert "+5.00 GPU-hours for alice@example.com. New balance: 5.00 GPU-hours." in shown_messages(response)
    entry = entries_of(alice).get()
    assert (entry.kind, entry.gpu_seconds, entry.reason) == ("grant", 5 * HOUR, "Conference voucher")
    assert (entry.actor, entry.actor_name) == (olivia, "Olivia Operator")
    assert balance_of(alice) == 5 * HOUR
    log = LogEntry.objects.get(user=olivia, object_id=str(alice.pk))
    assert "Conference voucher" in log.get_change_message()


def test_it_corrects_downwards_with_a_negative_amount(alice, olivia, olivia_client):
    give(alice, 10)

    response = olivia_client.post(
        adjust_url(alice),
        {"hours": "-2.5", "reason": "Double grant", "idempotency_key": rendered_key(olivia_client, alice)},
        follow=True,
    )

    assert "-2.50 GPU-hours for alice@example.com. New balance: 7.50 GPU-hours." in shown_messages(response)
    correction = entries_of(alice).get(kind="adjustment")
    assert (correction.gpu_seconds, correction.balance_after, correction.actor) == (-9000, 7.5 * HOUR, olivia)
    assert balance_of(alice) == 7.5 * HOUR


def test_it_shows_the_developer_the_reason_and_the_operator(alice, alice_client, olivia_client):
    olivia_client.post(
        adjust_url(alice),
        {
            "hours": "3",
            "reason": "Sorry for the outage",
            "idempotency_key": rendered_key(olivia_client, alice),
        },
    )

    dashboard = alice_client.get("/")

    assertContains(dashboard, "Sorry for the outage")
    assertContains(dashboard, "Olivia Operator")


def test_it_posts_once_when_the_form_is_submitted_twice(alice, olivia_client):
    form = {
        "hours": "5",
        "reason": "Conference voucher",
        "idempotency_key": rendered_key(olivia_client, alice),
    }
    olivia_client.post(adjust_url(alice), form)

    again = olivia_client.post(adjust_url(alice), form, follow=True)

    assert entries_of(alice).count() == 1
    assert balance_of(alice) == 5 * HOUR
    assert (
        "This adjustment was already posted (the form was submitted twice); nothing more changed. "
        "Balance of alice@example.com: 5.00 GPU-hours." in shown_messages(again)
    )


def test_it_posts_two_separately_rendered_forms_twice(alice, olivia_client):
    for _ in range(2):
        key = rendered_key(olivia_client, alice)
        olivia_client.post(adjust_url(alice), {"hours": "5", "reason": "Voucher", "idempotency_key": key})

    assert balance_of(alice) == 10 * HOUR


def test_it_does_not_mix_up_users_who_share_a_key(alice, bob, olivia_client):
    key = rendered_key(olivia_client, alice)
    olivia_client.post(adjust_url(alice), {"hours": "5", "reason": "Voucher", "idempotency_key": key})

    olivia_client.post(adjust_url(bob), {"hours": "5", "reason": "Voucher", "idempotency_key": key})

    assert (balance_of(alice), balance_of(bob)) == (5 * HOUR, 5 * HOUR)


@pytest.mark.parametrize(
    "form, message",
    [
        ({"hours": "", "reason": "Voucher"}, "Enter a number of GPU-hours."),
        ({"hours": "0", "reason": "Voucher"}, "An adjustment of zero hours changes nothing."),
        ({"hours": "0.001", "reason": "Voucher"}, "Use at most two decimals"),
        ({"hours": "five", "reason": "Voucher"}, "Enter the hours as a number, for example 5 or 2.5."),
        ({"hours": "1e9", "reason": "Voucher"}, "Ensure this value is less than or equal to 100000."),
        ({"hours": "NaN", "reason": "Voucher"}, "Enter the hours as a number, for example 5 or 2.5."),
        ({"hours": "5", "reason": ""}, "Give a reason; it is recorded in the ledger."),
        ({"hours": "5", "reason": "   "}, "Give a reason; it is recorded in the ledger."),
        ({"hours": "5", "reason": "Voucher", "idempotency_key": ""}, "This form has expired."),
        ({"hours": "5", "reason": "Voucher", "idempotency_key": "not-a-key"}, "This form has expired."),
    ],
)
def test_it_refuses_bad_input_and_changes_nothing(alice, olivia_client, form, message):
    form = {"idempotency_key": str(uuid.uuid4()), **form}

    response = olivia_client.post(adjust_url(alice), form)

    assert response.status_code == 200
    assertContains(response, message)
    assert not entries_of(alice).exists()
    assert not LogEntry.objects.exists()


def test_it_answers_404_for_an_unknown_user(olivia_client):
    assert olivia_client.get("/admin/credits/creditaccount/adjust/999999/").status_code == 404


def test_it_sends_a_non_staff_user_to_the_console_login(alice, bob_client):
    response = bob_client.post(
        adjust_url(alice), {"hours": "100", "reason": "Free hours", "idempotency_key": str(uuid.uuid4())}
    )

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert not entries_of(alice).exists()


def test_it_refuses_staff_without_the_credits_permission(alice, oscar):
    client = Client()
    client.force_login(oscar)

    response = client.post(
        adjust_url(alice), {"hours": "100", "reason": "Free hours", "idempotency_key": str(uuid.uuid4())}
    )

    assert response.status_code == 403
    assert not entries_of(alice).exists()
