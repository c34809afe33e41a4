"""GPU isolation as a launch delivers it: the scheduler's allocation, the driver's device list and what the
container sees all agree. (tests/provisioning/test_driver_docker_isolation.py covers the driver given GPUs
by hand, with docker inspect of every hardening setting; this is the path a launch takes.)"""

import pytest

from portal.accounts.models import User
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from tests.conftest import give
from tests.support.docker_instances import exec_in

from .helpers import containers_of, live_minors, register_host

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120, func_only=True)]


def visible_render_nodes(instance) -> list[str]:
    code, listing = exec_in(containers_of(instance.id)[0].name, "ls", "/dev/dri")
    assert code == 0, listing
    return sorted(listing.split())


def test_it_gives_launched_containers_exactly_the_render_nodes_the_scheduler_allocated(
    alice, bob, e2e_portal, e2e_dev_root, e2e_images
):
    first = register_host("gpu-e2e-a", e2e_dev_root.path)
    second = register_host("gpu-e2e-b", e2e_dev_root.path)
    give(alice, 25)
    give(bob, 25)
    # An operator opened 8x to Alice (8x otherwise waits for an approved bonus application).
    User.objects.filter(pk=alice.pk).update(extra_sizes=["8x"])
    alice.refresh_from_db()
    alices = services.instance_launch(user=alice, size="1x", image_key="cpu")
    bobs = services.instance_launch(user=bob, size="1x", image_key="cpu")
    alices_8x = services.instance_launch(user=alice, size="8x", image_key="cpu")

    for instance in (alices, bobs, alices_8x):
        assert lifecycle.instance_provision(instance_id=instance.id) == "running"
        instance.refresh_from_db()

    # The two 1x pack onto one host (on different GPUs); the 8x takes the host left whole.
    assert alices.host_id == bobs.host_id
    assert {alices.host_id, alices_8x.host_id} == {first.id, second.id}
    assert live_minors(alices.id) != live_minors(bobs.id)
    for instance in (alices, bobs, alices_8x):
        minors = live_minors(instance.id)
        assert len(minors) == {"1x": 1, "8x": 8}[instance.size]
        assert visible_render_nodes(instance) == sorted(f"renderD{minor}" for minor in minors)
        assert containers_of(instance.id)[0].labels["devcloud.gpus"] == ",".join(map(str, minors))
        assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
