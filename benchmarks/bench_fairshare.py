"""The queue's order, FIFO against fair share, on a simulated week: 1,000 people, 100 hosts of 8 GPUs.

Simulated time, no database: every minute something happened, the queue is ordered and handed out the way
start_queued does it, with the real functions (portal.instances.queue.rank for fair share, by created_at
for FIFO; provisioning.scheduler.plan_queued for the 8x rules and the first 100 tried), and launches are
placed as the scheduler places (8x on a whole free host, 1x packed onto the fullest host with room,
whole free hosts kept from 1x behind a waiting 8x).

The people: 50 heavy users (12 launches a day each, 30 % of them 8x, 2 to 8 hours) and 950 light ones
(4 launches a day, 1x, 30 minutes to 3 hours): on average they ask for about 83 % of the fleet, in a
daily wave whose afternoon peak asks for more than it has, so a queue forms every afternoon and drains at
night. Their use counts from the start of the week; the fair-share window (7 days) covers all of it.

Prints, under each order: the longest and median wait of the launches (one still waiting at the end
counts as waiting until then; waits are counted in the simulation's one-minute steps), the 90th
percentile of all waits and of the light and heavy people's (most launches start at once, so the median
hides the queue), and Jain's fairness index of the GPU-hours served per person and of the share of what
each person asked for that was served.
"""

import heapq
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

HOSTS = 100
GPUS_PER_HOST = 8
PEOPLE = 1000
HEAVY = 50
DAYS = 7
SEED = 7
# start_queued's default limit: the launches tried per pass.
TRIED_PER_PASS = 100
START = datetime(2026, 1, 5)


@dataclass
class Launch:
    id: int
    user_id: int
    size: str
    created_at: datetime
    seconds: int
    started_at: datetime | None = None


@dataclass
class Person:
    heavy: bool
    asked: float = 0.0
    served: float = 0.0
    finished: int = 0  # GPU-seconds of ended launches
    running: list = field(default_factory=list)


def _arrivals(rng: random.Random) -> tuple[list[Launch], list[Person]]:
    people = [Person(heavy=index < HEAVY) for index in range(PEOPLE)]
    launches = []
    for user_id, person in enumerate(people):
        per_day = 12 if person.heavy else 4
        for day in range(DAYS):
            for _ in range(per_day):
                # A daily wave: arrivals peak mid-afternoon (sin-shaped density via rejection).
                while True:
                    hour = rng.uniform(0, 24)
                    if rng.random() < 0.75 + 0.25 * math.sin((hour - 9) / 24 * 2 * math.pi):
                        break
                created_at = START + timedelta(days=day, hours=hour)
                if person.heavy:
                    size = "8x" if rng.random() < 0.3 else "1x"
                    seconds = int(rng.uniform(2, 8) * 3600)
                else:
                    size, seconds = "1x", int(rng.uniform(0.5, 3) * 3600)
                launches.append(Launch(0, user_id, size, created_at, seconds))
    launches.sort(key=lambda launch: launch.created_at)
    for number, launch in enumerate(launches):
        launch.id = number
    return launches, people


def _gpus(size: str) -> int:
    return GPUS_PER_HOST if size == "8x" else 1


def _place(launch: Launch, free: list[int], reserve_whole_hosts: bool) -> int | None:
    """The host the scheduler would give `launch` now, or None."""
    gpus = _gpus(launch.size)
    if gpus == GPUS_PER_HOST:
        return next((host for host, count in enumerate(free) if count == GPUS_PER_HOST), None)
    best = None
    for host, count in enumerate(free):
        if count < gpus or (reserve_whole_hosts and count == GPUS_PER_HOST):
            continue
        if best is None or count < free[best]:
            best = host
    return best


