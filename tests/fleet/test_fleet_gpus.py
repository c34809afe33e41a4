"""Each fleet host has its own 8x MI300X (KFD tree and stand-in device nodes) and its own render gid: uid
1000 opens /dev/kfd and its render node only through that host's render group, and sees no other GPU."""

import os
import stat

import pytest

from provisioning.inventory import read_inventory
from tests.support.fleet import run_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

OPEN_DEVICES = """
import os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(path, "opened")
    except OSError as error:
        print(path, type(error).__name__)
print("dri:", ",".join(sorted(os.listdir("/dev/dri"))))
"""


@pytest.fixture(params=[0, 1], ids=["host-1", "host-2"])
def host(fleet, request):
    return fleet.hosts[request.param]


def open_devices(host, image, minor, *, group_add):
    """Starts a container on `host` as uid 1000 with /dev/kfd and renderD<minor>; returns its report."""
    node = f"/dev/dri/renderD{minor}"
    code, output = run_python(
        host,
        image,
        OPEN_DEVICES,
        "/dev/kfd",
        node,
        user="1000:1000",
        devices=[f"{host.kfd_path}:/dev/kfd:rwm", f"{host.render_node_path(minor)}:{node}:rwm"],
        group_add=group_add,
    )
    assert code == 0, output
    return output


def test_it_reads_eight_mi300x_gpus_from_each_hosts_kfd_tree(host):
    gpus = read_inventory(host.sysfs_root)

    assert [gpu.drm_render_minor for gpu in gpus] == host.render_minors
    assert host.render_minors == [128, 136, 144, 152, 160, 168, 176, 184]


def test_it_gives_each_host_device_nodes_of_its_own_non_root_render_gid(fleet):
    gids = set()
    for host in fleet.hosts:
        nodes = [host.kfd_path] + [host.render_node_path(minor) for minor in host.render_minors]
        for node in nodes:
            status = os.stat(node)
            assert stat.S_ISCHR(status.st_mode), node
            assert stat.S_IMODE(status.st_mode) == 0o660, node
            assert (status.st_uid, status.st_gid) == (0, host.render_gid), node
        gids.add(host.render_gid)

    assert 0 not in gids
    assert len(gids) == len(fleet.hosts)


def test_it_lets_uid_1000_open_kfd_and_its_render_node_through_the_hosts_render_group(host, image):
    output = open_devices(host, image, 136, group_add=[str(host.render_gid)])

    assert "/dev/kfd opened" in output
    assert "/dev/dri/renderD136 opened" in output


def test_it_refuses_uid_1000_the_devices_without_the_render_group(host, image):
    output = open_devices(host, image, 136, group_add=[])

    assert "/dev/kfd PermissionError" in output
    assert "/dev/dri/renderD136 PermissionError" in output


def test_it_refuses_uid_1000_the_devices_with_another_hosts_render_gid(fleet, image):
    first, second = fleet.hosts[:2]

    output = open_devices(first, image, 144, group_add=[str(second.render_gid)])

    assert "/dev/kfd PermissionError" in output
    assert "/dev/dri/renderD144 PermissionError" in output


def test_it_shows_the_container_no_other_gpus_render_node(host, image):
    output = open_devices(host, image, 152, group_add=[str(host.render_gid)])

    assert "dri: renderD152\n" in output
