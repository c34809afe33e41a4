"""Run every benchmarks/bench_*.py (or only those named: `python -m benchmarks scheduler`) and print results.

Exits non-zero if any bench raised, after running the others. Before each bench the runner waits, up to
SETTLE_SECONDS, for the CPUs to be mostly idle: a bench's own leftovers (engines in network namespaces
shutting down, containers being removed, PostgreSQL writing a dropped database out) would otherwise land
in the next bench's figures. How idle they were when it began is printed with its name.
"""

import importlib
import pkgutil
import sys
import time
import traceback
from pathlib import Path

from benchmarks import setup_django

# The share of CPU time idle over one second that counts as a quiet machine, and the longest wait for it.
SETTLE_IDLE = 0.85
SETTLE_SECONDS = 60


def _cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies over all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return idle, sum(fields)


def settle() -> tuple[float, float]:
    """Waits until a second passes with at least SETTLE_IDLE of the CPUs idle, or SETTLE_SECONDS have
    gone by; returns (the last second's idle share, seconds waited)."""
    started = time.monotonic()
    while True:
        idle_before, total_before = _cpu_times()
        time.sleep(1)
        idle_after, total_after = _cpu_times()
        idle = (idle_after - idle_before) / max(1, total_after - total_before)
        waited = time.monotonic() - started
        if idle >= SETTLE_IDLE or waited >= SETTLE_SECONDS:
            return idle, waited


def bench_names() -> list[str]:
    here = Path(__file__).resolve().parent
    return sorted(info.name for info in pkgutil.iter_modules([str(here)]) if info.name.startswith("bench_"))


def main(argv: list[str]) -> int:
    setup_django()
    wanted = {f"bench_{name.removeprefix('bench_')}" for name in argv}
    names = [name for name in bench_names() if not wanted or name in wanted]
    if wanted - set(names):
        unknown = ", ".join(sorted(wanted - set(names)))
        print(f"Unknown benchmark(s): {unknown}; have {', '.join(bench_names())}")
        return 2
    results, failed = {}, []
    for name in names:
        idle, waited = settle()
        quiet = "" if idle >= SETTLE_IDLE else f", still busy after {waited:.0f} s"
        print(f"== {name} (CPUs {idle:.0%} idle at the start{quiet})", flush=True)
        started = time.perf_counter()
        try:
            results[name] = importlib.import_module(f"benchmarks.{name}").main() or {}
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"   ({time.perf_counter() - started:.1f} s)", flush=True)
    print("== summary")
    for name, figures in results.items():
        for key, value in figures.items():
            print(f"{name}.{key}: {value}")
    for name in failed:
        print(f"{name}: FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
