"""Placement knows which hosts have the instance's image: a launch never lands where it cannot start."""

import pytest
from django.utils import timezone

from provisioning.models import HostImage, ImageJob
from provisioning.scheduler import allocate

pytestmark = pytest.mark.django_db


def has(host, image, present=True):
    HostImage.objects.create(host=host, reference=image.reference, present=present, checked_at=timezone.now())


def placed_on(instance):
    allocations = allocate(instance_id=instance.pk)
    return allocations[0].gpu.host if allocations else None


def test_it_places_a_launch_on_the_host_that_has_the_image_even_when_packing_would_choose_another(
    alice, host_make, host_queued_instance, host_image
):
    without = host_make("gpu-a-without")
    with_image = host_make("gpu-b-with")
    has(without, host_image, present=False)
    has(with_image, host_image)

    assert placed_on(host_queued_instance(alice)) == with_image


def test_it_never_places_on_a_host_known_to_lack_the_image_and_queues_instead(
    alice, host_make, host_queued_instance, host_image
):
    lacking = host_make("gpu-a-lacking")
    has(lacking, host_image, present=False)

    assert placed_on(host_queued_instance(alice)) is None


def test_it_places_on_a_host_where_a_pull_of_the_image_is_under_way_when_no_host_has_it(
    alice, host_make, host_queued_instance, host_image
):
    lacking = host_make("gpu-a-lacking")
    pulling = host_make("gpu-b-pulling")
    has(lacking, host_image, present=False)
    has(pulling, host_image, present=False)
    ImageJob.objects.create(host=pulling, image=host_image, reference=host_image.reference, state="running")

    assert placed_on(host_queued_instance(alice)) == pulling


def test_it_prefers_a_host_with_the_image_to_one_still_pulling_it_for_an_8x(
    alice, host_make, host_queued_instance, host_image
):
    pulling = host_make("gpu-a-pulling")
    ready = host_make("gpu-b-ready")
    ImageJob.objects.create(host=pulling, image=host_image, reference=host_image.reference, state="queued")
    has(pulling, host_image, present=False)
    has(ready, host_image)

    assert placed_on(host_queued_instance(alice, size="8x")) == ready


def test_a_host_whose_images_were_never_looked_at_still_takes_launches(
    alice, host_make, host_queued_instance
):
    unsurveyed = host_make("gpu-a")

    assert placed_on(host_queued_instance(alice)) == unsurveyed
