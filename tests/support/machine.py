"""What the test fleet (tests/support/fleet.py) and the test Slurm cluster (tests/support/slurm.py) both
ask of this machine: whether a process lives, which network namespaces exist, and a slot of their own
among the test sessions that run on it at once."""

import fcntl
import os
import subprocess
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie (a child of ours not reaped yet) is as good as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def netns_names() -> list[str]:
    """The network namespaces `ip netns` knows."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def take_slot(root: Path, slots: int, wanted: int | None, *, what: str, unavailable: type[Exception]):
    """Locks one of `slots` slots under `root` for the life of this process (or until the returned
    descriptor is closed): the first free one, or `wanted`. Returns (slot, descriptor). Raises
    `unavailable` when none is free; `what` names the slots in its message ("fleet slots")."""
    root.mkdir(parents=True, exist_ok=True)
    for slot in range(slots) if wanted is None else [wanted]:
        fd = os.open(root / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    taken = f"slot {wanted} is" if wanted is not None else f"all {slots} {what} are"
    raise unavailable(f"{taken} in use by other test sessions on this machine")
