"""GPU placement: which host's GPUs an instance gets, decided by the database.

Rules (docs/architecture.md, "Instances"):
- An 8x instance takes all 8 GPUs of an ACTIVE host whose present GPUs are all free, and that has
  exactly 8 of them.
- A 1x instance packs onto the fullest ACTIVE host that still has a free GPU, so whole hosts stay free
  for 8x. Among hosts with equally many GPUs in use, the one with the fewest free GPUs goes first (a host
  with a missing GPU, which can never take an 8x, fills before a whole one), then by name and id.
- Draining, down and retired hosts get nothing.
- Images: a host is a candidate only when it has the instance's image, or a pull (an ImageJob) of it is
  under way there, or its images were never looked at (a host nobody surveyed is not refused on a guess).
  Hosts that have the image come first, so a launch waits on a pull only when no host has the image.
- Workspaces: among those, the host that holds the owner's workspace (Workspace) comes next, before
  packing, so a launch there starts without moving it (provisioning/workspaces.py).
- Reservations: a host's GPUs booked for a window (Reservation) that the instance could still be running
  into are not its to take. The caller says how long the instance may run at most (`runs_until`, from
  its session's limit or its deadline; None: no end), and a host counts as free only what is left after
  the standing bookings whose window overlaps now to then, less the GPUs their own instances already
  hold. An instance launched on a booking goes on the booking's host only, and its own booking does not
  count against it.

Allocation is serialised by the database, not by a process. Each host row carries its present and free
GPU counts (GpuHost.gpus_present, gpus_free), which triggers keep in the same statement as every
allocation, release and discovery (migration 0006), so choosing a host reads host rows only: the
workspace host by id, then the others through an index in packing order. Each query returns one host
and locks it (FOR UPDATE); PostgreSQL re-checks its counts once the lock is granted, so the host
returned fits now, and its free GPUs are read and taken in the next statement, under that lock. The
partial unique constraint on GpuAllocation (one live holder per GPU) is the backstop if anything slips
past: a GPU it refuses is skipped, and a host left short is given back and the next one tried. Any
number of workers may call allocate() at once. SQLite (make run) has no row locks and needs none, as it
lets one transaction write at a time; it has no count triggers either, so there the queries count GPU
rows in place of the two columns.

allocate() is plain SQL: it runs for every launch, and building the equivalent querysets cost more than
the queries themselves (benchmarks/bench_scheduler.py).

The queue: an instance that gets no GPUs stays QUEUED. Queued launches start in the order the caller
hands to next_queued (the instance lifecycle's fair share, portal/instances/queue.py; FIFO by created_at
without one), and plan_queued keeps 8x launches from starving in that order.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.instances.models import Image, Instance, Reservation
from portal.instances.sizes import SIZES

from .models import Gpu, GpuAllocation, GpuHost, HostImage, ImageJob, Workspace

GPUS_PER_WHOLE_HOST = 8
# States an instance can be allocated GPUs in: queued (launch or queue task) or provisioning (the
# provision task allocates after claiming the instance).
ALLOCATABLE_STATES = (Instance.State.QUEUED, Instance.State.PROVISIONING)

TABLES = {
    "instance": Instance._meta.db_table,
    "image": Image._meta.db_table,
    "workspace": Workspace._meta.db_table,
    "host": GpuHost._meta.db_table,
    "gpu": Gpu._meta.db_table,
    "allocation": GpuAllocation._meta.db_table,
    "host_image": HostImage._meta.db_table,
    "image_job": ImageJob._meta.db_table,
    "reservation": Reservation._meta.db_table,
}

# The instance, locked, with what placement needs to know about it.
_LAUNCH_SQL = """
SELECT i.state, i.size, i.host_id, image.reference, workspace.host_id,
    EXISTS (
        SELECT 1 FROM {host_image} hi
        WHERE hi.host_id = workspace.host_id AND hi.reference = image.reference AND hi.present
    ),
    i.reservation_id, reservation.host_id
