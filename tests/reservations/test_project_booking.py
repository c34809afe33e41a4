"""A project's owner books from its pool: the hold is the pool's (its launches see it), a member who is
not an owner may not book, and anyone outside the project meets a 404. Launches on the booking are the
booker's, for the project."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404

from portal.instances import selectors, services
from portal.instances.models import Instance
from portal.projects import services as projects
from tests.conftest import balance, give, make_user
from tests.projects.conftest import add_member, fund, pool_balance

from .conftest import book, launch, open_now

HOUR = 3600


@pytest.fixture
def vllm(alice, bob, fleet):
    """alice owns it, bob is a member; 17 GPU-hours in the pool, 8x allowed."""
    project = projects.project_create(
        user=alice, slug="vllm", name="vLLM", repository_url="https://github.com/vllm-project/vllm"
    )
    add_member(project, bob)
    project.allowed_sizes = ["1x", "8x"]
    project.entitled_8x = True
    project.max_live_instances = 4
    project.save()
    fund(project, 17)
    return project


def test_an_owner_books_from_the_pool_and_its_launches_see_the_hold(alice, bob, vllm):
    booking = book(alice, gpus=8, start_in=2, hours=2, project=vllm)  # 16 of the pool's 17 held

    assert booking.project == vllm
    assert selectors.held_gpu_seconds(project_id=vllm.pk) == 16 * HOUR
    assert pool_balance(vllm) == 17 * HOUR  # held, not spent
    with pytest.raises(ValidationError) as caught:
        services.instance_launch(user=bob, size="8x", image_key="cpu", project=vllm)  # needs 2, 1 is free
    assert caught.value.code == "credit" and "pool cannot cover" in caught.value.messages[0]
    with pytest.raises(ValidationError) as caught:
        book(alice, gpus=1, start_in=6, hours=2, project=vllm)
    assert caught.value.code == "credit"


def test_a_member_who_is_no_owner_may_not_book_and_an_outsider_meets_a_404(bob, vllm):
    give(bob, 100)
    with pytest.raises(PermissionDenied):
        book(bob, gpus=1, project=vllm)
    with pytest.raises(Http404):
        book(make_user("dave@example.com"), gpus=1, project=vllm)


def test_the_booker_launches_on_the_project_booking_and_the_pool_pays(alice, vllm):
    booking = open_now(book(alice, gpus=8, start_in=2, hours=2, project=vllm))

    instance = launch(alice, "8x", project=vllm)

    assert instance.state == Instance.State.RUNNING and instance.reservation == booking
    assert balance(alice) == 0


def test_a_project_booking_named_by_a_personal_launch_says_how_to_launch_on_it(alice, vllm):
    booking = open_now(book(alice, gpus=8, start_in=2, hours=2, project=vllm))

    with pytest.raises(ValidationError) as caught:
        services.instance_launch(user=alice, size="8x", image_key="cpu", reservation=booking.id)

    assert caught.value.code == "booking" and "(project vllm)" in caught.value.messages[0]
