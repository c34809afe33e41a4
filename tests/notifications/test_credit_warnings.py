"""credit_warnings_check, as the meter tick calls it after each charge: each warning once per low-credit
episode, and a top-up that lifts the balance above the threshold starts a new episode."""

import pytest

from portal.credits.selectors import balance_for
from portal.notifications import services
from portal.notifications.models import Kind, Notification
from tests.conftest import give, mails_to

from .conftest import HOUR, spend_to

pytestmark = pytest.mark.django_db

ONE_GPU = 3600  # GPU-seconds per hour burned by a 1x instance
EIGHT_GPUS = 8 * 3600


@pytest.fixture
def tick(alice, mailoutbox, django_capture_on_commit_callbacks):
    """One meter tick for alice: charge her down to `balance` (GPU-seconds), then check the warnings.

    Returns the subjects of the emails this tick sent her.
    """

    def run(balance=None, burn=ONE_GPU):
        before = len(mails_to(mailoutbox, alice))
        current = spend_to(alice, balance) if balance is not None else balance_for(alice)
        with django_capture_on_commit_callbacks(execute=True):
            services.credit_warnings_check(
                user=alice, balance_gpu_seconds=current, burn_gpu_seconds_per_hour=burn
            )
        return [message.subject for message in mails_to(mailoutbox, alice)[before:]]

    return run


ONE_HOUR_LEFT = "About 1 hour of GPU credit left on DevCloud"
TEN_MINUTES_LEFT = "About 10 minutes of GPU credit left: your instances stop soon"


def test_it_warns_once_at_1_hour_and_once_at_10_minutes_while_the_balance_falls(alice, tick):
    give(alice, 2)

    assert tick(balance=int(1.5 * HOUR)) == []
    assert tick(balance=59 * 60) == [ONE_HOUR_LEFT]
    # Staying low sends nothing more, tick after tick.
    assert tick(balance=45 * 60) == []
    assert tick(balance=11 * 60) == []
    assert tick(balance=9 * 60) == [TEN_MINUTES_LEFT]
    assert tick(balance=5 * 60) == []
    assert tick(balance=30) == []
    assert Notification.objects.filter(user=alice).count() == 2


def test_it_warns_again_after_a_top_up_when_the_balance_falls_again(alice, tick):
    give(alice, 2)
    assert tick(balance=50 * 60) == [ONE_HOUR_LEFT]
    assert tick(balance=8 * 60) == [TEN_MINUTES_LEFT]

    give(alice, 2)  # an operator grant or an approved bonus

    assert tick() == []
    assert tick(balance=55 * 60) == [ONE_HOUR_LEFT]
    assert tick(balance=40 * 60) == []
    assert tick(balance=7 * 60) == [TEN_MINUTES_LEFT]
    assert Notification.objects.filter(user=alice, kind=Kind.CREDIT_LOW_1H).count() == 2
    assert Notification.objects.filter(user=alice, kind=Kind.CREDIT_LOW_10M).count() == 2


def test_a_top_up_that_leaves_the_balance_low_starts_no_new_episode(alice, tick):
    give(alice, 2)
    assert tick(balance=40 * 60) == [ONE_HOUR_LEFT]

    give(alice, 0.25)  # 15 minutes more: 55 minutes, still under an hour

    assert tick() == []
    assert tick(balance=30 * 60) == []


def test_it_sends_only_the_10_minute_warning_to_a_user_who_falls_straight_below_it(alice, tick):
    give(alice, 2)
    # An 8x instance burns 8 GPU-hours per hour: 50 GPU-minutes last about 6 minutes.
    assert tick(balance=50 * 60, burn=EIGHT_GPUS) == [TEN_MINUTES_LEFT]

    # The 8x stops and a 1x keeps running: the runway grows to 50 minutes, but the user already knows.
    assert tick(burn=ONE_GPU) == []


def test_it_measures_the_runway_at_the_current_burn(alice, tick):
    give(alice, 10)

    # 7 GPU-hours last 7 hours on one GPU, but less than an hour on eight.
    assert tick(balance=7 * HOUR, burn=ONE_GPU) == []
    assert tick(burn=EIGHT_GPUS) == [ONE_HOUR_LEFT]


@pytest.mark.parametrize("balance, burn", [(30 * 60, 0), (0, ONE_GPU), (-60, ONE_GPU)])
def test_it_warns_nobody_with_nothing_running_or_nothing_left(alice, mailoutbox, balance, burn):
    assert (
        services.credit_warnings_check(
            user=alice, balance_gpu_seconds=balance, burn_gpu_seconds_per_hour=burn
        )
        is None
    )
    assert not Notification.objects.exists()


def test_it_keeps_episodes_per_user(alice, bob, tick, mailoutbox, django_capture_on_commit_callbacks):
    give(alice, 2)
    give(bob, 2)
    assert tick(balance=50 * 60) == [ONE_HOUR_LEFT]

    bob_balance = spend_to(bob, 50 * 60)
    with django_capture_on_commit_callbacks(execute=True):
        services.credit_warnings_check(
            user=bob, balance_gpu_seconds=bob_balance, burn_gpu_seconds_per_hour=ONE_GPU
        )

    assert [message.subject for message in mails_to(mailoutbox, bob)] == [ONE_HOUR_LEFT]


def test_it_records_but_does_not_email_warnings_the_user_turned_off(alice, tick):
    services.email_preferences_set(user=alice, emailed_kinds=[Kind.CREDIT_LOW_10M])
    give(alice, 2)

    assert tick(balance=50 * 60) == []
    assert tick(balance=5 * 60) == [TEN_MINUTES_LEFT]
    assert Notification.objects.filter(user=alice, kind=Kind.CREDIT_LOW_1H, email_enabled=False).count() == 1
