import pytest
from django.test import RequestFactory, override_settings

from portal.accounts.models import User
from portal.accounts.views import client_ip
from tests.conftest import PASSWORD

# Day-long windows: a window boundary falling inside a test is then vanishingly unlikely.
THREE_A_DAY = "3/d"


def sign_up(client, n, **extra):
    data = {"email": f"user{n}@example.com", "password": PASSWORD, "password_confirm": PASSWORD}
    return client.post("/accounts/signup/", data, **extra)


def assert_rate_limited(response):
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 86400 + 60
    page = response.content.decode()
    assert "Too many requests" in page
    assert "Try again in " in page


@override_settings(SIGNUP_RATE=THREE_A_DAY)
def test_it_limits_sign_ups_per_address_and_says_when_to_retry(client, run_on_commit):
    for n in range(3):
        with run_on_commit():
            assert sign_up(client, n).status_code == 200
        client.post("/accounts/logout/")

    response = sign_up(client, 3)

    assert_rate_limited(response)
    assert not User.objects.filter(email="user3@example.com").exists()
    # Looking at the form is not counted, and another network may still sign up.
    assert client.get("/accounts/signup/").status_code == 200
    with run_on_commit():
        assert sign_up(client, 4, REMOTE_ADDR="198.51.100.20").status_code == 200


@override_settings(SIGNUP_RATE=THREE_A_DAY)
def test_failed_sign_ups_count_too(client):
    for n in range(3):
        assert client.post("/accounts/signup/", {"email": f"user{n}@example.com"}).status_code == 200

    assert_rate_limited(sign_up(client, 3))


@override_settings(EMAIL_SEND_RATE="2/d")
def test_it_limits_resending_the_verification_link(client, charlie, run_on_commit, mailoutbox):
    client.force_login(charlie)
    for _ in range(2):
        with run_on_commit():
            client.post("/accounts/verify/resend/")

    with run_on_commit():
        response = client.post("/accounts/verify/resend/")

    assert_rate_limited(response)
    assert len(mailoutbox) == 2


@override_settings(EMAIL_SEND_RATE="2/d")
def test_it_limits_resending_per_account_across_networks(client, charlie, run_on_commit, mailoutbox):
    client.force_login(charlie)
    for n in range(2):
        with run_on_commit():
            client.post("/accounts/verify/resend/", REMOTE_ADDR=f"203.0.113.{n + 1}")

    assert_rate_limited(client.post("/accounts/verify/resend/", REMOTE_ADDR="203.0.113.99"))
    assert len(mailoutbox) == 2


@override_settings(EMAIL_SEND_RATE="2/d")
def test_it_limits_password_reset_requests(client, alice, run_on_commit, mailoutbox):
    for _ in range(2):
        with run_on_commit():
            assert client.post("/accounts/password/reset/", {"email": "alice@example.com"}).status_code == 302

    with run_on_commit():
        response = client.post("/accounts/password/reset/", {"email": "alice@example.com"})

    assert_rate_limited(response)
    assert len(mailoutbox) == 2


@override_settings(EMAIL_SEND_RATE="2/d")
def test_it_limits_email_change_requests(alice_client, alice, run_on_commit, mailoutbox):
    for n in range(2):
        with run_on_commit():
            alice_client.post(
                "/accounts/settings/email/", {"new_email": f"a{n}@new.example", "password": PASSWORD}
            )

    assert_rate_limited(
        alice_client.post("/accounts/settings/email/", {"new_email": "a9@new.example", "password": PASSWORD})
    )
    alice.refresh_from_db()
    assert alice.pending_email == "a1@new.example"


