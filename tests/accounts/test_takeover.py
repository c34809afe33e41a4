"""Taking over an account before its owner uses it, and the defences against it.

The attacker signs up with someone else's address, adds a way in (GitHub), and waits for the owner to
reset the password. Every test drives the real pages through the test client, and GitHub through the
local stand-in over real HTTP. Rules under test:
- an account whose address is not confirmed cannot add a login method;
- proving the address (confirming it, a password reset through the emailed link, confirming a new
  address) removes every GitHub link and every other session from before the proof, and says so;
- emailed links change nothing on GET, and confirm only in a browser logged in as the account.
"""

from datetime import timedelta

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import Client
from django.utils import timezone
from social_django.models import UserSocialAuth

from portal.accounts import services
from portal.accounts.models import User
from tests.conftest import PASSWORD
from tests.support.github_standin import GithubScenario, github_fixture  # noqa: F401 (the `github` fixture)

from .conftest import link_path

pytestmark = pytest.mark.django_db

VICTIM = "victim@example.com"
SQUATTER_PASSWORD = "squatters own passphrase"
OWNER_PASSWORD = "the owners new passphrase"
SETTINGS_URL = "/accounts/settings/"


def mallory_on_github():
    """The attacker's own GitHub account: a different, verified address."""
    return GithubScenario.person(github_id=6660, login="mallory", email="mallory@evil.example")


def victim_on_github():
    """The owner's GitHub account, with the owner's address verified on GitHub's side."""
    return GithubScenario.person(github_id=4242, login="victim", email=VICTIM)


def user_of(client):
    raw = client.session.get(SESSION_KEY)
    return int(raw) if raw is not None else None


def sign_up(client, run_on_commit, email=VICTIM, password=SQUATTER_PASSWORD):
    """Sign up and be inside the account. An unconfirmed account cannot log in any more, so the browser is
    logged in directly: the squatter's session from before that rule, the worst case these tests cover.
    Returns the sign-up's answer."""
    with run_on_commit():
        answer = client.post(
            "/accounts/signup/", {"email": email, "password": password, "password_confirm": password}
        )
    created = User.objects.filter(email=email.lower(), email_verified_at__isnull=True).first()
    if created is not None and created.check_password(password):
        client.force_login(created)
    return answer


def mails_to(mailoutbox, address, subject_part):
    return [m for m in mailoutbox if m.to == [address] and subject_part in m.subject]


def reset_password(client, run_on_commit, mailoutbox, email=VICTIM, password=OWNER_PASSWORD):
    """Ask for a reset and set the password through the emailed link. Returns the final page."""
    with run_on_commit():
        client.post("/accounts/password/reset/", {"email": email})
    link = link_path(mails_to(mailoutbox, email, "Reset")[-1])
    form_url = client.get(link)["Location"]
    with run_on_commit():
        return client.post(form_url, {"new_password1": password, "new_password2": password}, follow=True)


def confirm_address_if_needed(client, run_on_commit, mailoutbox):
    """What the owner does after logging in when the address still shows as unconfirmed: ask for a
    new link and press its button."""
    if User.objects.get(email=VICTIM).email_verified:
        return
    with run_on_commit():
        client.post("/accounts/verify/resend/")
    client.post(link_path(mails_to(mailoutbox, VICTIM, "Confirm")[-1]))


def log_in(client, email, password):
    return client.post("/accounts/login/", {"username": email, "password": password})


# --- The whole attack --------------------------------------------------------------------------