FROM {instance} i
JOIN {image} image ON image.id = i.image_id
LEFT JOIN {workspace} workspace ON workspace.user_id = i.user_id
LEFT JOIN {reservation} reservation ON reservation.id = i.reservation_id
WHERE i.id = %s
"""
# A host's present and free GPUs: the columns the triggers keep on PostgreSQL (migrations 0006, 0008), a
# count of its rows on SQLite, which has no such triggers. A drained GPU (provisioning/gpu_health.py)
# counts as neither.
_COUNTED_PRESENT = "(SELECT count(*) FROM {gpu} g WHERE g.host_id = h.id AND g.is_present AND NOT g.is_drained)"
_COUNTED_FREE = (
    "(SELECT count(*) FROM {gpu} g WHERE g.host_id = h.id AND g.is_present AND NOT g.is_drained AND NOT EXISTS"
    " (SELECT 1 FROM {allocation} live WHERE live.gpu_id = g.id AND live.released_at IS NULL))"
)
# The 1x packing order; on PostgreSQL, the index provisioning_gpuhost_packing is in exactly this order.
_PACKING_ORDER = "({present} - {free}) DESC, {free}, h.name, h.id"
_WHOLE_HOST_ORDER = "h.name, h.id"
_HAS_IMAGE = (
    "EXISTS (SELECT 1 FROM {host_image} hi WHERE hi.host_id = h.id AND hi.reference = %s AND hi.present)"
)
_PULLING = (
    "EXISTS (SELECT 1 FROM {image_job} job WHERE job.host_id = h.id AND job.reference = %s"
    f" AND job.state IN ({', '.join(['%s'] * len(ImageJob.ACTIVE_STATES))}))"
)
_SURVEYED = "EXISTS (SELECT 1 FROM {host_image} hi WHERE hi.host_id = h.id)"
# GPUs of host h booked by standing reservations whose window overlaps [now, runs_until), less what their
# own instances hold already; the instance's own booking (if any) is left out. Parameters: runs_until,
# now, own reservation id, own reservation id.
_RESERVED = """COALESCE((
    SELECT SUM(r.gpus - (
        SELECT count(*) FROM {allocation} a JOIN {instance} ri ON ri.id = a.instance_id
        WHERE ri.reservation_id = r.id AND a.released_at IS NULL
    ))
    FROM {reservation} r
    WHERE r.host_id = h.id AND r.state = 'booked' AND r.starts_at < %s AND r.ends_at > %s
        AND (%s IS NULL OR r.id <> %s)
), 0)"""
# Far enough ahead to stand for "no end": past any window anyone may book.
_NO_END = timedelta(days=3650)
# The host's free GPUs, lowest node first, taken in one statement; allocation ids follow that order. A GPU
# that someone took meanwhile without locking the host (only a direct write could) is skipped by the
# one-live-holder constraint instead of failing the statement. The OFFSET keeps PostgreSQL from turning
# the NOT EXISTS into a join over every live allocation in the fleet (what it picks while its statistics
# still count few): it looks up each of the host's GPUs in the one-live-holder index instead.
_TAKE_SQL = """
INSERT INTO {allocation} (gpu_id, instance_id, allocated_at, released_at)
SELECT g.id, %s, %s, NULL FROM {gpu} g
WHERE g.host_id = %s AND g.is_present AND NOT g.is_drained
    AND NOT EXISTS (
        SELECT 1 FROM {allocation} live WHERE live.gpu_id = g.id AND live.released_at IS NULL LIMIT 1 OFFSET 0
    )
ORDER BY g.node_id
LIMIT %s
ON CONFLICT DO NOTHING
RETURNING id, gpu_id
"""


class SchedulerError(Exception):
    """allocate() was asked for something it can never do (unknown size, an instance that has ended)."""


@dataclass(frozen=True)
class _Launch:
    state: str
    size: str
    # The host it was given (None until _take gives it one), read from the locked row itself.
    host_id: int | None
    reference: str
    # The host of the owner's workspace (None without one), and whether it has the image.
    home_host_id: int | None
    home_has_image: bool
    # The booking it was launched on and that booking's host (None for an ordinary launch).
    reservation_id: object = None
    reservation_host_id: int | None = None


def _sql(template: str) -> str:
    return template.format(**TABLES)


def _lock_clause(*, of: str = "") -> str:
    """The FOR UPDATE clause (of table alias `of`, if given) where the database has row locks; "" on
    SQLite, which lets one transaction write at a time."""
    if not connection.features.has_select_for_update:
        return ""
    if of and connection.features.has_select_for_update_of:
        return f" FOR UPDATE OF {of}"
    return " FOR UPDATE"


def _lock_launch(cursor, instance_id) -> _Launch | None:
    """The instance's row, locked; None if there is no such instance."""
    instance_pk = Instance._meta.pk.get_db_prep_value(instance_id, connection)
    cursor.execute(_sql(_LAUNCH_SQL) + _lock_clause(of="i"), [instance_pk])
    row = cursor.fetchone()
    if row is None:
        return None
    state, size, host_id, reference, home_host_id, home_has_image, reservation_id, reservation_host_id = row
    return _Launch(
        state, size, host_id, reference, home_host_id, bool(home_has_image),
        reservation_id, reservation_host_id,
    )


