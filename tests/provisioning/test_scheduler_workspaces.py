"""Placement prefers the host that holds the owner's workspace, so a launch there moves nothing; the image
comes first, and packing decides among the rest."""

import pytest
from django.utils import timezone

from provisioning.models import HostImage, Workspace
from provisioning.scheduler import allocate

pytestmark = pytest.mark.django_db


def placed_on(instance):
    allocations = allocate(instance_id=instance.pk)
    return allocations[0].gpu.host if allocations else None


def workspace_on(user, host):
    return Workspace.objects.create(user=user, host=host, volume_name=f"devcloud-ws-{user.pk}")


def test_it_places_a_launch_on_the_host_holding_the_owners_workspace_although_packing_prefers_another(
    alice, bob, host_make, host_queued_instance
):
    busy = host_make("gpu-a-busy")
    home = host_make("gpu-b-home")
    workspace_on(alice, home)
    # Bob's instance makes gpu-a the fullest host, which packing alone would pick.
    assert placed_on(host_queued_instance(bob)) == busy

    assert placed_on(host_queued_instance(alice)) == home


def test_it_places_a_launch_on_the_workspace_host_before_packing_among_hosts_that_have_the_image(
    alice, bob, host_make, host_queued_instance, host_image
):
    busy = host_make("gpu-a-busy")
    home = host_make("gpu-b-home")
    for host in (busy, home):
        HostImage.objects.create(host=host, reference=host_image.reference, present=True, checked_at=timezone.now())
    workspace_on(alice, home)
    assert placed_on(host_queued_instance(bob)) == busy

    assert placed_on(host_queued_instance(alice)) == home


def test_it_places_an_8x_on_the_workspace_host_when_it_is_whole_and_free(alice, host_make, host_queued_instance):
    host_make("gpu-a")
    home = host_make("gpu-b-home")
    workspace_on(alice, home)

    assert placed_on(host_queued_instance(alice, size="8x")) == home


def test_it_packs_as_before_for_someone_whose_workspace_host_is_full(alice, bob, host_make, host_queued_instance):
    home = host_make("gpu-a-home", gpus=1)
    first_by_packing = host_make("gpu-b")
    host_make("gpu-c")
    workspace_on(alice, home)
    assert placed_on(host_queued_instance(bob)) == home  # takes its only GPU

    assert placed_on(host_queued_instance(alice)) == first_by_packing


def test_it_prefers_a_host_with_the_image_to_the_workspace_host_without_it(
    alice, host_make, host_queued_instance, host_image
):
    unsurveyed_home = host_make("gpu-a-home")
    with_image = host_make("gpu-b-image")
    HostImage.objects.create(host=with_image, reference=host_image.reference, present=True, checked_at=timezone.now())
    workspace_on(alice, unsurveyed_home)

    assert placed_on(host_queued_instance(alice)) == with_image


def test_it_ignores_other_peoples_workspaces(alice, bob, host_make, host_queued_instance):
    busy = host_make("gpu-a-busy")
    bobs_home = host_make("gpu-b-bobs")
    workspace_on(bob, bobs_home)
    assert placed_on(host_queued_instance(alice)) == busy

    assert placed_on(host_queued_instance(alice)) == busy