def test_it_leaves_the_squatter_no_way_in_after_the_owner_resets_the_password(
    github, run_on_commit, mailoutbox
):
    # 1. The attacker signs up with the victim's address and is inside before it is confirmed.
    attacker = Client()
    assert sign_up(attacker, run_on_commit).status_code == 200
    assert user_of(attacker) is not None
    squatted = User.objects.get(email=VICTIM)
    # 2. From Settings, the attacker connects their own GitHub account, and changes the password.
    github.scenario = mallory_on_github()
    github.login_with(attacker, next_url=SETTINGS_URL)
    changed = attacker.post(
        "/accounts/settings/password/",
        {
            "old_password": SQUATTER_PASSWORD,
            "new_password1": SQUATTER_PASSWORD + "!",
            "new_password2": SQUATTER_PASSWORD + "!",
        },
    )
    assert changed.status_code == 302

    # 3. The victim tries to sign up and gets the (unconfirmed) account's link again by email, which
    # needs a password they do not know; they reset it.
    victim = Client()
    sign_up(victim, run_on_commit, password=OWNER_PASSWORD)
    assert len(mails_to(mailoutbox, VICTIM, "Confirm")) == 2 and user_of(victim) is None
    reset_password(victim, run_on_commit, mailoutbox)
    assert log_in(victim, VICTIM, OWNER_PASSWORD).status_code == 302
    confirm_address_if_needed(victim, run_on_commit, mailoutbox)
    squatted.refresh_from_db()
    assert squatted.email_verified

    # 4. The attacker's browser is logged out, and their GitHub login does not reach the account.
    assert attacker.get(SETTINGS_URL).status_code == 302
    assert user_of(attacker) is None
    comeback = Client()
    github.scenario = mallory_on_github()
    github.login_with(comeback)
    assert user_of(comeback) != squatted.pk
    assert not UserSocialAuth.objects.filter(user=squatted).exists()
    for old_password in (SQUATTER_PASSWORD, SQUATTER_PASSWORD + "!"):
        assert log_in(Client(), VICTIM, old_password).status_code == 200


# --- Unconfirmed accounts cannot add a way in -------------------------------------------------


def test_it_refuses_to_connect_github_to_an_unconfirmed_account(client, github, charlie):
    client.force_login(charlie)
    github.scenario = mallory_on_github()

    response = github.login_with(client, next_url=SETTINGS_URL)

    assert response.status_code == 400
    page = response.content.decode()
    assert "Confirm your email address before connecting GitHub" in page
    assert not UserSocialAuth.objects.exists()
    assert user_of(client) == charlie.pk


def test_settings_offers_no_connect_button_before_the_address_is_confirmed(client, charlie):
    client.force_login(charlie)

    page = client.get(SETTINGS_URL).content.decode()

    assert "Connect GitHub" not in page
    assert "Confirm your email address before connecting GitHub" in page


def test_a_github_login_with_the_same_address_is_not_linked_to_a_squatted_account(
    github, run_on_commit, mailoutbox
):
    attacker = Client()
    sign_up(attacker, run_on_commit)
    squatted = User.objects.get(email=VICTIM)
    # The owner's mail scanner fetches the verification link before anyone reads the email.
    Client().get(link_path(mails_to(mailoutbox, VICTIM, "Confirm")[-1]))

    owner = Client()
    github.scenario = victim_on_github()
    response = github.login_with(owner)

    assert response.status_code == 400
    assert "reset its password" in response.content.decode()
    assert user_of(owner) is None
    assert not UserSocialAuth.objects.exists()
    squatted.refresh_from_db()
    assert not squatted.email_verified


def test_a_github_login_links_to_the_account_once_the_owner_reset_it(github, run_on_commit, mailoutbox):
    sign_up(Client(), run_on_commit)
    squatted = User.objects.get(email=VICTIM)
    reset_password(Client(), run_on_commit, mailoutbox)

    owner = Client()
    github.scenario = victim_on_github()
    github.login_with(owner)

    assert user_of(owner) == squatted.pk
    assert UserSocialAuth.objects.get(uid="4242").user == squatted


# --- Emailed links change state only on POST, in the account's own browser --------------------


def test_a_mail_scanner_fetching_the_verification_link_confirms_nothing(client, charlie, mailoutbox):
    with_link = Client()
    with_link.force_login(charlie)
    services.email_send(kind=services.EmailKind.VERIFY, user_id=charlie.pk)
    link = link_path(mailoutbox[-1])

    scanned = client.get(link)
    opened = with_link.get(link)

    charlie.refresh_from_db()
    assert not charlie.email_verified
    assert scanned.status_code == opened.status_code == 200
    assert 'method="post"' in opened.content.decode()

    with_link.post(link)
    charlie.refresh_from_db()
    assert charlie.email_verified