def simulate(order: str) -> dict:
    """Runs the week with `order` ("fifo" or "fair"); returns its figures."""
    from portal.instances import queue
    from provisioning.scheduler import plan_queued

    rng = random.Random(SEED)
    launches, people = _arrivals(rng)
    end = START + timedelta(days=DAYS)
    max_wait = queue.max_wait()
    free = [GPUS_PER_HOST] * HOSTS
    events: list = []  # (when, launch id, host) of running launches' ends
    waiting: list[Launch] = []
    arriving = 0
    now = START
    while now < end:
        while arriving < len(launches) and launches[arriving].created_at <= now:
            launch = launches[arriving]
            people[launch.user_id].asked += _gpus(launch.size) * launch.seconds
            waiting.append(launch)
            arriving += 1
        while events and events[0][0] <= now:
            _, launch_id, host = heapq.heappop(events)
            launch = launches[launch_id]
            free[host] += _gpus(launch.size)
            person = people[launch.user_id]
            person.running.remove(launch)
            person.finished += _gpus(launch.size) * launch.seconds
        if waiting:
            if order == "fair":
                owners = {launch.user_id for launch in waiting}
                used = {
                    user_id: people[user_id].finished
                    + sum(
                        queue.gpu_seconds_in_window(
                            gpus=_gpus(r.size), ready_at=r.started_at, ended_at=None, since=START, now=now
                        )
                        for r in people[user_id].running
                    )
                    for user_id in owners
                }
                ranked = [
                    standing.launch
                    for standing in queue.rank(waiting, used=used, shares={}, now=now, max_wait=max_wait)
                ]
            else:
                ranked = sorted(waiting, key=lambda launch: (launch.created_at, launch.id))
            for planned in plan_queued(ranked[:TRIED_PER_PASS], now=now):
                launch = planned.instance
                host = _place(launch, free, planned.reserve_whole_hosts)
                if host is None:
                    continue
                free[host] -= _gpus(launch.size)
                launch.started_at = now
                people[launch.user_id].running.append(launch)
                heapq.heappush(events, (now + timedelta(seconds=launch.seconds), launch.id, host))
            waiting = [launch for launch in waiting if launch.started_at is None]
        # The next minute something happens.
        upcoming = [
            when
            for when in (
                launches[arriving].created_at if arriving < len(launches) else None,
                events[0][0] if events else None,
            )
            if when is not None
        ]
        if not upcoming:
            break
        now = max(
            now + timedelta(minutes=1), min(upcoming).replace(second=0, microsecond=0) + timedelta(minutes=1)
        )
    return _figures(launches, people, end)


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def _jain(values: list[float]) -> float:
    total = sum(values)
    squares = sum(value * value for value in values)
    return total * total / (len(values) * squares) if squares else 1.0


def _figures(launches: list[Launch], people: list[Person], end: datetime) -> dict:
    waits, light, heavy = [], [], []
    for launch in launches:
        started = launch.started_at or end
        wait = (started - launch.created_at).total_seconds() / 60
        waits.append(wait)
        (heavy if people[launch.user_id].heavy else light).append(wait)
        ran_until = min(started + timedelta(seconds=launch.seconds), end)
        if launch.started_at is not None:
            people[launch.user_id].served += (
                _gpus(launch.size) * max(0.0, (ran_until - started).total_seconds()) / 3600
            )
    return {
        "longest_wait_min": round(max(waits)),
        "median_wait_min": round(statistics.median(waits), 1),
        "p90_wait_min": round(_p90(waits), 1),
        "light_p90_wait_min": round(_p90(light), 1),
        "heavy_p90_wait_min": round(_p90(heavy), 1),
        "jain_served_gpu_hours": round(_jain([person.served for person in people]), 3),
        "jain_served_share_of_asked": round(
            _jain([person.served / (person.asked / 3600) for person in people if person.asked]), 3
        ),
        "still_waiting_at_end": sum(1 for launch in launches if launch.started_at is None),
    }


def main() -> dict:
    from django.conf import settings

    print(
        f"{PEOPLE} people ({HEAVY} heavy), {HOSTS} hosts x {GPUS_PER_HOST} GPUs, {DAYS} simulated days; "
        f"FAIR_SHARE_MAX_WAIT_SECONDS={settings.FAIR_SHARE_MAX_WAIT_SECONDS}, "
        f"FAIR_SHARE_WINDOW_HOURS={settings.FAIR_SHARE_WINDOW_HOURS}, "
        f"SCHEDULER_8X_MAX_WAIT_SECONDS={settings.SCHEDULER_8X_MAX_WAIT_SECONDS}"
    )
    results = {}
    for order in ("fifo", "fair"):
        started = time.perf_counter()
        figures = simulate(order)
        print(
            f"{order:>4}: longest wait {figures['longest_wait_min']} min, median {figures['median_wait_min']} min, "
            f"90th percentile {figures['p90_wait_min']} min (light people's launches "
            f"{figures['light_p90_wait_min']}, heavy people's {figures['heavy_p90_wait_min']}); "
            f"Jain's index of GPU-hours served per person {figures['jain_served_gpu_hours']}, of the share "
            f"asked for that was served {figures['jain_served_share_of_asked']}; "
            f"{figures['still_waiting_at_end']} launches still waiting at the end "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        results.update({f"{order}_{key}": value for key, value in figures.items()})
    return results


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
