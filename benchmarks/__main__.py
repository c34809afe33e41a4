"""Run every benchmarks/bench_*.py (or only those named: `python -m benchmarks scheduler`) and print results.

Exits non-zero if any bench raised, after running the others.
"""

import importlib
import pkgutil
import sys
import time
import traceback
from pathlib import Path

from benchmarks import setup_django


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
        print(f"== {name}", flush=True)
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
