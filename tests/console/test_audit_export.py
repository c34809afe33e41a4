"""/console/audit/export.csv: the page's filtered rows as CSV, streamed."""

import csv
import io
from datetime import UTC, datetime

import pytest
from django.http import StreamingHttpResponse

from portal.audit.services import audit_record

from .conftest import clock_at

URL = "/console/audit/export.csv"
HEADER = [
    "created_at",
    "actor",
    "actor_id",
    "action",
    "target_type",
    "target_id",
    "target",
    "reason",
    "details",
]


def rows_of(response):
    assert isinstance(response, StreamingHttpResponse)
    text = b"".join(response.streaming_content).decode("utf-8")
    return list(csv.reader(io.StringIO(text)))


@pytest.fixture
def log(olivia, alice, bob):
    with clock_at(datetime(2025, 3, 1, 9, 30, 15, tzinfo=UTC)):
        grant = audit_record(
            actor=olivia,
            action="credits.adjust",
            target=alice,
            reason="Conference voucher",
            details={"hours": 5},
        )
    with clock_at(datetime(2025, 3, 2, 10, tzinfo=UTC)):
        suspend = audit_record(actor=olivia, action="user.suspend", target=bob, reason="Crypto mining")
    with clock_at(datetime(2025, 3, 3, 11, tzinfo=UTC)):
        approve = audit_record(actor=None, action="bonus.approve", target=alice, reason="Listed, certificate")
    return grant, suspend, approve


def test_it_exports_every_entry_with_a_header_and_iso_timestamps(olivia_client, olivia, alice, log):
    response = olivia_client.get(URL)

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="devcloud-audit-')
    rows = rows_of(response)
    assert rows[0] == HEADER
    assert [row[3] for row in rows[1:]] == ["bonus.approve", "user.suspend", "credits.adjust"]
    assert rows[3] == [
        "2025-03-01T09:30:15+00:00",
        "Olivia Operator <olivia@ops.example.com>",
        str(olivia.pk),
        "credits.adjust",
        "accounts.user",
        str(alice.pk),
        "alice@example.com",
        "Conference voucher",
        '{"hours": 5}',
    ]
    # A comma in a reason stays inside its cell; the system has no actor id.
    assert rows[1][1:3] == ["system", ""] and rows[1][7] == "Listed, certificate"


def test_it_exports_exactly_the_filtered_rows(olivia_client, log):
    by_search = rows_of(olivia_client.get(URL, {"q": "olivia"}))
    by_action = rows_of(olivia_client.get(URL, {"action": "bonus.approve"}))
    by_dates = rows_of(olivia_client.get(URL, {"from": "2025-03-02", "to": "2025-03-02"}))
    nothing = rows_of(olivia_client.get(URL, {"q": "zebra"}))

    assert [row[3] for row in by_search[1:]] == ["user.suspend", "credits.adjust"]
    assert [row[3] for row in by_action[1:]] == ["bonus.approve"]
    assert [row[3] for row in by_dates[1:]] == ["user.suspend"]
    assert nothing == [HEADER]


def test_it_exports_more_rows_than_a_page_holds(olivia_client, olivia, alice):
    for number in range(120):
        audit_record(actor=olivia, action="credits.adjust", target=alice, reason=f"Grant {number}")

    rows = rows_of(olivia_client.get(URL))

    assert len(rows) == 121
    assert {row[7] for row in rows[1:]} == {f"Grant {number}" for number in range(120)}


def test_it_keeps_spreadsheets_from_running_cells_as_formulas(olivia_client, olivia, alice):
    alice.email = "=hyperlink@example.com"
    alice.save()
    audit_record(actor=olivia, action="credits.adjust", target=alice, reason='=HYPERLINK("http://evil")')

    row = rows_of(olivia_client.get(URL))[1]

    assert row[6] == "'=hyperlink@example.com"
    assert row[7] == '\'=HYPERLINK("http://evil")'
