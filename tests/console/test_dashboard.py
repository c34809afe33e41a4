"""/console/: one chart per question an operator asks, for every range, with or without data."""

import re
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from pytest_django.asserts import assertContains, assertNotContains
from social_django.models import UserSocialAuth

from portal.api.robots import project_bot
from portal.console.models import CapacitySample
from portal.credits import services as credit_services
from portal.projects.services import project_create

from ..conftest import make_user
from .conftest import clock_at, launch, make_host

URL = "/console/"
CHARTS = ["capacity", "burn", "signups", "credits", "queue", "wait", "top-users"]
RANGES = [{"range": "24h"}, {"range": "7d"}, {"range": "30d"}, {"range": "90d"}, {}]
HOUR = 3600


def chart(response, key):
    """The <svg> of one chart, or None."""
    found = re.search(rf'<svg [^>]*data-chart="chart-{key}".*?</svg>', response.content.decode(), re.DOTALL)
    return found.group(0) if found else None


def tooltips(svg):
    """What each point or bar says about itself (its <title>; the chart's own has an id)."""
    return re.findall(r"<title>([^<]*)</title>", svg)


def series_names(svg):
    return re.findall(r'<g class="series" data-series="([^"]*)"', svg)


def panel(response, key):
    found = re.search(rf'data-testid="panel-{key}">(.*?)</section>', response.content.decode(), re.DOTALL)
    return found.group(1)


def use(user, gpu_hours, at):
    with clock_at(at):
        credit_services.ledger_post(
            user=user,
            kind="usage",
            gpu_seconds=-int(gpu_hours * HOUR),
            idempotency_key=str(uuid.uuid4()),
            reason="Usage",
        )


def grant(user, gpu_hours, at, kind="grant"):
    with clock_at(at):
        credit_services.ledger_post(
            user=user,
            kind=kind,
            gpu_seconds=int(gpu_hours * HOUR),
            idempotency_key=str(uuid.uuid4()),
            reason="Grant",
        )


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def history(now, alice, bob, image):
    """Activity an hour, three days, twenty days and sixty days ago."""
    host = make_host("gpu-01")
    gpus = list(host.gpus.all())
    for hours_ago, allocated, queued in [(1, 6, 2), (2, 4, 0), (72, 8, 5), (480, 2, 0), (1440, 1, 0)]:
        CapacitySample.objects.create(
            taken_at=now - timedelta(hours=hours_ago),
            gpus_total=8,
            gpus_allocated=allocated,
            queue_length=queued,
            oldest_queued_wait_seconds=queued * 60,
            running_instances=allocated,
        )
    grant(alice, 25, now - timedelta(hours=1))
    grant(bob, 50, now - timedelta(days=3), kind="bonus")
    use(alice, 3, now - timedelta(hours=1))
    use(bob, 1.5, now - timedelta(hours=1))
    use(bob, 10, now - timedelta(days=3))
    use(alice, 100, now - timedelta(days=60))
    make_user("gh@example.com", date_joined=now - timedelta(hours=2))
    UserSocialAuth.objects.create(
        user=make_user("octo@example.com", date_joined=now - timedelta(hours=2)),
        provider="github",
        uid="583231",
    )
    make_user("old@example.com", date_joined=now - timedelta(days=20))
    # Launches requested an hour ago: one got its GPU after 10 minutes, one after 2, one is still queued.
    launch(
        alice,
        image,
        state="running",
        gpus=[gpus[0]],
        created_at=now - timedelta(hours=1),
        first_gpu_at=now - timedelta(minutes=50),
    )
    launch(
        bob,
        image,
        state="running",
        gpus=[gpus[1]],
        created_at=now - timedelta(hours=1),
        first_gpu_at=now - timedelta(minutes=58),
    )
    launch(bob, image, created_at=now - timedelta(hours=1))
    return now


@pytest.mark.parametrize("params", RANGES)
def test_it_draws_every_chart_for_every_range(olivia_client, history, params):
    page = olivia_client.get(URL, params)

    assert page.status_code == 200
    for key in CHARTS:
        svg = chart(page, key)
        assert svg is not None, key
        assert 'role="img"' in svg and f'aria-labelledby="chart-{key}-title chart-{key}-desc"' in svg
    assert series_names(chart(page, "capacity"))[0] == "Total"
    assert series_names(chart(page, "signups")) == ["Email", "GitHub"]
    assert series_names(chart(page, "credits")) == ["Granted", "Burned"]
    assert series_names(chart(page, "burn")) == ["Burned"]
    assert series_names(chart(page, "queue")) == ["Queued launches"]
    assert series_names(chart(page, "wait")) == ["Average", "Longest"]
    assertNotContains(page, "No data yet")


def test_it_counts_only_what_happened_in_the_range(olivia_client, history):
    day = olivia_client.get(URL, {"range": "24h"})
    week = olivia_client.get(URL, {"range": "7d"})
    quarter = olivia_client.get(URL, {"range": "90d"})

    def burned(page):
        return sum(float(text.rsplit(": ", 1)[1]) for text in tooltips(chart(page, "burn")))

    assert burned(day) == pytest.approx(4.5)
    assert burned(week) == pytest.approx(14.5)
    assert burned(quarter) == pytest.approx(114.5)
    assertContains(day, '<div class="figure-value">4.50</div>', html=True)
    assertContains(week, '<div class="figure-value">75.00</div>', html=True)  # granted: 25 + 50 bonus


