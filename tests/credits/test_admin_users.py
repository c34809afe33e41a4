from django.contrib.admin.models import ADDITION, LogEntry
from pytest_django.asserts import assertContains
from social_django.models import UserSocialAuth

from portal.accounts.models import User
from portal.credits import services
from tests.conftest import give

from ..conftest import PASSWORD


def user_rows(response):
    """The changelist's result table, without the filter sidebar (which names no users)."""
    return response.content.decode().split('id="result_list"', 1)[1].split("</table>", 1)[0]


def test_it_lists_users_with_balance_verification_and_github_login(alice, charlie, olivia_client):
    give(alice, 25)
    UserSocialAuth.objects.create(
        user=alice, provider="github", uid="583231", extra_data={"login": "alice-gh"}
    )

    rows = user_rows(olivia_client.get("/admin/accounts/user/"))

    alice_row = next(row for row in rows.split("<tr") if "alice@example.com" in row)
    assert "Alice" in alice_row and "25.00" in alice_row and "alice-gh" in alice_row
    assert 'alt="True"' in alice_row  # verified
    charlie_row = next(row for row in rows.split("<tr") if "charlie@example.com" in row)
    assert "0.00" in charlie_row and 'alt="False"' in charlie_row


def test_it_searches_users_by_email(alice, bob, olivia_client):
    rows = user_rows(olivia_client.get("/admin/accounts/user/?q=bob@example"))

    assert "bob@example.com" in rows
    assert "alice@example.com" not in rows


def test_it_filters_users_by_verification_and_github(alice, charlie, olivia_client):
    UserSocialAuth.objects.create(
        user=alice, provider="github", uid="583231", extra_data={"login": "alice-gh"}
    )

    unverified = user_rows(olivia_client.get("/admin/accounts/user/?verified=no"))
    with_github = user_rows(olivia_client.get("/admin/accounts/user/?github=yes"))

    assert "charlie@example.com" in unverified and "alice@example.com" not in unverified
    assert "alice@example.com" in with_github and "charlie@example.com" not in with_github


def test_it_shows_the_ledger_and_applications_read_only_on_the_user_page(
    alice, olivia, olivia_client, rocm_star
):
    give(alice, 10, reason="Workshop voucher", actor=olivia)
    services.bonus_apply(user=alice, program=rocm_star, evidence="ROCM-STAR-0042")

    page = olivia_client.get(f"/admin/accounts/user/{alice.pk}/change/")

    ledger = page.content.decode().split('data-testid="ledger"', 1)[1]
    assert "Workshop voucher" in ledger and "+10.00" in ledger and "Olivia Operator" in ledger
    assertContains(page, "ROCM-STAR-0042")


def test_it_adds_a_user_with_an_email_and_no_username(olivia, olivia_client, client):
    response = olivia_client.post(
        "/admin/accounts/user/add/",
        {
            "email": "Dana@Example.com",
            "usable_password": "true",
            "password1": PASSWORD,
            "password2": PASSWORD,
        },
    )

    assert response.status_code == 302
    dana = User.objects.get(email="dana@example.com")
    assert dana.check_password(PASSWORD)
    assert LogEntry.objects.filter(user=olivia, action_flag=ADDITION, object_id=str(dana.pk)).exists()


def test_it_refuses_to_add_a_second_account_for_the_same_email(alice, olivia_client):
    response = olivia_client.post(
        "/admin/accounts/user/add/",
        {
            "email": "ALICE@example.com",
            "usable_password": "true",
            "password1": PASSWORD,
            "password2": PASSWORD,
        },
    )

    assertContains(response, "User with this Email address already exists.")
    assert User.objects.filter(email__iexact="alice@example.com").count() == 1


def test_it_refuses_to_add_a_user_without_an_email(olivia_client):
    response = olivia_client.post(
        "/admin/accounts/user/add/",
        {"email": "", "usable_password": "true", "password1": PASSWORD, "password2": PASSWORD},
    )

    assertContains(response, "This field is required.")
    assert not User.objects.exclude(email="olivia@ops.example.com").exists()


def test_it_saves_changes_to_a_user(alice, olivia_client):
    page = olivia_client.get(f"/admin/accounts/user/{alice.pk}/change/")
    assert page.status_code == 200

    response = olivia_client.post(
        f"/admin/accounts/user/{alice.pk}/change/",
        {
            "email": "alice@example.com",
            "first_name": "Alice",
            "last_name": "Liddell",
            "email_verified_at_0": "2026-01-01",
            "email_verified_at_1": "10:00:00",
            "pending_email": "",
            "is_active": "on",
            "date_joined_0": "2026-01-01",
            "date_joined_1": "09:00:00",
            "bonus_applications-TOTAL_FORMS": "0",
            "bonus_applications-INITIAL_FORMS": "0",
            "ssh_keys-TOTAL_FORMS": "0",
            "ssh_keys-INITIAL_FORMS": "0",
        },
    )

    assert response.status_code == 302, response.context["adminform"].form.errors
    alice.refresh_from_db()
    assert alice.last_name == "Liddell"
    assert alice.email_verified
