"""A member's suspension stops their project instances too (charged to the pool), and a removal racing
a launch for the project never leaves the removed member an instance."""

import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404
from django.utils import timezone

from portal.accounts import services as account_services
from portal.credits.models import LedgerEntry
from portal.instances import selectors, services
from portal.instances.models import Instance
from portal.projects import services as project_services
from provisioning.drivers import fake
from tests.conftest import give, make_user
from tests.support.race import at_once

from .conftest import add_member, fund

pytestmark = pytest.mark.usefixtures("cloud")


def test_suspending_a_member_stops_their_project_instances_and_charges_the_pool(
    vllm, alice, bob, olivia, cpu
):
    fund(vllm, 10)
    give(bob, 10)
    pooled = services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    personal = services.instance_launch(user=bob, size="1x", image_key="cpu")
    alices = services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")
    since = timezone.now() - timezone.timedelta(seconds=60)
    Instance.objects.filter(pk=pooled.pk).update(
        state="running", step="ready", ready_at=since, metered_until=since
    )

    account_services.user_suspend(user=bob, actor=olivia, reason="Mining")

    for instance in (pooled, personal):
        instance.refresh_from_db()
        assert instance.stop_reason == "suspended"
    assert Instance.objects.get(pk=alices.pk).state == "queued"
    charged = LedgerEntry.objects.get(kind="usage")
    assert charged.account.project_id == vllm.pk and charged.instance_id == pooled.id


@pytest.mark.django_db(transaction=True)
def test_a_removal_racing_a_launch_leaves_the_removed_member_no_live_project_instance(monkeypatch):
    fake.make_image("cpu")
    alice, bob = make_user("alice@example.com"), make_user("bob@example.com")
    project = project_services.project_create(user=alice, slug="vllm", name="vLLM")
    add_member(project, bob)
    fund(project, 100)
    read = selectors.project_burning

    def slow_read(*args, **kwargs):
        found = read(*args, **kwargs)
        time.sleep(0.5)
        return found

    monkeypatch.setattr(selectors, "project_burning", slow_read)
    jobs = iter(
        [
            lambda: services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm"),
            lambda: project_services.member_remove(user=alice, project=project, member_id=bob.pk),
        ]
    )
    taking = threading.Lock()

    def next_job():
        with taking:
            job = next(jobs)
        return job()

    _, errors = at_once(next_job)

    assert all(isinstance(error, (Http404, ValidationError)) for error in errors)
    assert not project.memberships.filter(user=bob).exists()
    assert not Instance.objects.filter(project=project, user=bob, state__in=Instance.LIVE_STATES).exists()