def _reserved_condition(launch: _Launch, gpus_needed: int, runs_until, counts: dict) -> tuple[str, list]:
    """SQL condition (and its parameters) for a host whose GPUs left after the bookings the instance
    could run into (see _RESERVED) still number `gpus_needed`; on the booking's host only, for a launch
    on a booking."""
    now = timezone.now()
    until = runs_until if runs_until is not None else now + _NO_END
    own = None
    if launch.reservation_id is not None:
        own = Reservation._meta.pk.get_db_prep_value(launch.reservation_id, connection)
    adapt = connection.ops.adapt_datetimefield_value
    condition = f"{counts['free']} - {_sql(_RESERVED)} >= %s"
    params = [adapt(until), adapt(now), own, own, gpus_needed]
    if launch.reservation_id is not None:
        condition += " AND h.id = %s"
        params.append(launch.reservation_host_id)
    return condition, params


def _still_room(cursor, *, host_id: int, launch: _Launch, gpus_needed: int, runs_until) -> bool:
    """Whether the locked host still has room once the bookings are read afresh: a booking that committed
    while this allocation waited for the host's lock is not in the snapshot of the query that chose it."""
    condition, params = _reserved_condition(launch, gpus_needed, runs_until, _counts())
    cursor.execute(_sql("SELECT 1 FROM {host} h WHERE h.id = %s AND ") + condition, [host_id, *params])
    return cursor.fetchone() is not None


def _counts() -> dict:
    """SQL for a host's present and free GPU counts on this database, by name."""
    if connection.vendor == "postgresql":
        return {"present": "h.gpus_present", "free": "h.gpus_free"}
    return {"present": _sql(_COUNTED_PRESENT), "free": _sql(_COUNTED_FREE)}


def _fits(gpus_needed: int, reserve_whole_hosts: bool, counts: dict) -> tuple[str, list]:
    """SQL condition (and its parameters) for a host whose counts say it can take `gpus_needed` now."""
    whole_and_free = "(({present} - {free}) = 0 AND {free} = %s)".format(**counts)
    if gpus_needed == GPUS_PER_WHOLE_HOST:
        return whole_and_free, [GPUS_PER_WHOLE_HOST]
    enough = "{free} >= %s".format(**counts)
    if reserve_whole_hosts:
        # An 8x launch is waiting: a host that could take it is not used for a 1x.
        return f"{enough} AND NOT {whole_and_free}", [gpus_needed, GPUS_PER_WHOLE_HOST]
    return enough, [gpus_needed]


def _image_tiers(reference: str) -> list[tuple[str, list]]:
    """Host conditions (and their parameters) for `reference`, best first: has it, then pulling it or
    never surveyed."""
    if not reference:
        return [("TRUE", [])]
    pulling = [reference, *ImageJob.ACTIVE_STATES]
    return [
        (_sql(_HAS_IMAGE), [reference]),
        (_sql(f"NOT {_HAS_IMAGE} AND ({_PULLING} OR NOT {_SURVEYED})"), [reference, *pulling]),
    ]


