"""The notification list, "mark all read", and the dashboard's recent-notifications card: each user sees
only their own, unread ones stand out, and nobody gets in without logging in."""

from datetime import timedelta

import pytest
from django.template import engines
from django.test import Client, RequestFactory
from django.utils import timezone

from portal.notifications import selectors, services
from portal.notifications.models import Notification
from portal.notifications.services import StopReason

from .conftest import make_instance

pytestmark = pytest.mark.django_db

LIST = "/notifications/"
READ = "/notifications/read/"


def suspend(user, reason, days_ago=0):
    return services.notify_account_suspended(
        user=user, reason=reason, suspended_at=timezone.now() - timedelta(days=days_ago)
    )


def stop(user, image, reason=StopReason.CREDITS_EXHAUSTED, **extra):
    instance = make_instance(user, image)
    return instance, services.notify_instance_stopped(instance=instance, reason=reason, **extra)


@pytest.mark.parametrize(
    "method, path", [("get", LIST), ("post", READ), ("get", "/notifications/preferences/")]
)
def test_it_sends_anonymous_visitors_to_the_login_page(client, method, path):
    response = getattr(client, method)(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_it_lists_the_users_notifications_with_what_to_do(alice_client, alice, image):
    instance, _ = stop(alice, image)

    response = alice_client.get(LIST)

    page = response.content.decode()
    assert response.status_code == 200
    assert (
        f"Your instance {instance.short_id} (1x MI300X, CPU JupyterLab) was stopped: your credits ran out"
        in page
    )
    assert "Get more GPU-hours" in page
    assert f'href="/instances/{instance.id}/"' in page
    assert 'class="notification unread"' in page
    assert "1 unread" in page


def test_it_never_shows_one_users_notifications_to_another(alice_client, alice, bob, image):
    stop(alice, image, reason=StopReason.OPERATOR, operator_reason="Alice's private matter")
    suspend(bob, "Bob's private matter")

    page = alice_client.get(LIST).content.decode()

    assert "Alice&#x27;s private matter" in page
    assert "Bob" not in page
    assert [shown.notification.user_id for shown in selectors.recent_for(alice)] == [alice.pk]


def test_it_shows_a_user_with_no_notifications_an_empty_list(alice_client, bob):
    suspend(bob, "Bob's private matter")

    response = alice_client.get(LIST)

    assert response.status_code == 200
    assert 'data-testid="no-notifications"' in response.content.decode()


def test_it_escapes_what_an_operator_wrote(alice_client, alice, image):
    stop(alice, image, reason=StopReason.OPERATOR, operator_reason="<script>alert('x')</script>")

    page = alice_client.get(LIST).content.decode()

    assert "<script>alert" not in page
    assert "&lt;script&gt;alert" in page


def test_it_marks_only_the_users_own_notifications_read(alice_client, alice, bob, image):
    stop(alice, image)
    suspend(alice, "Mining")
    suspend(bob, "Mining")

    response = alice_client.post(READ)

    assert response.status_code == 302 and response["Location"] == LIST
    assert not Notification.objects.filter(user=alice, read_at__isnull=True).exists()
    assert Notification.objects.filter(user=bob, read_at__isnull=True).count() == 1
    page = alice_client.get(LIST).content.decode()
    assert 'class="notification unread"' not in page
    assert "Mark all read" not in page


def test_it_marks_read_only_on_post(alice_client, alice):
    suspend(alice, "Mining")

    response = alice_client.get(READ)

    assert response.status_code == 405
    assert Notification.objects.get(user=alice).read_at is None


def test_it_refuses_to_mark_read_without_the_csrf_token(alice, image):
    stop(alice, image)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)

    response = browser.post(READ)

    assert response.status_code == 403
    assert Notification.objects.get(user=alice).read_at is None


@pytest.mark.parametrize(
    "next_url, expected", [("/", "/"), ("https://evil.example.com/", LIST), ("//evil.example.com/", LIST)]
)
def test_it_goes_back_only_to_a_page_of_this_site(alice_client, alice, next_url, expected):
    suspend(alice, "Mining")

    response = alice_client.post(READ, {"next": next_url})

    assert response["Location"] == expected


def render_card(user, limit=None):
    request = RequestFactory().get("/")
    request.user = user
    source = "{% load notification_tags %}" + (
        "{% recent_notifications " + str(limit) + " %}" if limit else "{% recent_notifications %}"
    )
    return engines["django"].from_string(source).render({}, request)


def test_the_dashboard_card_shows_the_latest_five_with_unread_highlighted(alice, bob, image):
    for days_ago in range(7):
        suspend(alice, f"Reason number {days_ago}", days_ago=days_ago)
    Notification.objects.filter(user=alice).update(read_at=timezone.now())
    _, unread = stop(alice, image)
    suspend(bob, "Bob's private matter")

    card = render_card(alice)

    assert card.count('data-testid="notification"') == 5
    assert card.count('class="notification unread"') == 1
    assert f"{unread.context['instance_label']} was stopped" in card
    assert "(1 new)" in card
    assert "Mark all read" in card and 'name="csrfmiddlewaretoken"' in card
    assert 'href="/notifications/"' in card


def test_the_dashboard_card_invites_nothing_when_empty(alice):
    card = render_card(alice)

    assert "No notifications yet" in card
    assert "Mark all read" not in card


def test_the_unread_count_tag_counts_only_the_users_unread(alice, bob):
    suspend(alice, "One")
    suspend(alice, "Two", days_ago=1)
    suspend(bob, "Three")
    request = RequestFactory().get("/")
    request.user = alice

    rendered = (
        engines["django"]
        .from_string("{% load notification_tags %}[{% unread_notifications_count %}]")
        .render({}, request)
    )

    assert rendered == "[2]"