@override_settings(SIGNUP_RATE=THREE_A_DAY)
def test_without_trusted_proxies_a_forged_forwarded_for_does_not_dodge_the_limit(client):
    for n in range(3):
        client.post("/accounts/signup/", {}, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")

    assert_rate_limited(sign_up(client, 3, HTTP_X_FORWARDED_FOR="192.0.2.200"))


@override_settings(SIGNUP_RATE=THREE_A_DAY, TRUSTED_PROXY_COUNT=1)
def test_behind_one_proxy_it_counts_the_address_the_proxy_saw(client):
    # The proxy (REMOTE_ADDR 10.0.0.5) appends the client's address; what the client put before it is ignored.
    proxy = {"REMOTE_ADDR": "10.0.0.5"}
    for n in range(3):
        client.post("/accounts/signup/", {}, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}, 198.51.100.1", **proxy)

    assert_rate_limited(sign_up(client, 3, HTTP_X_FORWARDED_FOR="192.0.2.99, 198.51.100.1", **proxy))
    assert sign_up(client, 4, HTTP_X_FORWARDED_FOR="198.51.100.2", **proxy).status_code == 200


@pytest.mark.parametrize(
    "proxies, remote_addr, forwarded_for, expected",
    [
        (0, "198.51.100.1", "", "198.51.100.1"),
        (0, "198.51.100.1", "192.0.2.1", "198.51.100.1"),
        (1, "10.0.0.5", "192.0.2.1, 198.51.100.1", "198.51.100.1"),
        (2, "10.0.0.6", "192.0.2.1, 198.51.100.1, 10.0.0.5", "198.51.100.1"),
        (2, "10.0.0.6", "198.51.100.1", "198.51.100.1"),
        (1, "10.0.0.5", "", "10.0.0.5"),
        (1, "10.0.0.5", "192.0.2.1, not-an-ip", "10.0.0.5"),
        (1, "10.0.0.5", "2001:db8::1", "2001:db8::1"),
    ],
)
def test_client_ip_trusts_exactly_the_configured_proxies(proxies, remote_addr, forwarded_for, expected):
    request = RequestFactory().get("/", REMOTE_ADDR=remote_addr, HTTP_X_FORWARDED_FOR=forwarded_for)

    with override_settings(TRUSTED_PROXY_COUNT=proxies):
        assert client_ip(request) == expected


def fail_login(client, **extra):
    return client.post("/accounts/login/", {"username": "alice@example.com", "password": "wrong"}, **extra)


def test_login_lockout_ignores_a_forged_forwarded_for(client, alice, bob):
    for n in range(5):
        client.post(
            "/accounts/login/",
            {"username": f"x{n}@example.com", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"192.0.2.{n}",
        )

    response = client.post(
        "/accounts/login/",
        {"username": "bob@example.com", "password": PASSWORD},
        HTTP_X_FORWARDED_FOR="192.0.2.77",
    )
    assert response.status_code == 429


@override_settings(TRUSTED_PROXY_COUNT=1, AXES_CLIENT_IP_CALLABLE="portal.accounts.views.client_ip")
def test_behind_one_proxy_the_login_lockout_keys_on_the_same_address(client, alice, bob):
    proxy = {"REMOTE_ADDR": "10.0.0.5"}
    for n in range(5):
        client.post(
            "/accounts/login/",
            {"username": f"x{n}@example.com", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"192.0.2.{n}, 198.51.100.1",
            **proxy,
        )

    bob_login = {"username": "bob@example.com", "password": PASSWORD}
    locked = client.post(
        "/accounts/login/", bob_login, HTTP_X_FORWARDED_FOR="192.0.2.9, 198.51.100.1", **proxy
    )
    other = client.post("/accounts/login/", bob_login, HTTP_X_FORWARDED_FOR="198.51.100.2", **proxy)
    assert (locked.status_code, other.status_code) == (429, 302)


@override_settings(EMAIL_SEND_RATE="2/d")
def test_it_limits_reset_emails_to_one_address_sent_from_many_networks(
    client, alice, bob, run_on_commit, mailoutbox
):
    spellings = ["alice@example.com", "Alice@Example.com", " ALICE@example.com ", "alice@EXAMPLE.com"]
    for n, spelling in enumerate(spellings):
        with run_on_commit():
            client.post("/accounts/password/reset/", {"email": spelling}, REMOTE_ADDR=f"203.0.113.{n + 1}")

    with run_on_commit():
        response = client.post(
            "/accounts/password/reset/", {"email": "alice@example.com"}, REMOTE_ADDR="198.51.100.9"
        )

    assert_rate_limited(response)
    assert len(mailoutbox) == 2
    # Someone else's reset, from one of those networks, still goes out.
    with run_on_commit():
        client.post("/accounts/password/reset/", {"email": "bob@example.com"}, REMOTE_ADDR="203.0.113.1")
    assert [m.to for m in mailoutbox][-1] == ["bob@example.com"]
