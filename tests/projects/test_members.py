"""Owners change roles and remove members; the last owner stays. A removal stops the member's project
instances at once and leaves their personal ones alone. Owners stop any of the project's instances."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404

from portal.instances import services as instance_services
from portal.instances.models import Instance
from portal.projects import services
from portal.projects.models import ProjectMembership
from tests.conftest import give

from .conftest import add_member, fund

pytestmark = pytest.mark.usefixtures("cloud")


def launch(user, project=None):
    return instance_services.instance_launch(user=user, size="1x", image_key="cpu", project=project)


def test_it_stops_the_removed_members_project_instances_and_not_their_own(vllm, alice, bob, cpu):
    fund(vllm, 10)
    give(bob, 10)
    pooled, alices, personal = launch(bob, vllm), launch(alice, vllm), launch(bob)

    stopped = services.member_remove(user=alice, project=vllm, member_id=bob.pk)

    assert stopped == [str(pooled.id)]
    pooled.refresh_from_db(), alices.refresh_from_db(), personal.refresh_from_db()
    assert (pooled.state, pooled.stop_reason) == ("stopped", "removed_from_project")
    assert alices.state == personal.state == "queued"
    assert not ProjectMembership.objects.filter(project=vllm, user=bob).exists()


def test_it_refuses_a_launch_for_the_project_once_the_member_is_removed(vllm, alice, bob, cpu):
    fund(vllm, 10)
    services.member_remove(user=alice, project=vllm, member_id=bob.pk)
    with pytest.raises(Http404):
        launch(bob, "vllm")


def test_it_lets_a_member_leave_but_not_remove_someone_else(vllm, alice, bob, dave):
    add_member(vllm, dave)
    with pytest.raises(PermissionDenied):
        services.member_remove(user=bob, project=vllm, member_id=dave.pk)
    services.member_remove(user=bob, project=vllm, member_id=bob.pk)
    assert set(vllm.memberships.values_list("user__email", flat=True)) == {alice.email, dave.email}


def test_it_refuses_to_remove_or_demote_the_last_owner(vllm, alice):
    with pytest.raises(ValidationError, match="last owner"):
        services.member_remove(user=alice, project=vllm, member_id=alice.pk)
    with pytest.raises(ValidationError, match="needs an owner"):
        services.member_role_change(user=alice, project=vllm, member_id=alice.pk, role="member")
    assert vllm.memberships.get(user=alice).role == "owner"


def test_it_lets_an_owner_step_down_once_there_is_another(vllm, alice, bob):
    services.member_role_change(user=alice, project=vllm, member_id=bob.pk, role="owner")
    services.member_role_change(user=alice, project=vllm, member_id=alice.pk, role="member")
    assert dict(vllm.memberships.values_list("user__email", "role")) == {
        alice.email: "member",
        bob.email: "owner",
    }


def test_it_lets_only_owners_change_roles_and_answers_strangers_404(vllm, bob, dave):
    with pytest.raises(PermissionDenied):
        services.member_role_change(user=bob, project=vllm, member_id=bob.pk, role="owner")
    with pytest.raises(Http404):
        services.member_role_change(user=dave, project=vllm, member_id=bob.pk, role="member")


def test_it_lets_only_owners_change_the_limits(vllm, alice, bob, dave):
    limits = {
        "max_live_instances": 5,
        "max_run_seconds": 3600,
        "allowed_sizes": ["1x"],
        "member_monthly_cap_gpu_seconds": 0,
    }
    with pytest.raises(PermissionDenied):
        services.project_limits_update(user=bob, project=vllm, **limits)
    with pytest.raises(Http404):
        services.project_limits_update(user=dave, project=vllm, **limits)
    assert services.project_limits_update(user=alice, project=vllm, **limits).max_live_instances == 5


def test_it_refuses_8x_in_the_limits_until_the_operators_entitle_the_project(vllm, alice):
    limits = {"max_live_instances": 2, "max_run_seconds": 3600, "member_monthly_cap_gpu_seconds": 0}
    with pytest.raises(ValidationError, match="operators' approval"):
        services.project_limits_update(user=alice, project=vllm, allowed_sizes=["1x", "8x"], **limits)
    vllm.entitled_8x = True
    vllm.save()
    assert services.project_limits_update(
        user=alice, project=vllm, allowed_sizes=["8x", "1x"], **limits
    ).allowed_sizes == [
        "1x",
        "8x",
    ]


def test_it_lets_an_owner_stop_a_members_project_instance(vllm, alice, bob, cpu):
    fund(vllm, 10)
    instance = launch(bob, vllm)

    stopped = services.project_instance_stop(user=alice, project=vllm, instance_id=instance.id)

    assert (stopped.state, stopped.stop_reason) == ("stopped", "project_owner")


def test_it_does_not_let_a_member_stop_another_members_instance(vllm, alice, bob, cpu):
    fund(vllm, 10)
    instance = launch(alice, vllm)
    with pytest.raises(Http404):
        services.project_instance_stop(user=bob, project=vllm, instance_id=instance.id)
    with pytest.raises(Http404):
        instance_services.instance_stop(user=bob, instance_id=instance.id)
    assert Instance.objects.get(pk=instance.pk).state == "queued"


def test_it_does_not_let_an_owner_stop_a_members_personal_instance(vllm, alice, bob, cpu):
    give(bob, 10)
    personal = launch(bob)
    with pytest.raises(Http404):
        instance_services.instance_stop(user=alice, instance_id=personal.id)


def test_it_does_not_let_the_owner_of_one_project_stop_anothers_instance(vllm, triton, bob, dave, cpu):
    fund(vllm, 10)
    instance = launch(bob, vllm)
    with pytest.raises(Http404):
        services.project_instance_stop(user=dave, project=triton, instance_id=instance.id)
    with pytest.raises(Http404):
        instance_services.instance_stop(user=dave, instance_id=instance.id)
