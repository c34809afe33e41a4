"""Scheduler placement time with 1,000 simulated hosts (8,000 GPUs), in a scratch PostgreSQL database.

Phases, each timing one allocate() call per launch:
1. 500 1x launches onto an empty fleet (they pack onto the fullest hosts: 63 hosts end up used);
2. 50 8x launches (each takes a whole free host);
3. 20 8x launches refused on a fleet where every host is partly used (the "queue it" answer).
"""

import time

from benchmarks import scratch_database, summarize_ms

DATABASE = "devcloud_bench_sched"
HOSTS = 1000
GPUS_PER_HOST = 8
ONE_X_LAUNCHES = 500
EIGHT_X_LAUNCHES = 50
REFUSED_8X = 20


def _build_fleet():
    from django.db import connection

    from portal.accounts.models import User
    from portal.instances.models import Image
    from provisioning.models import Gpu, GpuHost

    user = User.objects.create_user("bench@example.com")
    image = Image.objects.create(
        key="bench", name="Bench", sizes=["1x", "8x"], reference="devcloud/cpu:bench"
    )
    hosts = GpuHost.objects.bulk_create([GpuHost(name=f"gpu-{number:04d}") for number in range(HOSTS)])
    Gpu.objects.bulk_create(
        [
            Gpu(host=host, node_id=index + 1, gpu_id=index, render_minor=128 + 8 * index)
            for host in hosts
            for index in range(GPUS_PER_HOST)
        ],
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return user, image


def _launches(user, image, size, count):
    from portal.instances.models import Instance

    return Instance.objects.bulk_create(
        [Instance(user=user, image=image, size=size, state=Instance.State.QUEUED) for _ in range(count)]
    )


def _time_placements(instances) -> tuple[list[float], int]:
    from provisioning.scheduler import allocate

    samples, placed = [], 0
    for instance in instances:
        started = time.perf_counter()
        allocations = allocate(instance_id=instance.pk)
        samples.append(time.perf_counter() - started)
        placed += bool(allocations)
    return samples, placed


def _occupy_one_gpu_on_every_free_host(user, image):
    """Make every still-free host partly used, so no 8x fits anywhere."""
    from django.db.models import Exists, OuterRef

    from provisioning.models import Gpu, GpuAllocation, GpuHost

    live = GpuAllocation.objects.filter(gpu__host=OuterRef("pk"), released_at__isnull=True)
    free_hosts = list(GpuHost.objects.filter(~Exists(live)).values_list("pk", flat=True))
    holders = _launches(user, image, "1x", len(free_hosts))
    first_gpus = dict(Gpu.objects.filter(host_id__in=free_hosts, node_id=1).values_list("host_id", "pk"))
    GpuAllocation.objects.bulk_create(
        [
            GpuAllocation(gpu_id=first_gpus[host_id], instance=holder)
            for host_id, holder in zip(free_hosts, holders)
        ],
        batch_size=2000,
    )


def _report(label, samples, placed, expected):
    figures = summarize_ms(samples)
    print(
        f"{label:<34} n={figures['n']:<4} placed={placed:<4} median={figures['median_ms']:.2f} ms  "
        f"p95={figures['p95_ms']:.2f} ms  max={figures['max_ms']:.2f} ms"
    )
    if placed != expected:
        raise AssertionError(f"{label}: expected {expected} placements, got {placed}")
    return figures


def main() -> dict:
    with scratch_database(DATABASE):
        started = time.perf_counter()
        user, image = _build_fleet()
        print(f"fleet: {HOSTS} hosts x {GPUS_PER_HOST} GPUs built in {time.perf_counter() - started:.1f} s")

        ones = _launches(user, image, "1x", ONE_X_LAUNCHES)
        one_x = _report("1x placement (packing)", *_time_placements(ones), ONE_X_LAUNCHES)

        eights = _launches(user, image, "8x", EIGHT_X_LAUNCHES)
        eight_x = _report("8x placement (whole free host)", *_time_placements(eights), EIGHT_X_LAUNCHES)

        _occupy_one_gpu_on_every_free_host(user, image)
        refused = _launches(user, image, "8x", REFUSED_8X)
        no_room = _report("8x refused (no whole host free)", *_time_placements(refused), 0)

    return {
        "placement_1x_median_ms": one_x["median_ms"],
        "placement_1x_p95_ms": one_x["p95_ms"],
        "placement_1x_max_ms": one_x["max_ms"],
        "placement_8x_median_ms": eight_x["median_ms"],
        "placement_8x_p95_ms": eight_x["p95_ms"],
        "placement_8x_max_ms": eight_x["max_ms"],
        "refusal_8x_median_ms": no_room["median_ms"],
    }


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
