"""/console/efficiency/: the fleet's credit spent while GPUs sat idle, by user, project and image, its
chart and its CSV export. Staff only."""

import csv
import io

import pytest
from django.http import StreamingHttpResponse
from django.urls import reverse

from portal.projects.models import Project
from tests.conftest import text
from tests.instances.efficiency_data import running_instance

HOUR = 3600


@pytest.fixture
def fleet(alice, bob):
    """alice: a personal 8x half idle (8 GPU-h, 4 idle) on cpu. bob: a vllm project instance all idle
    (2 GPU-h) on pytorch, and an unmeasured one (3 GPU-h) on cpu."""
    vllm = Project.objects.create(slug="vllm", name="vLLM")
    return [
        running_instance(
            alice, size="8x", charged_gpu_seconds=8 * HOUR, gpu_seconds_sampled=800, gpu_seconds_busy=400
        ),
        running_instance(
            bob,
            project=vllm,
            image_key="pytorch",
            charged_gpu_seconds=2 * HOUR,
            gpu_seconds_sampled=60,
            gpu_seconds_busy=0,
        ),
        running_instance(bob, charged_gpu_seconds=3 * HOUR),
    ]


def test_it_reports_the_fleet_by_user_project_and_image(olivia_client, fleet):
    response = olivia_client.get(reverse("console:efficiency"))
    page = text(response)
    assert "Credit spent: 13.00 GPU-hours on 3 instances." in page
    assert "Spent while GPUs sat idle: 6.00 GPU-hours (60% of the 10.00 measured)." in page
    assert "alice@example.com 8.00 4.00 50% 0.00" in page
    assert "bob@example.com 5.00 2.00 100% 3.00" in page
    assert "vllm 2.00 2.00 100% 0.00" in page
    assert "(personal) 11.00 4.00 50% 3.00" in page
    assert "CPU 11.00 4.00 50% 3.00" in page
    assert "PYTORCH 2.00 2.00 100% 0.00" in page


def test_it_draws_the_idle_chart_by_user(olivia_client, fleet):
    html = olivia_client.get(reverse("console:efficiency")).content.decode()
    assert 'data-chart="chart-idle-by-user"' in html
    assert "alice@example.com: 4.00 GPU-h" in html


def test_it_says_no_data_when_nothing_sat_idle(olivia_client, db):
    page = olivia_client.get(reverse("console:efficiency")).content.decode()
    assert 'data-testid="no-data"' in page


def test_the_csv_has_a_header_and_a_row_per_user_project_and_image(olivia_client, fleet):
    response = olivia_client.get(reverse("console:efficiency_export") + "?days=7")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="devcloud-efficiency-7d-')
    assert isinstance(response, StreamingHttpResponse)
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == [
        "group",
        "name",
        "instances",
        "charged_gpu_hours",
        "idle_gpu_hours",
        "idle_percent_of_measured",
        "unmeasured_gpu_hours",
    ]
    assert ["user", "alice@example.com", "1", "8.00", "4.00", "50", "0.00"] in rows
    assert ["user", "bob@example.com", "2", "5.00", "2.00", "100", "3.00"] in rows
    assert ["project", "vllm", "1", "2.00", "2.00", "100", "0.00"] in rows
    assert ["project", "(personal)", "2", "11.00", "4.00", "50", "3.00"] in rows
    assert ["image", "PYTORCH", "1", "2.00", "2.00", "100", "0.00"] in rows
    assert len(rows) == 1 + 2 + 2 + 2


@pytest.mark.parametrize("name", ["console:efficiency", "console:efficiency_export"])
def test_a_non_operator_is_refused(alice_client, fleet, name):
    response = alice_client.get(reverse(name))
    assert response.status_code == 403
    assert b"alice@example.com" not in response.content


@pytest.mark.parametrize("name", ["console:efficiency", "console:efficiency_export"])
def test_a_logged_out_browser_is_sent_to_sign_in(client, db, name):
    assert client.get(reverse(name)).status_code == 302
