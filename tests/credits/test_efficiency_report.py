"""The person's own GPU efficiency report: credit spent, and spent while their GPUs sat idle."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.credits import views
from portal.instances.models import Instance
from tests.conftest import text
from tests.instances.efficiency_data import running_instance

HOUR = 3600


@pytest.fixture
def alices(alice):
    """Half idle on cpu (4 of 8 GPU-h), all busy on pytorch (2 GPU-h), and one unmeasured (3 GPU-h)."""
    return {
        "half_idle": running_instance(
            alice, size="8x", charged_gpu_seconds=8 * HOUR, gpu_seconds_sampled=800, gpu_seconds_busy=400
        ),
        "busy": running_instance(
            alice,
            image_key="pytorch",
            charged_gpu_seconds=2 * HOUR,
            gpu_seconds_sampled=60,
            gpu_seconds_busy=60,
        ),
        "unmeasured": running_instance(alice, charged_gpu_seconds=3 * HOUR),
    }


def test_it_shows_credit_spent_and_spent_idle_by_image_and_instance(alice_client, alices):
    page = text(alice_client.get(reverse("credits:efficiency")))
    assert "Credit spent: 13.00 GPU-hours on 3 instances." in page
    assert "Spent while the GPUs sat idle: 4.00 GPU-hours (40% of the 10.00 measured)." in page
    assert "Not measured: 3.00 GPU-hours." in page
    # By image: cpu has 11 GPU-h spent, 4 idle, 3 unmeasured; pytorch 2 spent, none idle.
    assert "CPU 11.00 4.00 50% 3.00" in page
    assert "PYTORCH 2.00 0.00 0% 0.00" in page
    # By instance: the unmeasured one says so instead of an idle figure.
    assert f"{alices['half_idle'].short_id} CPU · 8x 8.00 4.00 50%" in page
    assert f"{alices['unmeasured'].short_id} CPU · 1x 3.00 not measured" in page


def test_it_does_not_count_an_unmeasured_instance_as_idle(alice, alice_client):
    running_instance(alice, charged_gpu_seconds=5 * HOUR)
    page = text(alice_client.get(reverse("credits:efficiency")))
    assert "Credit spent: 5.00 GPU-hours on 1 instance." in page
    assert "Spent while the GPUs sat idle" not in page
    assert "Not measured: 5.00 GPU-hours." in page


def test_a_person_sees_only_their_own_report(alices, bob, bob_client):
    running_instance(bob, charged_gpu_seconds=HOUR, gpu_seconds_sampled=10, gpu_seconds_busy=0)
    page = text(bob_client.get(reverse("credits:efficiency")))
    assert "Credit spent: 1.00 GPU-hours on 1 instance." in page
    for instance in alices.values():
        assert instance.short_id not in page


def test_the_window_leaves_out_instances_that_stopped_before_it(alice, alice_client):
    old = running_instance(alice, charged_gpu_seconds=HOUR, gpu_seconds_sampled=10, gpu_seconds_busy=0)
    Instance.objects.filter(pk=old.pk).update(
        state=Instance.State.STOPPED, stopped_at=timezone.now() - timedelta(days=20)
    )
    assert old.short_id in text(alice_client.get(reverse("credits:efficiency") + "?days=30"))
    page = text(alice_client.get(reverse("credits:efficiency") + "?days=7"))
    assert "No instance ran in this window." in page


def test_the_dashboard_links_to_it(alice_client):
    assert reverse("credits:efficiency") in alice_client.get(reverse("credits:dashboard")).content.decode()


def test_it_sends_a_logged_out_browser_to_sign_in(client):
    response = client.get(reverse("credits:efficiency"))
    assert response.status_code == 302


def test_it_lists_only_the_instances_with_the_most_idle_credit_when_there_are_many(
    alice, alice_client, monkeypatch
):
    monkeypatch.setattr(views, "EFFICIENCY_INSTANCE_ROWS", 1)
    idle = running_instance(alice, charged_gpu_seconds=HOUR, gpu_seconds_sampled=10, gpu_seconds_busy=0)
    busy = running_instance(alice, charged_gpu_seconds=HOUR, gpu_seconds_sampled=10, gpu_seconds_busy=10)
    page = text(alice_client.get(reverse("credits:efficiency")))
    assert "Credit spent: 2.00 GPU-hours on 2 instances." in page
    assert "The 1 of 2 instances with the most idle credit." in page
    assert idle.short_id in page
    assert busy.short_id not in page