def test_a_mail_scanner_fetching_the_email_change_link_changes_nothing(
    alice_client, alice, run_on_commit, mailoutbox
):
    with run_on_commit():
        alice_client.post(
            "/accounts/settings/email/", {"new_email": "alice@new.example", "password": PASSWORD}
        )
    link = link_path(mailoutbox[-1])

    Client().get(link)
    alice_client.get(link)

    alice.refresh_from_db()
    assert (alice.email, alice.pending_email) == ("alice@example.com", "alice@new.example")

    alice_client.post(link)
    alice.refresh_from_db()
    assert (alice.email, alice.pending_email) == ("alice@new.example", "")


def test_pressing_confirm_in_a_browser_not_logged_in_as_the_account_confirms_nothing(
    run_on_commit, mailoutbox
):
    # Whoever reads the mail but never set the password (the owner of a squatted address) must not make
    # the squatter's password part of a confirmed account: they reset the password instead.
    sign_up(Client(), run_on_commit)
    link = link_path(mails_to(mailoutbox, VICTIM, "Confirm")[-1])
    reader = Client()

    response = reader.post(link, follow=True)

    assert not User.objects.get(email=VICTIM).email_verified
    page = response.content.decode()
    assert response.status_code == 403
    assert 'id="id_password"' in page and "Reset the password" in page


# --- Proving the address removes what came before it, and says so -----------------------------


def test_a_password_reset_removes_github_links_and_sessions_from_before_it(
    alice, github, run_on_commit, mailoutbox
):
    # Someone who learnt alice's password logs in and adds their GitHub as a way back in.
    intruder = Client()
    assert log_in(intruder, "alice@example.com", PASSWORD).status_code == 302
    github.scenario = mallory_on_github()
    github.login_with(intruder, next_url=SETTINGS_URL)
    assert UserSocialAuth.objects.filter(user=alice).exists()

    page = reset_password(Client(), run_on_commit, mailoutbox, email="alice@example.com").content.decode()

    assert not UserSocialAuth.objects.filter(user=alice).exists()
    assert intruder.get(SETTINGS_URL).status_code == 302
    comeback = Client()
    github.login_with(comeback)
    assert user_of(comeback) != alice.pk
    assert "disconnected GitHub (mallory)" in page
    [notice] = mails_to(mailoutbox, "alice@example.com", "removed")
    assert "GitHub" in notice.body and "logged out" in notice.body


def test_confirming_the_address_logs_out_every_other_browser_and_says_so(charlie, run_on_commit, mailoutbox):
    elsewhere, here = Client(), Client()
    elsewhere.force_login(charlie)
    here.force_login(charlie)
    services.email_send(kind=services.EmailKind.VERIFY, user_id=charlie.pk)

    with run_on_commit():
        with_message = here.post(link_path(mailoutbox[-1]), follow=True)

    charlie.refresh_from_db()
    assert charlie.email_verified
    assert user_of(here) == charlie.pk
    assert elsewhere.get(SETTINGS_URL).status_code == 302
    assert "logged out 1 other browser" in with_message.content.decode()
    assert mails_to(mailoutbox, "charlie@example.com", "removed")


def test_confirming_a_new_address_removes_github_links_and_other_sessions(
    alice, github, run_on_commit, mailoutbox
):
    here, elsewhere = Client(), Client()
    here.force_login(alice)
    elsewhere.force_login(alice)
    github.scenario = mallory_on_github()
    github.login_with(elsewhere, next_url=SETTINGS_URL)
    assert UserSocialAuth.objects.filter(user=alice).exists()
    with run_on_commit():
        here.post("/accounts/settings/email/", {"new_email": "alice@new.example", "password": PASSWORD})
    link = link_path(mailoutbox[-1])

    with run_on_commit():
        page = here.post(link, follow=True).content.decode()

    alice.refresh_from_db()
    assert alice.email == "alice@new.example"
    assert not UserSocialAuth.objects.filter(user=alice).exists()
    assert elsewhere.get(SETTINGS_URL).status_code == 302
    assert user_of(here) == alice.pk
    assert "disconnected GitHub (mallory)" in page
    assert mails_to(mailoutbox, "alice@new.example", "removed")


# --- The owner can always get the account back by the emailed link ----------------------------


