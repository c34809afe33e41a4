"""The operator console's own log-in page (/admin/login/) counts failures per account like the portal's."""

from django.contrib.auth import SESSION_KEY, authenticate
from django.test import RequestFactory

from tests.conftest import PASSWORD

ADMIN_LOGIN = "/admin/login/"
# Each attempt comes from another network, so only the per-account counter can stop the attacker.
SPELLINGS_OF_OLIVIA = [
    "olivia@ops.example.com",
    "Olivia@ops.example.com",
    "OLIVIA@OPS.EXAMPLE.COM",
    " olivia@ops.example.com",
    "olivia@Ops.Example.com ",
    "oLiViA@ops.example.COM",
]


def admin_log_in(client, username, password=PASSWORD, ip="127.0.0.1"):
    return client.post(
        ADMIN_LOGIN, {"username": username, "password": password, "next": "/admin/"}, REMOTE_ADDR=ip
    )


def test_it_logs_an_operator_in_with_the_address_in_any_case(client, olivia):
    response = admin_log_in(client, " OLIVIA@Ops.Example.com ")

    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert client.session[SESSION_KEY] == str(olivia.pk)


def test_spelling_the_address_differently_does_not_dodge_the_lockout(client, olivia):
    for attempt, spelling in enumerate(SPELLINGS_OF_OLIVIA):
        admin_log_in(client, spelling, "guess-%d" % attempt, ip=f"203.0.113.{attempt + 1}")

    # The attacker's next guess is the right one, from yet another network: refused all the same.
    response = admin_log_in(client, "Olivia@OPS.example.com", ip="198.51.100.7")

    assert response.status_code == 429
    assert "Log-in paused" in response.content.decode()
    assert SESSION_KEY not in client.session


def test_failures_on_the_admin_page_and_the_portal_page_add_up(client, olivia):
    for attempt in range(3):
        admin_log_in(client, f"OLIVIA@ops.example.com{' ' * attempt}", "wrong", ip=f"203.0.113.{attempt + 1}")
    for attempt in range(3):
        client.post(
            "/accounts/login/",
            {"username": f"Olivia@Ops.Example.Com{' ' * attempt}", "password": "wrong"},
            REMOTE_ADDR=f"203.0.113.{attempt + 10}",
        )

    assert admin_log_in(client, "olivia@ops.example.com", ip="198.51.100.7").status_code == 429


def test_a_login_by_email_keyword_counts_against_the_same_account(client, olivia):
    # What an API or token login would do: authenticate(email=...) rather than the forms' username=.
    for attempt, spelling in enumerate(SPELLINGS_OF_OLIVIA[:5]):
        request = RequestFactory().post("/api/login", REMOTE_ADDR=f"203.0.113.{attempt + 1}")
        assert authenticate(request, email=spelling, password="wrong") is None

    assert admin_log_in(client, "olivia@ops.example.com", ip="198.51.100.7").status_code == 429