def _locked_candidates(
    cursor, *, launch: _Launch, gpus_needed: int, reserve_whole_hosts: bool, runs_until=None
):
    """Yields ids of ACTIVE hosts that can take `gpus_needed` GPUs, best first, each locked and each once.

    Per image tier, the owner's workspace host (launch.home_host_id, if any) comes first, then the others
    in packing order. One query per host yielded: the next is looked for only if the caller asks. Under
    READ COMMITTED, a host another allocation holds is waited for and re-checked once it commits; if it
    no longer fits, the query goes on to the next host in order.
    """
    counts = _counts()
    fits, fits_params = _fits(gpus_needed, reserve_whole_hosts, counts)
    reserved, reserved_params = _reserved_condition(launch, gpus_needed, runs_until, counts)
    fits, fits_params = f"{fits} AND {reserved}", [*fits_params, *reserved_params]
    order = _WHOLE_HOST_ORDER if gpus_needed == GPUS_PER_WHOLE_HOST else _PACKING_ORDER.format(**counts)
    lock = _lock_clause()
    base = _sql("SELECT h.id FROM {host} h WHERE h.state = %s AND ") + fits
    home = launch.home_host_id
    # The workspace host can only be in the first tier if it has the image, and only in the second if not.
    home_tier = 0 if launch.home_has_image or not launch.reference else 1
    tried = []
    for number, (tier, tier_params) in enumerate(_image_tiers(launch.reference)):
        params = [GpuHost.State.ACTIVE, *fits_params, *tier_params]
        if home is not None and number == home_tier:
            cursor.execute(f"{base} AND {tier} AND h.id = %s{lock}", [*params, home])
            if cursor.fetchone():
                tried.append(home)
                yield home
        while True:
            untried = f" AND h.id NOT IN ({', '.join(['%s'] * len(tried))})" if tried else ""
            cursor.execute(f"{base} AND {tier}{untried} ORDER BY {order} LIMIT 1{lock}", [*params, *tried])
            row = cursor.fetchone()
            if row is None:
                break
            tried.append(row[0])
            yield row[0]


def _take(cursor, *, host_id: int, instance_id, gpus_needed: int) -> list[GpuAllocation] | None:
    """Allocate `gpus_needed` free GPUs of the locked host and point the instance at it. Returns the new
    allocations, lowest node first; None, having taken nothing, if the host has fewer free than that."""
    instance_pk = Instance._meta.pk.get_db_prep_value(instance_id, connection)
    allocated_at = timezone.now()
    cursor.execute(
        _sql(_TAKE_SQL),
        [instance_pk, connection.ops.adapt_datetimefield_value(allocated_at), host_id, gpus_needed],
    )
    rows = sorted(cursor.fetchall())
    if len(rows) < gpus_needed:
        # Fewer than its count said (see _TAKE_SQL): give back what was taken, and try the next host.
        if rows:
            taken = [pk for pk, _ in rows]
            placeholders = ", ".join(["%s"] * len(taken))
            cursor.execute(_sql(f"DELETE FROM {{allocation}} WHERE id IN ({placeholders})"), taken)
        return None
    cursor.execute(_sql("UPDATE {instance} SET host_id = %s WHERE id = %s"), [host_id, instance_pk])
    fields = ["id", "gpu_id", "instance_id", "allocated_at", "released_at"]
    return [
        GpuAllocation.from_db(connection.alias, fields, (pk, gpu_id, instance_id, allocated_at, None))
        for pk, gpu_id in rows
    ]


