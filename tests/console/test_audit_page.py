"""/console/audit/: search, filters, pagination."""

from datetime import UTC, datetime

import pytest
from pytest_django.asserts import assertContains, assertNotContains

from portal.audit.services import audit_record
from provisioning.models import GpuHost

from .conftest import clock_at

URL = "/console/audit/"


def at(day, hour=12):
    return datetime(2025, 3, day, hour, tzinfo=UTC)


@pytest.fixture
def log(olivia, alice, bob, oscar):
    """Five entries over five days of March 2025, by two operators and the system."""
    host = GpuHost.objects.create(name="gpu-07")
    entries = {}
    with clock_at(at(1)):
        entries["grant"] = audit_record(
            actor=olivia, action="credits.adjust", target=alice, reason="Conference voucher"
        )
    with clock_at(at(2)):
        entries["drain"] = audit_record(actor=oscar, action="host.drain", target=host, reason="Fan failure")
    with clock_at(at(3)):
        entries["suspend"] = audit_record(
            actor=olivia, action="user.suspend", target=bob, reason="Crypto mining"
        )
    with clock_at(at(4)):
        entries["approve"] = audit_record(
            actor=None, action="bonus.approve", target=alice, reason="Listed certificate"
        )
    with clock_at(at(5, hour=23)):
        entries["stop"] = audit_record(
            actor=oscar, action="instance.force_stop", target=host, reason="Runaway job"
        )
    return entries


def shown(response):
    """Ids of the entries on the page, in order."""
    return [entry.pk for entry in response.context["page"].object_list]


def ids(log, *names):
    return [log[name].pk for name in names]


def test_it_lists_every_entry_newest_first(olivia_client, log):
    page = olivia_client.get(URL)

    assert shown(page) == ids(log, "stop", "approve", "suspend", "drain", "grant")
    assertContains(page, "Olivia Operator &lt;olivia@ops.example.com&gt;")
    assertContains(page, "<code>host.drain</code>", html=True)
    assertContains(page, "Fan failure")
    assertContains(page, "5 entries.")


@pytest.mark.parametrize(
    "query, expected",
    [
        ("oscar", ["stop", "drain"]),  # the actor's recorded name
        ("SUSPEND", ["suspend"]),  # the action code, any case
        ("alice@example", ["approve", "grant"]),  # the target's description
        ("gpu-07", ["stop", "drain"]),
        ("voucher", ["grant"]),  # the reason
        ("system", ["approve"]),
        ("nothing like this", []),
    ],
)
def test_it_searches_actor_action_target_and_reason(olivia_client, log, query, expected):
    assert shown(olivia_client.get(URL, {"q": query})) == ids(log, *expected)


def test_it_filters_by_action(olivia_client, log):
    page = olivia_client.get(URL, {"action": "user.suspend"})

    assert shown(page) == ids(log, "suspend")
    assertContains(
        page, '<option value="user.suspend" selected>User suspended (user.suspend)</option>', html=True
    )


def test_it_filters_by_date_range_including_both_days(olivia_client, log):
    assert shown(olivia_client.get(URL, {"from": "2025-03-02", "to": "2025-03-04"})) == ids(
        log, "approve", "suspend", "drain"
    )
    # 23:00 on the 5th is still "to 2025-03-05".
    assert shown(olivia_client.get(URL, {"from": "2025-03-05"})) == ids(log, "stop")
    assert shown(olivia_client.get(URL, {"to": "2025-03-01"})) == ids(log, "grant")


def test_it_combines_search_action_and_dates(olivia_client, log):
    page = olivia_client.get(
        URL, {"q": "olivia", "action": "user.suspend", "from": "2025-03-03", "to": "2025-03-03"}
    )

    assert shown(page) == ids(log, "suspend")
    assertContains(page, "1 entry matches.")


@pytest.mark.parametrize(
    "params, message",
    [
        ({"from": "yesterday"}, "“yesterday” is not a date for “from”; use YYYY-MM-DD."),
        ({"to": "2025-02-30"}, "“2025-02-30” is not a date for “to”; use YYYY-MM-DD."),
        (
            {"from": "2025-03-04", "to": "2025-03-02"},
            "The range starts (2025-03-04) after it ends (2025-03-02)",
        ),
    ],
)
def test_it_explains_bad_dates_and_ignores_them(olivia_client, log, params, message):
    page = olivia_client.get(URL, params)

    assertContains(page, message)
    assert len(shown(page)) == 5


def test_it_says_when_nothing_matches(olivia_client, log):
    assertContains(olivia_client.get(URL, {"q": "zebra"}), "No entries match these filters.")


def test_it_says_when_the_log_is_empty(olivia_client):
    assertContains(olivia_client.get(URL), "No operator actions recorded yet.")


def test_it_pages_through_a_long_log_keeping_the_filters(olivia_client, olivia, alice):
    for number in range(60):
        audit_record(actor=olivia, action="credits.adjust", target=alice, reason=f"Grant {number}")
    audit_record(actor=olivia, action="user.suspend", target=alice, reason="Other action")

    first = olivia_client.get(URL, {"action": "credits.adjust"})
    second = olivia_client.get(URL, {"action": "credits.adjust", "page": 2})

    assert len(shown(first)) == 50 and len(shown(second)) == 10
    assert set(shown(first)).isdisjoint(shown(second))
    assertContains(first, 'href="?action=credits.adjust&amp;page=2"')
    assertContains(first, "Page 1 of 2")
    assertNotContains(second, "Other action")


def test_it_escapes_what_users_typed(olivia_client, olivia, alice):
    audit_record(actor=olivia, action="credits.adjust", target=alice, reason="<script>alert(1)</script>")

    page = olivia_client.get(URL)

    assertNotContains(page, "<script>alert(1)</script>")
    assertContains(page, "&lt;script&gt;alert(1)&lt;/script&gt;")


def test_it_links_the_export_to_the_current_filters(olivia_client, log):
    page = olivia_client.get(URL, {"q": "olivia", "action": "user.suspend", "from": "2025-03-01"})

    assertContains(
        page, 'href="/console/audit/export.csv?q=olivia&amp;action=user.suspend&amp;from=2025-03-01"'
    )
