import pytest
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.models import Session

from tests.conftest import PASSWORD

LOGIN = "/accounts/login/"


def log_in(client, email, password=PASSWORD, ip="127.0.0.1"):
    return client.post(LOGIN, {"username": email, "password": password}, REMOTE_ADDR=ip)


def test_it_logs_in_with_the_email_address_in_any_case(client, alice):
    response = log_in(client, "  ALICE@Example.com ")

    assert response.status_code == 302 and response["Location"] == "/"
    assert client.session[SESSION_KEY] == str(alice.pk)


def test_it_gives_a_new_session_key_on_login(client, alice):
    # A session an attacker could have planted before the victim logs in.
    session = client.session
    session["planted"] = True
    session.save()
    client.cookies[settings.SESSION_COOKIE_NAME] = session.session_key
    before = session.session_key

    log_in(client, "alice@example.com")

    after = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert after != before
    assert not Session.objects.filter(session_key=before).exists()
    assert client.session[SESSION_KEY] == str(alice.pk)


def test_it_refuses_a_wrong_password_with_a_clear_error(client, alice):
    response = log_in(client, "alice@example.com", "not the password")

    assert response.status_code == 200
    assert "That email address and password do not match an account." in response.content.decode()
    assert SESSION_KEY not in client.session


@pytest.mark.parametrize(
    "data", [{}, {"username": "", "password": ""}, {"username": "alice", "password": "x"}]
)
def test_it_refuses_incomplete_or_malformed_input(client, alice, data):
    response = client.post(LOGIN, data)

    assert response.status_code == 200
    assert response.context["form"].errors
    assert SESSION_KEY not in client.session


def test_it_refuses_a_deleted_account(client, alice):
    from portal.accounts.services import account_delete

    account_delete(user=alice)

    response = log_in(client, "alice@example.com")
    assert response.status_code == 200
    assert SESSION_KEY not in client.session


def test_logout_needs_a_post_and_ends_the_session(alice_client):
    assert alice_client.get("/accounts/logout/").status_code == 405
    assert SESSION_KEY in alice_client.session

    response = alice_client.post("/accounts/logout/")

    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert SESSION_KEY not in alice_client.session


def assert_locked_out(response, username=""):
    assert response.status_code == 429
    page = response.content.decode()
    assert "Log-in paused" in page
    assert "Try again in 15 minutes." in page
    assert (
        f'href="/accounts/password/reset/{"?email=" + username.replace("@", "%40") if username else ""}"'
        in page
    )


def test_it_locks_out_an_address_after_five_failures_and_says_when_to_retry(client, alice):
    for attempt in range(4):
        assert log_in(client, f"guess{attempt}@example.com", "wrong").status_code == 200

    assert_locked_out(log_in(client, "guess4@example.com", "wrong"), "guess4@example.com")
    # Even the right password is refused from there now...
    assert_locked_out(log_in(client, "alice@example.com"), "alice@example.com")
    assert SESSION_KEY not in client.session
    # ...while another network is unaffected.
    assert log_in(client, "alice@example.com", ip="198.51.100.7").status_code == 302


def test_it_locks_out_an_account_attacked_from_many_addresses(client, alice, bob):
    for attempt in range(5):
        log_in(client, "alice@example.com", "wrong", ip=f"203.0.113.{attempt + 1}")

    assert_locked_out(log_in(client, "alice@example.com", ip="198.51.100.7"), "alice@example.com")
    # Bob, from the same new address, is not affected.
    assert log_in(client, "bob@example.com", ip="198.51.100.7").status_code == 302


def test_case_variants_of_the_address_count_as_one_account(client, alice):
    for attempt, variant in enumerate(
        [
            "alice@example.com",
            "Alice@example.com",
            "ALICE@example.com",
            "alice@EXAMPLE.com",
            "aLiCe@example.com",
        ]
    ):
        log_in(client, variant, "wrong", ip=f"203.0.113.{attempt + 1}")

    assert log_in(client, "alice@example.com", ip="198.51.100.7").status_code == 429


def test_a_successful_login_clears_earlier_failures(client, alice):
    for _ in range(4):
        log_in(client, "alice@example.com", "wrong")
    assert log_in(client, "alice@example.com").status_code == 302
    client.post("/accounts/logout/")

    for _ in range(4):
        assert log_in(client, "alice@example.com", "wrong").status_code == 200


def test_spacing_and_capitals_do_not_dodge_the_lockout_of_an_operator(client, olivia):
    spellings = [
        "olivia@ops.example.com",
        " Olivia@ops.example.com",
        "OLIVIA@OPS.EXAMPLE.COM ",
        "olivia@Ops.Example.com",
        "  oLiViA@ops.example.com  ",
        "Olivia@Ops.Example.Com",
    ]
    for attempt, spelling in enumerate(spellings):
        log_in(client, spelling, "wrong", ip=f"203.0.113.{attempt + 1}")

    response = log_in(client, "Olivia@ops.example.com", ip="198.51.100.7")

    assert_locked_out(response, "olivia@ops.example.com")
    assert SESSION_KEY not in client.session
