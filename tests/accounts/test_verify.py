from django.contrib.auth import SESSION_KEY
from django.test import override_settings
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from portal.accounts import services
from portal.accounts.models import User
from portal.accounts.tokens import email_verification_tokens
from portal.credits.models import LedgerEntry
from portal.credits.selectors import balance_for
from tests.conftest import PASSWORD

from .conftest import link_path

TWENTY_FIVE_HOURS = 25 * 3600


def verification_link(user, mailoutbox) -> str:
    """What the sign-up email links to, built the way the worker builds it."""
    assert services.email_send(kind=services.EmailKind.VERIFY, user_id=user.pk)
    return link_path(mailoutbox[-1])


def test_it_confirms_the_address_and_grants_25_gpu_hours(client, charlie, mailoutbox):
    client.force_login(charlie)
    link = verification_link(charlie, mailoutbox)
    assert "Confirm my email address" in client.get(link).content.decode()

    response = client.post(link, follow=True)

    charlie.refresh_from_db()
    assert charlie.email_verified
    assert balance_for(charlie) == TWENTY_FIVE_HOURS
    assert response.redirect_chain == [("/", 302)]
    page = response.content.decode()
    assert "charlie@example.com is confirmed" in page
    assert "25.00 GPU-hours were added to your balance." in page
    assert "Confirm your email address." not in page


def test_a_browser_that_is_not_logged_in_confirms_with_the_password_and_is_logged_in(
    client, charlie, mailoutbox
):
    link = verification_link(charlie, mailoutbox)
    page = client.get(link).content.decode()
    # An unconfirmed account cannot log in on the login page (that would tell the address was free).
    refused = client.post("/accounts/login/", {"username": charlie.email, "password": PASSWORD})
    assert 'id="id_password"' in page
    assert refused.status_code == 200 and not client.session.get(SESSION_KEY)

    client.post(link, {"password": PASSWORD})

    charlie.refresh_from_db()
    assert charlie.email_verified and balance_for(charlie) == TWENTY_FIVE_HOURS
    assert client.session.get(SESSION_KEY) == str(charlie.pk)


def test_it_refuses_a_used_link_and_grants_once(client, charlie, mailoutbox):
    client.force_login(charlie)
    link = verification_link(charlie, mailoutbox)
    client.post(link)

    response = client.post(link)

    assert response.status_code == 200
    assert "Already confirmed" in response.content.decode()
    assert balance_for(charlie) == TWENTY_FIVE_HOURS
    assert LedgerEntry.objects.filter(account__user=charlie).count() == 1


@override_settings(PASSWORD_RESET_TIMEOUT=3600)
def test_it_explains_an_expired_link_and_offers_a_new_one(client, charlie):
    two_hours_ago = email_verification_tokens._num_seconds(email_verification_tokens._now()) - 7200
    token = email_verification_tokens._make_token_with_timestamp(
        charlie, two_hours_ago, email_verification_tokens.secret
    )
    uid = urlsafe_base64_encode(force_bytes(charlie.pk))
    client.force_login(charlie)

    response = client.get(f"/accounts/verify/{uid}/{token}/")

    assert response.status_code == 400
    page = response.content.decode()
    assert "This link has expired" in page
    assert 'action="/accounts/verify/resend/"' in page and "Send me a new link" in page
    charlie.refresh_from_db()
    assert not charlie.email_verified and balance_for(charlie) == 0


@override_settings(PASSWORD_RESET_TIMEOUT=3600)
def test_it_still_accepts_a_link_inside_the_timeout(client, charlie):
    fifty_minutes_ago = email_verification_tokens._num_seconds(email_verification_tokens._now()) - 3000
    token = email_verification_tokens._make_token_with_timestamp(
        charlie, fifty_minutes_ago, email_verification_tokens.secret
    )
    uid = urlsafe_base64_encode(force_bytes(charlie.pk))
    client.force_login(charlie)

    client.post(f"/accounts/verify/{uid}/{token}/")

    charlie.refresh_from_db()
    assert charlie.email_verified


def test_it_offers_login_to_get_a_new_link_when_logged_out(client, charlie, mailoutbox):
    link = verification_link(charlie, mailoutbox)

    response = client.get(link[:-3] + "zz/")

    assert response.status_code == 400
    assert "This link does not work" in response.content.decode()
    assert "Log in to get a new link" in response.content.decode()


def test_it_refuses_garbled_and_unknown_links(client, charlie, mailoutbox):
    link = verification_link(charlie, mailoutbox)
    _, _, _, uid, token, _ = link.split("/")
    flipped = token[:-1] + ("1" if token.endswith("0") else "0")  # one character off, never the same
    for bad in [
        f"/accounts/verify/{uid}/{flipped}/",
        f"/accounts/verify/{uid}/nonsense/",
        f"/accounts/verify/{uid}/zzzzzzzzzzzzzzzzzz-abc/",
        f"/accounts/verify/!!/{token}/",
        f"/accounts/verify/{urlsafe_base64_encode(b'999999')}/{token}/",
        f"/accounts/verify/{urlsafe_base64_encode(b'not-a-number')}/{token}/",
    ]:
        response = client.get(bad)
        assert response.status_code == 400, bad
        assert "This link does not work" in response.content.decode()
    charlie.refresh_from_db()
    assert not charlie.email_verified


def test_a_link_dies_when_the_password_changes(client, charlie, mailoutbox):
    link = verification_link(charlie, mailoutbox)
    charlie.set_password("a brand new passphrase")
    charlie.save()

    response = client.get(link)

    assert response.status_code == 400
    charlie.refresh_from_db()
    assert not charlie.email_verified


def test_a_link_dies_when_an_email_change_is_requested(client, charlie, mailoutbox):
    link = verification_link(charlie, mailoutbox)
    services.email_change_request(user=charlie, new_email="charles@example.net", password=PASSWORD)

    response = client.get(link)

    assert response.status_code == 400
    charlie.refresh_from_db()
    assert not charlie.email_verified and charlie.email == "charlie@example.com"


def test_a_link_dies_when_the_email_changes(client, charlie, mailoutbox):
    link = verification_link(charlie, mailoutbox)
    User.objects.filter(pk=charlie.pk).update(email="charles@example.net")

    response = client.get(link)

    assert response.status_code == 400
    assert not User.objects.get(pk=charlie.pk).email_verified


def test_a_link_to_the_current_address_never_confirms_the_pending_one(client, charlie, mailoutbox):
    services.email_change_request(user=charlie, new_email="charles@example.net", password=PASSWORD)
    link = verification_link(charlie, mailoutbox)
    client.force_login(charlie)

    client.post(link)

    charlie.refresh_from_db()
    assert charlie.email == "charlie@example.com" and charlie.email_verified
    assert charlie.pending_email == "charles@example.net"


def test_a_link_of_a_deleted_account_does_not_work(client, charlie, mailoutbox):
    link = verification_link(charlie, mailoutbox)
    services.account_delete(user=charlie)

    response = client.get(link)

    assert response.status_code == 400
    assert balance_for(charlie) == 0
