"""A project's longest run (max_run_seconds) stops its instances when it is shorter than their size's
limit; personal instances keep the size's limit."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances import limits, services
from portal.instances.models import Instance, LaunchPolicy
from portal.projects.models import Project
from tests.conftest import give

from .conftest import fund

pytestmark = pytest.mark.usefixtures("cloud")


def running(user, *, ready_hours_ago, project=None):
    instance = services.instance_launch(user=user, size="1x", image_key="cpu", project=project)
    ready_at = timezone.now() - timedelta(hours=ready_hours_ago)
    Instance.objects.filter(pk=instance.pk).update(
        state="running", step="ready", ready_at=ready_at, metered_until=ready_at
    )
    return instance


def test_it_stops_a_project_instance_past_the_projects_longest_run_and_not_a_personal_one(
    vllm, bob, cpu, django_capture_on_commit_callbacks
):
    LaunchPolicy.current()
    LaunchPolicy.objects.update(max_session_hours={"1x": 12})
    Project.objects.filter(pk=vllm.pk).update(max_run_seconds=2 * 3600, max_live_instances=5)
    fund(vllm, 100)
    give(bob, 100)
    overdue = running(bob, ready_hours_ago=3, project=vllm)
    young = running(bob, ready_hours_ago=1, project=vllm)
    personal = running(bob, ready_hours_ago=3)

    with django_capture_on_commit_callbacks(execute=True):
        stopped = limits.enforce_max_session_length()

    assert stopped == [str(overdue.id)]
    overdue.refresh_from_db(), young.refresh_from_db(), personal.refresh_from_db()
    assert overdue.state in ("stopping", "stopped") and overdue.stop_reason == "max_length"
    assert young.state == personal.state == "running"


def test_the_sizes_limit_still_applies_when_it_is_shorter_than_the_projects(
    vllm, bob, cpu, django_capture_on_commit_callbacks
):
    LaunchPolicy.current()
    LaunchPolicy.objects.update(max_session_hours={"1x": 2})
    Project.objects.filter(pk=vllm.pk).update(max_run_seconds=10 * 3600)
    fund(vllm, 100)
    overdue = running(bob, ready_hours_ago=3, project=vllm)

    with django_capture_on_commit_callbacks(execute=True):
        assert limits.enforce_max_session_length() == [str(overdue.id)]
