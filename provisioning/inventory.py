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


class LocalTree:
    """Files under a root on this machine's filesystem, as read_inventory sees them."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def describe(self, relative: str) -> str:
        return str(self.root / relative)

    def text(self, relative: str) -> str:
        """The file's text. Raises OSError when it cannot be read."""
        return (self.root / relative).read_text()

    def is_file(self, relative: str) -> bool:
        return (self.root / relative).is_file()

    def is_dir(self, relative: str) -> bool:
        return (self.root / relative).is_dir()

    def children(self, relative: str) -> list[str]:
        """Names of the directories directly under `relative`."""
        return [entry.name for entry in (self.root / relative).iterdir() if entry.is_dir()]


class SnapshotTree:
    """Files copied out of a host (by provisioning.hostfs), as read_inventory sees them.

    `files` maps paths relative to the host's sysfs root ("sys/class/kfd/...") to their text; `label`
    says where they came from ("gpu-02:/"), so errors name the file on the right machine.
    """

    def __init__(self, files: dict[str, str], label: str):
        self.files = files
        self.label = label
        self.dirs = set()
        for path in files:
            parts = path.split("/")
            for end in range(1, len(parts)):
                self.dirs.add("/".join(parts[:end]))

    def describe(self, relative: str) -> str:
        return f"{self.label.rstrip('/')}/{relative}"

    def text(self, relative: str) -> str:
        try:
            return self.files[relative]
        except KeyError:
            raise FileNotFoundError(2, "No such file or directory") from None

    def is_file(self, relative: str) -> bool:
        return relative in self.files

    def is_dir(self, relative: str) -> bool:
        return relative in self.dirs

    def children(self, relative: str) -> list[str]:
        prefix = relative.rstrip("/") + "/"
        return sorted({path[len(prefix):].split("/")[0] for path in self.dirs if path.startswith(prefix)})


def parse_properties(path, text: str | None = None) -> dict[str, int]:
    """Read a KFD "name value" properties file (or parse `text`, the file's content). Returns name -> int.

    Raises InventoryError naming `path` when it cannot be read or a line is not "name <integer>".
    """
    if text is None:
        try:
            text = Path(path).read_text()
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


def _text(tree, relative: str) -> str:
    try:
        return tree.text(relative)
    except OSError as error:
        raise InventoryError(f"Cannot read {tree.describe(relative)}: {error.strerror or error}") from error


def _properties(tree, relative: str) -> dict[str, int]:
    return parse_properties(tree.describe(relative), _text(tree, relative))


def _read_int(tree, relative: str) -> int:
    text = _text(tree, relative)
    try:
        return int(text.strip())
    except ValueError:
        raise InventoryError(f"Malformed {tree.describe(relative)}: expected an integer") from None


def _vram_bytes(tree, node_dir: str) -> int:
    banks = f"{node_dir}/mem_banks"
    if not tree.is_dir(banks):
        return 0
    total = 0
    for bank in sorted(tree.children(banks)):
        properties_path = f"{banks}/{bank}/properties"
        if not tree.is_file(properties_path):
            continue
        bank_properties = _properties(tree, properties_path)
        if bank_properties.get("heap_type") in VRAM_HEAP_TYPES:
            total += bank_properties.get("size_in_bytes", 0)
    return total


def _require(properties: dict[str, int], name: str, path: str) -> int:
    if name not in properties:
        raise InventoryError(f"KFD properties file {path} has no {name} line")
    return properties[name]


def read_inventory(sysfs_root: str | Path) -> list[GpuInfo]:
    """List the GPUs of the host whose sysfs is at `sysfs_root` on this machine ("/" on the host itself).

    See inventory_from for what it returns and raises.
    """
    return inventory_from(LocalTree(sysfs_root))


def inventory_from(tree) -> list[GpuInfo]:
    """List the GPUs of a sysfs tree (a LocalTree, or a SnapshotTree copied out of a remote host).

    Returns the GPU nodes (simd_count > 0), sorted by node id; CPU nodes are skipped. A host with a KFD
    topology but no GPU returns []. Raises InventoryError, naming the path, when the root has no KFD
    topology (amdgpu not loaded, or the wrong root) or a file in it is missing or malformed.
    """
    nodes_dir = str(TOPOLOGY_NODES)
    if not tree.is_dir(nodes_dir):
        raise InventoryError(
            f"No KFD topology at {tree.describe(nodes_dir)}: is the amdgpu driver loaded, and is the sysfs "
            "root right?"
        )
    node_dirs = sorted(
        (int(name), f"{nodes_dir}/{name}") for name in tree.children(nodes_dir) if name.isdigit()
    )
    if not node_dirs:
        raise InventoryError(f"KFD topology at {tree.describe(nodes_dir)} lists no nodes")

    gpus = []
    for node_id, node_dir in node_dirs:
        properties_path = f"{node_dir}/properties"
        properties = _properties(tree, properties_path)
        if properties.get("simd_count", 0) <= 0:
            continue
        gpus.append(
            GpuInfo(
                node_id=node_id,
                gpu_id=_read_int(tree, f"{node_dir}/gpu_id"),
                drm_render_minor=_require(properties, "drm_render_minor", tree.describe(properties_path)),
                location_id=properties.get("location_id", 0),
                # Kept as text: it is a 64-bit serial, and the database column is a string.
                unique_id=str(properties.get("unique_id", "")),
                vram=_vram_bytes(tree, node_dir),
                simd_count=properties["simd_count"],
                gfx_target_version=properties.get("gfx_target_version", 0),
                device_id=properties.get("device_id", 0),
            )
        )
    minors = [gpu.drm_render_minor for gpu in gpus]
    if len(set(minors)) != len(minors):
        raise InventoryError(
            f"KFD topology at {tree.describe(nodes_dir)} gives two GPUs the same drm_render_minor: {minors}"
        )
    return gpus