def test_it_splits_signups_by_email_and_github(olivia_client, history):
    page = olivia_client.get(URL, {"range": "24h"})

    svg = chart(page, "signups")
    # alice, bob and olivia (the fixtures) joined just now by email, gh@ an hour ago; octo@ has GitHub.
    assert "5 sign-ups: 4 by email, 1 with GitHub." in svg
    emails = sum(int(text.rsplit(": ", 1)[1]) for text in tooltips(svg) if "· Email:" in text)
    githubs = sum(int(text.rsplit(": ", 1)[1]) for text in tooltips(svg) if "· GitHub:" in text)
    assert (githubs, emails) == (1, 4)
    # old@ joined twenty days ago.
    assert "6 sign-ups: 5 by email" in chart(olivia_client.get(URL, {"range": "30d"}), "signups")


def test_a_projects_ci_bot_account_is_not_counted_as_a_sign_up(olivia_client, history, alice):
    project = project_create(user=alice, slug="tensor-tools", name="Tensor Tools")
    project_bot(project)

    svg = chart(olivia_client.get(URL, {"range": "24h"}), "signups")

    assert "5 sign-ups: 4 by email, 1 with GitHub." in svg


def test_it_plots_gpus_allocated_against_total_from_the_samples(olivia_client, history):
    page = olivia_client.get(URL, {"range": "24h"})

    svg = chart(page, "capacity")
    assert series_names(svg) == ["Total", "Allocated"]
    points = tooltips(svg)
    assert sum("· Total: 8" in text for text in points) == 2
    assert [text.rsplit(": ", 1)[1] for text in points if "· Allocated:" in text] == ["4", "6"]
    assert "Most allocated at once 6 of 8" in svg


def test_it_shows_peaks_as_well_as_averages_over_longer_ranges(olivia_client, history):
    svg = chart(olivia_client.get(URL, {"range": "7d"}), "capacity")

    assert series_names(svg) == ["Total", "Peak allocated", "Average allocated"]
    assert "Most allocated at once 8 of 8" in svg


def test_it_shows_the_queue_length_and_the_wait_of_launches(olivia_client, history):
    page = olivia_client.get(URL, {"range": "7d"})

    queue = chart(page, "queue")
    assert max(int(text.rsplit(": ", 1)[1]) for text in tooltips(queue)) == 5
    wait = chart(page, "wait")
    # The still-queued launch has no wait yet; the two others waited 10 and 2 minutes.
    assert "2 launches got GPUs; the longest waited 10.0 minutes." in wait
    assert any(text.endswith("· Average: 6") for text in tooltips(wait))
    assert any(text.endswith("· Longest: 10") for text in tooltips(wait))


def test_it_ranks_users_by_burn(olivia_client, history):
    page = olivia_client.get(URL, {"range": "7d"})

    svg = chart(page, "top-users")
    assert svg.index("bob@example.com") < svg.index("alice@example.com")
    assert "bob@example.com: 11.50 GPU-h" in svg and "alice@example.com: 3.00 GPU-h" in svg
    assert re.search(
        r'<a href="/admin/accounts/user/\d+/change/">bob@example.com</a>', panel(page, "top-users")
    )


def test_it_escapes_user_supplied_text_in_charts(olivia_client, now):
    mallory = make_user('"><script>alert(1)</script>@example.com')
    use(mallory, 2, now - timedelta(hours=1))

    page = olivia_client.get(URL, {"range": "24h"})

    assertNotContains(page, "<script>alert(1)</script>")
    assert "&lt;script&gt;" in chart(page, "top-users")


@pytest.mark.parametrize("params", RANGES + [{"range": "custom", "from": "2025-01-01", "to": "2025-01-31"}])
def test_it_says_no_data_yet_on_an_empty_database(olivia_client, params, db):
    page = olivia_client.get(URL, params)

    assert page.status_code == 200
    for key in ["capacity", "queue", "burn", "credits", "wait", "top-users"]:
        assert chart(page, key) is None
        assert "No data yet" in panel(page, key)
    assert "console.record_sample" in panel(page, "capacity")
    assertContains(page, '<div class="figure-value">0 / 0</div>', html=True)


def test_it_shows_a_custom_range_of_whole_days(olivia_client, history, now):
    three_days_ago = (now - timedelta(days=3)).date()

    page = olivia_client.get(
        URL, {"range": "custom", "from": three_days_ago.isoformat(), "to": three_days_ago.isoformat()}
    )

    assert page.context["time_range"].key == "custom"
    assertContains(page, f"{three_days_ago} to {three_days_ago}")
    assert "bob@example.com: 10.00 GPU-h" in chart(page, "top-users")
    assert "alice@example.com" not in chart(page, "top-users")


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"range": "custom", "from": "2025-13-01", "to": "2025-01-01"},
            "“2025-13-01” is not a date for “from”; use YYYY-MM-DD.",
        ),
        (
            {"range": "custom", "from": "last tuesday", "to": "2025-01-01"},
            "“last tuesday” is not a date for “from”",
        ),
        (
            {"range": "custom", "from": "2025-03-10", "to": "2025-03-01"},
            (
                "The range starts (2025-03-10) after it ends (2025-03-01); "
                "pick a “from” date before the “to” date."
            ),
        ),
        ({"range": "custom", "from": "2025-03-10"}, "A custom range needs both a “from” and a “to” date."),
        (
            {"range": "custom", "from": "2020-01-01", "to": "2025-01-01"},
            "A custom range can span at most 400 days.",
        ),
        (
            {"range": "custom", "from": "2999-01-01", "to": "2999-01-02"},
            "The range starts (2999-01-01) in the future.",
        ),
        ({"range": "1y"}, "Unknown range “1y”; pick one of 24h, 7d, 30d, 90d or dates."),
    ],
)
def test_it_explains_a_bad_range_and_shows_the_default(olivia_client, history, params, message):
    page = olivia_client.get(URL, params)

    assert page.status_code == 200
    assertContains(page, message)
    assertContains(page, "Showing the last 7 days instead.")
    assert page.context["time_range"].key == "7d"
    assert chart(page, "burn") is not None
