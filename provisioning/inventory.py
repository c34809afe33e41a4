"""GPU discovery from the amdgpu driver's KFD topology in sysfs.

The kernel describes every HSA node (CPU or GPU) under
`/sys/class/kfd/kfd/topology/nodes/<N>/`: a `properties` file of "name value" lines, a `gpu_id` file,
and one `mem_banks/<M>/properties` per memory heap. A node is a GPU when it has SIMDs. Its render node is
`/dev/dri/renderD<drm_render_minor>`; on MI300X hosts the minors go 128, 136, 144, ... so they are read,
never computed from the node's position.
"""

from dataclasses import dataclass
from pathlib import Path

TOPOLOGY_NODES = Path("sys/class/kfd/kfd/topology/nodes")
# KFD heap types that are the GPU's own memory (HSA_MEM_HEAP_TYPE_FB_PUBLIC / FB_PRIVATE).
VRAM_HEAP_TYPES = {1, 2}


class InventoryError(Exception):
    """The KFD topology is missing or cannot be read. The message names the path at fault."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU node of the KFD topology."""

    node_id: int
    gpu_id: int
    drm_render_minor: int
    location_id: int
    unique_id: str
    vram: int
    simd_count: int
    gfx_target_version: int
    device_id: int

    @property
    def render_node(self) -> str:
        """Path of the GPU's render node relative to the host's dev root, e.g. "dev/dri/renderD136"."""
        return f"dev/dri/renderD{self.drm_render_minor}"

    @property
    def pci_address(self) -> str:
        """location_id as a PCI address, e.g. 1280 -> "05:00.0"."""
        bus, devfn = self.location_id >> 8, self.location_id & 0xFF
        return f"{bus:02x}:{devfn >> 3:02x}.{devfn & 0x7}"


def parse_properties(path: Path) -> dict[str, int]:
    """Read a KFD "name value" properties file. Returns name -> int.

    Raises InventoryError naming `path` when it cannot be read or a line is not "name <integer>".
    """
    try:
        text = path.read_text()
    except OSError as error:
        raise InventoryError(f"Cannot read {path}: {error.strerror or error}") from error
    properties = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InventoryError(f"Malformed KFD properties file {path}, line {number}: {line!r}")
        name, value = parts
        try:
            properties[name] = int(value)
        except ValueError:
            raise InventoryError(
                f"Malformed KFD properties file {path}, line {number}: {name} is not an integer ({value!r})"
            ) from None
    return properties


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except OSError as error:
        raise InventoryError(f"Cannot read {path}: {error.strerror or error}") from error
    except ValueError:
        raise InventoryError(f"Malformed {path}: expected an integer") from None


def _vram_bytes(node_dir: Path) -> int:
    banks = node_dir / "mem_banks"
    if not banks.is_dir():
        return 0
    total = 0
    for bank in sorted(banks.iterdir()):
        properties_path = bank / "properties"
        if not properties_path.is_file():
            continue
        bank_properties = parse_properties(properties_path)
        if bank_properties.get("heap_type") in VRAM_HEAP_TYPES:
            total += bank_properties.get("size_in_bytes", 0)
    return total


def _require(properties: dict[str, int], name: str, path: Path) -> int:
    if name not in properties:
        raise InventoryError(f"KFD properties file {path} has no {name} line")
    return properties[name]


def read_inventory(sysfs_root: str | Path) -> list[GpuInfo]:
    """List the GPUs of the host whose sysfs is mounted at `sysfs_root` ("/" on the host itself).

    Returns the GPU nodes (simd_count > 0), sorted by node id; CPU nodes are skipped. A host with a KFD
    topology but no GPU returns []. Raises InventoryError, naming the path, when the root has no KFD
    topology (amdgpu not loaded, or the wrong root) or a file in it is missing or malformed.
    """
    nodes_dir = Path(sysfs_root) / TOPOLOGY_NODES
    if not nodes_dir.is_dir():
        raise InventoryError(
            f"No KFD topology at {nodes_dir}: is the amdgpu driver loaded, and is the sysfs root right?"
        )
    node_dirs = []
    for entry in nodes_dir.iterdir():
        if entry.is_dir() and entry.name.isdigit():
            node_dirs.append((int(entry.name), entry))
    if not node_dirs:
        raise InventoryError(f"KFD topology at {nodes_dir} lists no nodes")

    gpus = []
    for node_id, node_dir in sorted(node_dirs):
        properties_path = node_dir / "properties"
        properties = parse_properties(properties_path)
        if properties.get("simd_count", 0) <= 0:
            continue
        gpus.append(
            GpuInfo(
                node_id=node_id,
                gpu_id=_read_int(node_dir / "gpu_id"),
                drm_render_minor=_require(properties, "drm_render_minor", properties_path),
                location_id=properties.get("location_id", 0),
                # Kept as text: it is a 64-bit serial, and the database column is a string.
                unique_id=str(properties.get("unique_id", "")),
                vram=_vram_bytes(node_dir),
                simd_count=properties["simd_count"],
                gfx_target_version=properties.get("gfx_target_version", 0),
                device_id=properties.get("device_id", 0),
            )
        )
    minors = [gpu.drm_render_minor for gpu in gpus]
    if len(set(minors)) != len(minors):
        raise InventoryError(
            f"KFD topology at {nodes_dir} gives two GPUs the same drm_render_minor: {minors}"
        )
    return gpus
