"""Start slots: how many instances one Docker engine brings up at once, and who goes next.

A JupyterLab start is mostly CPU: Python imports, extension discovery, the server's first pages. When a
class clicks Launch together on an engine with few cores, thirty start-ups share those cores evenly and
all of them finish late, about when the last one would have finished anyway. Letting at most
`slots_for(cpus)` instances start at once on an engine, and the rest wait their turn in the order they
arrived, gets the first ones ready within seconds and makes none later: the cores do the same work
either way, in a better order. On a GPU host with a hundred cores the limit is never reached.

A launch's network, workspace and container are made before its turn (Driver.start's `turn`), so that
when a slot frees only the start itself is left; the slot is held from the container's start until
JupyterLab answers, fails or the launch is stopped. The slots live in Redis (the broker every worker already talks to), so every provisioning worker
on every machine shares one count per engine:

- `devcloud:start-slots:<portal>:<engine>:holders`, a sorted set of instance ids scored by when their
  hold lapses (the readiness wait's own deadline and a margin): a worker killed while it holds a slot
  gives it back when the lease runs out;
- `...:waiters`, a sorted set of instance ids scored by when they first asked, and a short-lived
  `...:waiter:<id>` key each waiter renews while it waits: a waiter that vanished (its worker was killed)
  drops out of the line instead of blocking everyone behind it.

One Lua script takes a slot or says how many are ahead, atomically. Redis being unreachable never stops a
launch: the start goes ahead unlimited and the log says so.
"""

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

# How often a waiting launch asks again. A freed slot is taken within this.
POLL_SECONDS = 0.2
# A waiter is told how many launches are still ahead of it at most this often.
TELL_EVERY_SECONDS = 5.0
# A waiter that has not asked for this long is taken for gone (its worker died).
WAITER_TTL_SECONDS = 10
# A hold outlives the readiness wait's deadline by this much before it lapses on its own.
LEASE_MARGIN_SECONDS = 60

# Returns 0 when `member` holds a slot (now or already), else how many must get one before it does.
_TAKE = """
local holders, waiters = KEYS[1], KEYS[2]
local now, limit, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local lease_until, prefix, waiter_ttl, key_ttl = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
if redis.call('ZSCORE', holders, member) then
  return 0
end
if not redis.call('ZSCORE', waiters, member) then
  redis.call('ZADD', waiters, now, member)
end
redis.call('SET', prefix .. member, '1', 'EX', waiter_ttl)
local ahead = 0
for _, other in ipairs(redis.call('ZRANGE', waiters, 0, -1)) do
  if other == member then
    break
  end
  if redis.call('EXISTS', prefix .. other) == 1 then
    ahead = ahead + 1
  else
    redis.call('ZREM', waiters, other)
  end
end
local free = limit - redis.call('ZCARD', holders)
if ahead < free then
  redis.call('ZREM', waiters, member)
  redis.call('DEL', prefix .. member)
  redis.call('ZADD', holders, lease_until, member)
  redis.call('EXPIRE', holders, key_ttl)
  redis.call('EXPIRE', waiters, key_ttl)
  return 0
end
redis.call('EXPIRE', waiters, key_ttl)
return ahead - free + 1
"""

_GIVE_BACK = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[2] .. ARGV[1])
return 0
"""


def slots_for(cpus: int) -> int:
    """How many instances an engine with `cpus` CPUs starts at once; 0 means no limit.

    LAUNCH_STARTS_PER_CPU (default 2) per CPU, at least one. A start waits on the disk and the engine part
    of the time, so two per core keep the cores busy. Measured on a 2-core engine against plain `docker
    run`s all started at once, in the same run (benchmarks/bench_launch.py, medians of four rounds): with
    4 slots, a burst of ten had its median launch ready in 0.84 times plain's and its last in 0.98 times;
    a burst of thirty, median 0.65 times, last 1.06 times. With 8 slots the medians were 1.09 and 0.71
    times and the lasts 1.31 and 1.09 times: the launches that wait start when the others are nearly
    done, which costs most in a burst just over the limit.
    """
    per_cpu = settings.LAUNCH_STARTS_PER_CPU
    if per_cpu <= 0:
        return 0
    return max(1, round(cpus * per_cpu))


@dataclass(frozen=True)
class Line:
    """The start line of one engine, for the given portal."""

    engine: str
    limit: int

    @property
    def prefix(self) -> str:
        from .identity import install_id

        return f"devcloud:start-slots:{install_id()}:{self.engine}"

    @property
    def keys(self) -> list[str]:
        return [f"{self.prefix}:holders", f"{self.prefix}:waiters"]


class Cancelled(Exception):
    """The launch stopped being wanted while it waited for a start slot."""


_clients: dict[str, redis.Redis] = {}


def _redis() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    return _clients[url]


def _lease_seconds() -> int:
    return settings.READY_TIMEOUT_SECONDS + LEASE_MARGIN_SECONDS


def take(line: Line, member: str) -> int:
    """One try: 0 when `member` now holds a slot of `line`, else how many launches are ahead of it."""
    now = time.time()
    lease = _lease_seconds()
    return int(
        _redis().eval(
            _TAKE,
            2,
            *line.keys,
            now,
            line.limit,
            member,
            now + lease,
            f"{line.prefix}:waiter:",
            WAITER_TTL_SECONDS,
            lease + WAITER_TTL_SECONDS,
        )
    )


def give_back(line: Line, member: str) -> None:
    """Frees `member`'s slot (or its place in the line). Missing is fine."""
    _redis().eval(_GIVE_BACK, 2, *line.keys, member, f"{line.prefix}:waiter:")


@contextmanager
def start_slot(
    line: Line | None,
    member: str,
    *,
    waiting: Callable[[int], None] | None = None,
    wanted: Callable[[], bool] | None = None,
    check_every: float = 2.0,
):
    """Holds one of `line`'s start slots for the body of the with-block, waiting in line for it first.

    `waiting(ahead)` is called when the launch first has to wait, then when the number of launches ahead of
    it has changed, at most every TELL_EVERY_SECONDS; `wanted()` is asked every `check_every` seconds
    while waiting, and when it says no the wait ends with Cancelled. With no line (a driver whose starts
    need no limit) or no limit, or when Redis cannot be reached, the body runs at once.
    """
    if line is None or line.limit <= 0:
        yield
        return
    held = False
    try:
        told, told_at = None, 0.0
        next_check = time.monotonic() + check_every
        while True:
            ahead = take(line, member)
            if ahead == 0:
                held = True
                break
            if waiting is not None and ahead != told and time.monotonic() >= told_at + TELL_EVERY_SECONDS:
                waiting(ahead)
                told, told_at = ahead, time.monotonic()
            if wanted is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + check_every
                if not wanted():
                    raise Cancelled()
            time.sleep(POLL_SECONDS)
    except (redis.RedisError, OSError) as error:
        logger.warning(
            "start slots for %s: Redis did not answer (%s); starting without a limit", line.engine, error
        )
        held = False
    except BaseException:
        _give_back_quietly(line, member)
        raise
    try:
        yield
    finally:
        if held:
            _give_back_quietly(line, member)


def _give_back_quietly(line: Line, member: str) -> None:
    try:
        give_back(line, member)
    except (redis.RedisError, OSError) as error:
        # The hold lapses on its own when its lease runs out.
        logger.warning("start slots for %s: could not give back %s's slot (%s)", line.engine, member, error)