def test_a_reset_cancels_the_squatters_pending_change_of_address(run_on_commit, mailoutbox):
    squatter = Client()
    sign_up(squatter, run_on_commit)
    with run_on_commit():
        squatter.post(
            "/accounts/settings/email/", {"new_email": "drop@evil.example", "password": SQUATTER_PASSWORD}
        )
    assert User.objects.get(email=VICTIM).pending_email == "drop@evil.example"
    sent_to_the_squatter = len(mails_to(mailoutbox, "drop@evil.example", "Confirm"))

    page = reset_password(Client(), run_on_commit, mailoutbox).content.decode()

    assert "cancelled the change of address to drop@evil.example" in page
    owner = Client()
    log_in(owner, VICTIM, OWNER_PASSWORD)
    with run_on_commit():
        owner.post("/accounts/verify/resend/")
    # Asking for "a new link" now cannot send the squatter a link that moves the account to them.
    assert len(mails_to(mailoutbox, "drop@evil.example", "Confirm")) == sent_to_the_squatter
    assert User.objects.get(email=VICTIM).pending_email == ""


def test_the_owner_can_reset_while_the_squatter_keeps_logging_in(run_on_commit, mailoutbox):
    squatter = Client()
    sign_up(squatter, run_on_commit)
    # The squatter's last login was a while ago (the stored time has whole seconds).
    User.objects.filter(email=VICTIM).update(last_login=timezone.now() - timedelta(minutes=5))
    owner = Client()
    with run_on_commit():
        owner.post("/accounts/password/reset/", {"email": VICTIM})
    form_url = owner.get(link_path(mails_to(mailoutbox, VICTIM, "Reset")[-1]))["Location"]

    # Between the owner opening the link and sending the form, the squatter tries to log in again (an
    # unconfirmed account is refused on the login page) and keeps the session it has.
    assert log_in(Client(), VICTIM, SQUATTER_PASSWORD).status_code == 200
    squatter.get(SETTINGS_URL)
    with run_on_commit():
        response = owner.post(form_url, {"new_password1": OWNER_PASSWORD, "new_password2": OWNER_PASSWORD})

    assert response.status_code == 302 and response["Location"] == "/accounts/password/reset/done/"
    assert log_in(Client(), VICTIM, OWNER_PASSWORD).status_code == 302
    assert user_of(squatter) is None or squatter.get(SETTINGS_URL).status_code == 302


def test_opening_the_reset_link_changes_nothing_until_the_form_is_sent(
    alice, github, run_on_commit, mailoutbox
):
    intruder = Client()
    log_in(intruder, "alice@example.com", PASSWORD)
    github.scenario = mallory_on_github()
    github.login_with(intruder, next_url=SETTINGS_URL)
    with run_on_commit():
        Client().post("/accounts/password/reset/", {"email": "alice@example.com"})
    link = link_path(mails_to(mailoutbox, "alice@example.com", "Reset")[-1])

    scanner = Client()
    scanner.get(link, follow=True)

    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)
    assert UserSocialAuth.objects.filter(user=alice).exists()
    assert user_of(intruder) == alice.pk and intruder.get(SETTINGS_URL).status_code == 200


# --- Links made before the rule -----------------------------------------------------------------


def test_the_upgrade_unlinks_github_from_accounts_whose_address_was_never_confirmed(alice, charlie, github):
    from importlib import import_module

    from django.apps import apps

    migration = import_module("portal.accounts.migrations.0004_unlink_github_from_unconfirmed_accounts")
    # Made the way the old code allowed: charlie connected GitHub before confirming the address.
    UserSocialAuth.objects.create(
        user=charlie, provider="github", uid="6660", extra_data={"login": "mallory"}
    )
    UserSocialAuth.objects.create(user=alice, provider="github", uid="8008", extra_data={"login": "alice-gh"})

    migration.unlink_github_from_unconfirmed_accounts(apps, None)

    assert list(UserSocialAuth.objects.values_list("user_id", flat=True)) == [alice.pk]
    github.scenario = mallory_on_github()
    comeback = Client()
    github.login_with(comeback)
    assert user_of(comeback) != charlie.pk