def allocate(
    *, instance_id, reserve_whole_hosts: bool = False, runs_until=None
) -> list[GpuAllocation] | None:
    """Give the instance its GPUs on one host, in one transaction. Returns its live allocations.

    Returns None when no ACTIVE host can take it now; the instance is left QUEUED for the caller to keep
    in the queue. Idempotent: an instance that already holds GPUs gets its existing allocations back.
    Sets instance.host; does not change the instance's state (the caller moves it on).
    `reserve_whole_hosts` (1x only) keeps entirely free 8-GPU hosts for a waiting 8x; see next_queued.
    `runs_until` is the latest the instance may still run (None: it has no end); GPUs booked for a
    window that opens before then are not given to it (see "Reservations" above).

    Raises SchedulerError for an unknown size or an instance that is not queued or provisioning, and
    Instance.DoesNotExist for an unknown id.
    """
    instance_id = Instance._meta.pk.to_python(instance_id)
    with transaction.atomic(), connection.cursor() as cursor:
        # Locking the instance makes a duplicate call (a redelivered task) wait, then see the first
        # call's allocations instead of allocating twice.
        launch = _lock_launch(cursor, instance_id)
        if launch is None:
            raise Instance.DoesNotExist(f"No instance {instance_id}.")
        if launch.state not in ALLOCATABLE_STATES:
            raise SchedulerError(
                f"Instance {str(instance_id)[:8]} is {launch.state}; only a live launch gets GPUs."
            )
        size = SIZES.get(launch.size)
        if size is None:
            raise SchedulerError(f"Unknown instance size {launch.size!r}.")
        # An instance that was never given a host holds no GPUs: _take sets the host in the transaction
        # that allocates. The host comes from the locked row, which PostgreSQL re-reads once a call that
        # waited for the lock gets it, so a duplicate call sees the first call's host. Only then are the
        # allocations asked for, in a statement of their own: the rest of the row was read under the
        # snapshot from before the wait and would not show the first call's allocations.
        if launch.host_id is not None:
            held = list(GpuAllocation.objects.filter(instance_id=instance_id, released_at__isnull=True))
            if held:
                return held

        candidates = _locked_candidates(
            cursor,
            launch=launch,
            gpus_needed=size.gpus,
            reserve_whole_hosts=reserve_whole_hosts,
            runs_until=runs_until,
        )
        for host_id in candidates:
            if not _still_room(
                cursor, host_id=host_id, launch=launch, gpus_needed=size.gpus, runs_until=runs_until
            ):
                continue
            allocations = _take(cursor, host_id=host_id, instance_id=instance_id, gpus_needed=size.gpus)
            if allocations:
                return allocations
        return None


def release(*, instance_id) -> int:
    """Free every GPU the instance holds. Returns how many were freed; 0 when it held none (idempotent).

    The host's free count follows in the same statement (a trigger), which locks the host row until the
    caller's transaction ends.
    """
    return GpuAllocation.objects.filter(instance_id=instance_id, released_at__isnull=True).update(
        released_at=timezone.now()
    )


def _queued():
    return Instance.objects.filter(state=Instance.State.QUEUED).order_by("created_at", "id")


@dataclass(frozen=True)
class QueuedLaunch:
    """A queued instance to try now, and how: pass reserve_whole_hosts on to allocate()."""

    instance: Instance
    reserve_whole_hosts: bool


def eightx_max_wait() -> timedelta:
    """How long the oldest queued 8x may wait before launches behind it are held back for it."""
    return timedelta(seconds=getattr(settings, "SCHEDULER_8X_MAX_WAIT_SECONDS", 600))


def next_queued(*, limit: int = 100, now=None, order: Iterable[Instance] | None = None) -> list[QueuedLaunch]:
    """The queued launches the "start queued launches" task should try, in the order to try them.

    `order` is the queue as the caller ranks it (the instance lifecycle's fair share, which reads people's
    use and shares that the fleet does not know); without it, FIFO by created_at. plan_queued() then keeps
    8x launches from starving. Returns at most `limit` entries.
    """
    ranked = _queued()[:limit] if order is None else list(order)[:limit]
    return plan_queued(ranked, now=now or timezone.now())


def plan_queued(ranked: Iterable, *, now) -> list[QueuedLaunch]:
    """`ranked` queued launches (anything with .size and .created_at), in the order to try them, with
    bounded backfill so that neither size starves:
    - Launches ahead of the first 8x in the order are tried normally.
    - Behind a waiting 8x, 1x launches may still start, but only on partly used hosts
      (reserve_whole_hosts=True): a host that frees up entirely is kept for the 8x. Later 8x launches
      are listed too; they can only ever take a whole free host, after the first 8x has had its try.
    - Once that 8x has waited longer than SCHEDULER_8X_MAX_WAIT_SECONDS (default 600), nothing behind it
      is listed: it goes next, so partly used hosts drain as their instances stop instead of being
      refilled by 1x backfill forever.
    Pure: the fair-share benchmark runs it on simulated launches.
    """
    launches = []
    waiting_8x = None
    for instance in ranked:
        if waiting_8x is not None and now - waiting_8x.created_at > eightx_max_wait():
            break
        launches.append(QueuedLaunch(instance=instance, reserve_whole_hosts=waiting_8x is not None))
        size = SIZES.get(instance.size)
        if waiting_8x is None and size is not None and size.gpus == GPUS_PER_WHOLE_HOST:
            waiting_8x = instance
    return launches
