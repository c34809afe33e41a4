"""Instance sizes. A size's GPU count is also what it burns: GPU-hours per hour."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    key: str
    name: str
    gpus: int
    hbm_gb: int
    description: str

    @property
    def gpu_hours_per_hour(self) -> int:
        return self.gpus


SIZES = {
    "1x": Size("1x", "1x MI300X", 1, 192, "One MI300X GPU with 192 GB HBM3 and a share of the host's CPU and RAM."),
    "8x": Size("8x", "8x MI300X", 8, 1536, "All eight MI300X GPUs of one host, 1.5 TB HBM3."),
}


GB = 1000**3


def workspace_limit_bytes(size_key: str) -> int:
    """Bytes a /workspace made for an instance of this size may hold (DEVCLOUD_WORKSPACE_GB); 0 = none."""
    from django.conf import settings

    return int(settings.DEVCLOUD_WORKSPACE_GB.get(size_key) or 0) * GB


def disk_limit_bytes(size_key: str) -> int:
    """Bytes an instance of this size may write outside /workspace (DEVCLOUD_CONTAINER_DISK_GB); 0 = none."""
    from django.conf import settings

    return int(settings.DEVCLOUD_CONTAINER_DISK_GB.get(size_key) or 0) * GB
