"""Reading GPUs from KFD sysfs: the fixture trees are copies of real MI300X hosts (tests/fixtures/kfd)."""

import os
import shutil
import stat

import pytest

from provisioning.inventory import InventoryError, read_inventory
from tests.conftest import MI300X_RENDER_MINORS

NODES = "sys/class/kfd/kfd/topology/nodes"


@pytest.fixture
def editable_2socket(tmp_path, kfd_sysfs_2socket):
    root = tmp_path / "sysfs"
    shutil.copytree(kfd_sysfs_2socket, root)
    return root


def test_it_lists_the_eight_gpus_of_an_mi300x_host_with_their_non_consecutive_minors(kfd_sysfs_8gpu):
    gpus = read_inventory(kfd_sysfs_8gpu)

    assert [gpu.node_id for gpu in gpus] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [gpu.drm_render_minor for gpu in gpus] == MI300X_RENDER_MINORS
    assert {gpu.gfx_target_version for gpu in gpus} == {90402}
    assert {gpu.simd_count for gpu in gpus} == {1216}
    assert {gpu.device_id for gpu in gpus} == {0x74A1}


def test_it_skips_both_cpu_nodes_of_a_two_socket_host(kfd_sysfs_2socket):
    gpus = read_inventory(kfd_sysfs_2socket)

    assert [gpu.node_id for gpu in gpus] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert [gpu.drm_render_minor for gpu in gpus] == MI300X_RENDER_MINORS


def test_it_reads_each_gpus_identity_from_its_own_node(kfd_sysfs_2socket):
    first, *_, last = read_inventory(kfd_sysfs_2socket)

    assert (first.gpu_id, first.location_id, first.pci_address) == (28851, 0x0500, "05:00.0")
    assert (last.gpu_id, last.location_id, last.pci_address) == (63738, 0xE500, "e5:00.0")
    assert first.unique_id == "4376936076086227261"
    assert first.unique_id != last.unique_id
    assert last.render_node == "dev/dri/renderD184"


def test_it_reads_vram_from_the_frame_buffer_memory_bank(kfd_sysfs_8gpu):
    gpus = read_inventory(kfd_sysfs_8gpu)

    assert {gpu.vram for gpu in gpus} == {206141652992}


def test_it_counts_no_vram_for_a_gpu_without_memory_banks(editable_2socket):
    shutil.rmtree(editable_2socket / NODES / "4" / "mem_banks")

    gpus = {gpu.node_id: gpu for gpu in read_inventory(editable_2socket)}

    assert gpus[4].vram == 0
    assert gpus[5].vram == 206141652992


def test_it_orders_nodes_by_number_not_by_name(editable_2socket):
    # "10" sorts before "2" as text; node ids are numbers.
    os.rename(editable_2socket / NODES / "9", editable_2socket / NODES / "10")

    gpus = read_inventory(editable_2socket)

    assert [gpu.node_id for gpu in gpus] == [2, 3, 4, 5, 6, 7, 8, 10]
    assert gpus[-1].drm_render_minor == 184


def test_it_says_where_it_looked_when_there_is_no_kfd_topology(tmp_path):
    with pytest.raises(InventoryError) as error:
        read_inventory(tmp_path)

    assert str(tmp_path / NODES) in str(error.value)
    assert "No KFD topology" in str(error.value)


def test_it_names_the_malformed_properties_file(editable_2socket):
    properties = editable_2socket / NODES / "3" / "properties"
    text = properties.read_text()
    properties.write_text(text.replace("drm_render_minor 136", "drm_render_minor one-three-six"))

    with pytest.raises(InventoryError) as error:
        read_inventory(editable_2socket)

    assert str(properties) in str(error.value)
    assert "drm_render_minor" in str(error.value)


def test_it_names_a_properties_line_that_is_not_name_and_value(editable_2socket):
    properties = editable_2socket / NODES / "0" / "properties"
    properties.write_text(properties.read_text() + "garbage\n")

    with pytest.raises(InventoryError, match=str(properties)):
        read_inventory(editable_2socket)


def test_it_names_a_gpu_node_that_has_no_render_minor(editable_2socket):
    properties = editable_2socket / NODES / "5" / "properties"
    lines = [line for line in properties.read_text().splitlines() if not line.startswith("drm_render_minor")]
    properties.write_text("\n".join(lines) + "\n")

    with pytest.raises(InventoryError, match=f"{properties} has no drm_render_minor"):
        read_inventory(editable_2socket)


def test_it_names_a_missing_gpu_id_file(editable_2socket):
    (editable_2socket / NODES / "6" / "gpu_id").unlink()

    with pytest.raises(InventoryError, match=str(editable_2socket / NODES / "6" / "gpu_id")):
        read_inventory(editable_2socket)


def test_it_refuses_two_gpus_with_the_same_render_minor(editable_2socket):
    properties = editable_2socket / NODES / "3" / "properties"
    properties.write_text(properties.read_text().replace("drm_render_minor 136", "drm_render_minor 128"))

    with pytest.raises(InventoryError, match="same drm_render_minor"):
        read_inventory(editable_2socket)


def test_it_finds_no_gpus_on_a_cpu_only_host(editable_2socket):
    for node in range(2, 10):
        shutil.rmtree(editable_2socket / NODES / str(node))

    assert read_inventory(editable_2socket) == []


def test_it_makes_a_dev_tree_of_openable_character_devices_for_each_render_minor(kfd_dev_root):
    assert kfd_dev_root.render_minors == MI300X_RENDER_MINORS
    for node in [kfd_dev_root.kfd] + [kfd_dev_root.render_node(minor) for minor in MI300X_RENDER_MINORS]:
        info = node.stat()
        assert stat.S_ISCHR(info.st_mode), node
        assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (1, 3)
        assert info.st_gid == kfd_dev_root.gid
        assert stat.S_IMODE(info.st_mode) == 0o660
        with open(node, "rb") as handle:
            assert handle.read(1) == b""
    assert not kfd_dev_root.render_node(129).exists()
