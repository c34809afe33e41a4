"""Metering: running instances are charged GPUs × seconds, from the moment they turn ready until they stop.

How the money moves (docs/architecture.md, "Credits", Metering):
- `Instance.metered_until` is where charging got to. It starts at ready_at; nothing before ready is
  ever charged, so failed and never-ready instances cost nothing.
- The beat tick (`meter_tick`) charges every running instance from metered_until to now, in whole
  seconds, and moves metered_until forward in the same transaction as the ledger entry. The entry's
  idempotency key names the instance and the period's start, so a period can never be charged twice.
- Leaving RUNNING (a stop, credits running out) charges the rest in the same transaction as the state
  change (`charge_until`), so after that the tick never sees the instance again.
- The balance never goes below minus one tick's worth: a charge that would take the owner below
  `-(their running GPUs × METER_TICK_SECONDS)` is cut to that floor, and the rest is waived (the
  instance is stopped in the same tick, so what is waived is at most what accrued while beat was late).
- An instance is never charged past the moment its host was last confirmed alive while that host is in
  doubt: on a host that is down, or whose latest heartbeat failed, a tick charges only up to the host's
  last_seen_at (`host_in_doubt`). The time is charged later if the host answers again; if it goes down,
  the lifecycle stops the instance and settles it at that moment (`settle_until`).
- After charging, every live instance of an owner whose balance is at or below zero is stopped with
  stop_reason credits_exhausted, through the bulk stop in portal/instances/transitions.py.
- Once a batch has committed, its owners get the credit warnings (about 1 hour or 10 minutes left at
  their running GPUs' burn) and the "stopped: credits ran out" email, each once per event.

Lock order everywhere: the owner's CreditAccount, then the Instance rows (launch and stop follow it too).
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Case, IntegerField, Sum, Value, When
from django.utils import timezone

from portal.instances import transitions
from portal.instances.models import Instance
from portal.instances.sizes import SIZES
from provisioning.models import GpuHost
from portal.notifications.services import (
    CREDIT_WARNINGS,
    StopReason,
    credit_warnings_check,
    notify_instance_stopped,
)

from .models import CreditAccount, LedgerEntry
from .services import ledger_post

logger = logging.getLogger(__name__)

# Instances charged per transaction. Each batch takes its owners' account locks for one short
# transaction; a user's instances always fall in the same batch.
BATCH_SIZE = 1000


def usage_key(instance_id, period_start: datetime) -> str:
    """The idempotency key of the charge for one instance's period starting at `period_start`."""
    return f"usage:{instance_id}:{period_start.isoformat()}"


def gpus_of(size: str) -> int:
    return SIZES[size].gpus


def debt_floor(running_gpus: int) -> int:
    """The lowest balance metering may leave: minus one tick's worth of the owner's running GPUs."""
    return -max(running_gpus, 1) * settings.METER_TICK_SECONDS


def running_gpus_expression():
    """GPUs of an instance's size, as SQL, for sums over many instances."""
    return Case(
        *[When(size=key, then=Value(size.gpus)) for key, size in SIZES.items()],
        default=Value(0),
        output_field=IntegerField(),
    )


@dataclass
class PeriodCharge:
    """What one instance owes for one period, after the debt floor."""

    gpu_seconds: int
    period_start: datetime
    period_end: datetime
    # GPU-seconds not charged because of the debt floor.
    waived: int = 0


def period_charge(*, instance, until: datetime, balance: int, floor: int) -> PeriodCharge | None:
    """The charge from instance.metered_until to `until`, in whole seconds; None when nothing accrued.

    The period ends on a whole second after metered_until, so the fraction left over is charged by
    the next period and nothing is lost or charged twice.
    """
    if instance.metered_until is None or until <= instance.metered_until:
        return None
    seconds = int((until - instance.metered_until).total_seconds())
    if seconds <= 0:
        return None
    owed = seconds * gpus_of(instance.size)
    charged = max(0, min(owed, balance - floor))
    return PeriodCharge(
        gpu_seconds=charged,
        period_start=instance.metered_until,
        period_end=instance.metered_until + timedelta(seconds=seconds),
        waived=owed - charged,
    )


def _usage_reason(instance: Instance, charge: PeriodCharge) -> str:
    seconds = int((charge.period_end - charge.period_start).total_seconds())
    reason = f"{SIZES[instance.size].name} instance {instance.short_id}: {seconds} s"
    if charge.waived:
        reason += f" ({charge.waived} GPU-seconds waived at the debt floor)"
    return reason


def charge_until(*, instance: Instance, until: datetime) -> int:
    """Charge one RUNNING instance up to `until` and move its metered_until there. Returns GPU-seconds charged.

    For the moment an instance leaves RUNNING (stop) or a teardown that finds charging behind. The
    caller runs inside transaction.atomic() and has locked the owner's CreditAccount and then the
    instance row (select_for_update), in that order. Idempotent per period through the ledger key.
    """
    account = CreditAccount.objects.select_for_update().get(user_id=instance.user_id)
    running_gpus = (
        Instance.objects.filter(user_id=instance.user_id, state=Instance.State.RUNNING).aggregate(
            gpus=Sum(running_gpus_expression())
        )["gpus"]
        or 0
    )
    charge = period_charge(
        instance=instance,
        until=until,
        balance=account.balance_gpu_seconds,
        floor=debt_floor(max(running_gpus, gpus_of(instance.size))),
    )
    if charge is None:
        return 0
    if charge.gpu_seconds:
        ledger_post(
            user=instance.user,
            kind=LedgerEntry.Kind.USAGE,
            gpu_seconds=-charge.gpu_seconds,
            idempotency_key=usage_key(instance.id, charge.period_start),
            reason=_usage_reason(instance, charge),
        )
    instance.metered_until = charge.period_end
    instance.charged_gpu_seconds += charge.gpu_seconds
    Instance.objects.filter(pk=instance.pk).update(
        metered_until=instance.metered_until, charged_gpu_seconds=instance.charged_gpu_seconds
    )
    return charge.gpu_seconds


def host_in_doubt(*, state: str, last_error: str) -> bool:
    """Whether a host's instances may be charged only up to its last_seen_at: it is down, or its latest
    heartbeat (provisioning/health.py) did not answer."""
    return state == GpuHost.State.DOWN or bool(last_error)


def tick_until(*, now: datetime, metered_until: datetime, host_state, host_last_error, host_last_seen_at):
    """Where a tick charges one running instance to: `now`, or its host's last_seen_at while the host is
    in doubt (never before metered_until). The Python twin of the CASE in _CHARGE_SQL."""
    if host_state is None or not host_in_doubt(state=host_state, last_error=host_last_error or ""):
        return now
    return max(metered_until, min(now, host_last_seen_at or metered_until))


def settle_until(*, instance: Instance, until: datetime) -> int:
    """Make one RUNNING instance's charges end exactly at `until` (its host's last heartbeat, when the
    host went down). Returns the GPU-seconds charged (positive) or given back (negative).

    Charges up to `until` when metering is behind it (charge_until). When a tick charged past it (the
    tick ran after the host's last answer but before a heartbeat noticed), the whole seconds past it
    are given back as a reversal entry and metered_until moves back to it or just before, so the
    instance has paid for no time after `until`. Idempotent: the reversal's key names the instance.
    The caller holds the owner's CreditAccount lock and then the instance's row lock.
    """
    if instance.metered_until is None or instance.metered_until <= until:
        return charge_until(instance=instance, until=until)
    past = instance.metered_until - until
    seconds = int(past.total_seconds()) + (1 if past.total_seconds() % 1 else 0)
    refund = min(seconds * gpus_of(instance.size), instance.charged_gpu_seconds)
    if refund > 0:
        ledger_post(
            user=instance.user,
            kind=LedgerEntry.Kind.REVERSAL,
            gpu_seconds=refund,
            idempotency_key=f"host-down-reversal:{instance.id}",
            reason=f"{SIZES[instance.size].name} instance {instance.short_id}: {seconds} s charged after "
            "its host was last seen, given back",
        )
    instance.metered_until -= timedelta(seconds=seconds)
    instance.charged_gpu_seconds -= refund
    Instance.objects.filter(pk=instance.pk).update(
        metered_until=instance.metered_until, charged_gpu_seconds=instance.charged_gpu_seconds
    )
    return -refund


@dataclass
class TickResult:
    """What one meter tick did."""

    instances_charged: int = 0
    gpu_seconds: int = 0
    gpu_seconds_waived: int = 0
    # Instances moved to STOPPING because their owner ran out; the caller enqueues their teardown.
    stopping_ids: list = field(default_factory=list)
    # Queued instances of owners who ran out, stopped before they ever started.
    stopped_queued_ids: list = field(default_factory=list)


def meter_tick(now: datetime | None = None, *, batch_size: int = BATCH_SIZE) -> TickResult:
    """Charge every running instance up to `now` and stop the instances of owners who ran out.

    Returns a TickResult; the caller enqueues a teardown for each of `stopping_ids` (and releases the
    GPUs of `stopped_queued_ids`). Safe to run twice or concurrently: each batch re-reads metered_until
    under the row locks, so a second run charges only what accrued since the first.

    Scales with batches: per batch of up to `batch_size` instances it runs a fixed number of queries
    (lock the accounts, lock the instances, one bulk insert of ledger entries, one update each for
    accounts and instances, and the stops), whatever the number of instances or owners. It writes
    ledger entries in bulk rather than through ledger_post() one by one for that reason; the entries
    are the same (kind usage, unique idempotency key, balance_after, reason).
    """
    now = now or timezone.now()
    result = TickResult()
    running = (
        Instance.objects.filter(state=Instance.State.RUNNING, metered_until__isnull=False)
        .order_by("user_id", "id")
        .values_list("user_id", "id")
    )
    for batch in _batches_by_owner(running.iterator(chunk_size=5000), batch_size):
        _charge_batch(batch, now, result)
    return result


def _batches_by_owner(rows, batch_size):
    """Group (user_id, instance_id) rows, sorted by user, into batches that never split an owner."""
    batch: dict[int, list] = {}
    count = 0
    for user_id, owned in groupby(rows, key=lambda row: row[0]):
        ids = [instance_id for _, instance_id in owned]
        if count and count + len(ids) > batch_size:
            yield batch
            batch, count = {}, 0
        batch[user_id] = ids
        count += len(ids)
    if batch:
        yield batch


@dataclass(slots=True)
class _Metered:
    """The columns of a running instance a tick needs; cheaper than a model instance, times thousands."""

    id: object
    user_id: int
    size: str
    metered_until: datetime
    charged_gpu_seconds: int

    @property
    def short_id(self) -> str:
        return str(self.id)[:8]


def _charge_batch(batch: dict[int, list], now: datetime, result: TickResult) -> None:
    user_ids = sorted(batch)
    stopping_before, queued_before = len(result.stopping_ids), len(result.stopped_queued_ids)
    with transaction.atomic():
        accounts = _lock_accounts(user_ids)
        missing = set(user_ids) - accounts.keys()
        if missing:
            # An owner without an account cannot have launched through instance_launch; make one so the
            # charge has somewhere to go rather than letting the instance run free. The new accounts are
            # locked after the others, out of id order: safe, as no other path locks a brand-new account
            # together with others (a concurrent tick waits on this batch's first account).
            for user_id in sorted(missing):
                CreditAccount.objects.get_or_create(user_id=user_id)
            accounts = _lock_accounts(user_ids)
        charge = _charge_in_database if connection.vendor == "postgresql" else _charge_in_python
        charged = charge(batch, accounts, now)
        for user_id, balance in charged.balances.items():
            accounts[user_id][1] = balance
        result.instances_charged += charged.instances_charged
        result.gpu_seconds += charged.gpu_seconds
        result.gpu_seconds_waived += charged.gpu_seconds_waived
        for instance_id, waived in charged.waived:
            logger.warning("Waived %s GPU-seconds of %s at the debt floor", waived, instance_id)

        exhausted = [user_id for user_id, (_, balance) in accounts.items() if balance <= 0]
        if exhausted:
            _stop_exhausted(exhausted, now, result)

    # After the commit, so a rolled-back batch tells nobody and no email waits on the account locks.
    try:
        _notify_batch(
            balances=charged.balances,
            running_gpus=charged.running_gpus,
            stopped_ids=result.stopping_ids[stopping_before:] + result.stopped_queued_ids[queued_before:],
        )
    except Exception:
        # The charges stand and the next batches must still be charged; a lost notice is only logged.
        logger.exception("Could not notify the owners of a metering batch")


def _lock_accounts(user_ids: list[int]) -> dict[int, list]:
    """Lock the accounts of these owners, in id order like every other path that locks accounts, and
    return user_id -> [account id, balance]."""
    return {
        user_id: [account_id, balance]
        for account_id, user_id, balance in CreditAccount.objects.select_for_update()
        .filter(user_id__in=user_ids)
        .order_by("id")
        .values_list("id", "user_id", "balance_gpu_seconds")
    }


@dataclass
class _BatchCharges:
    """What charging one batch did, for the tick's result and the owners' notices."""

    # user_id -> balance after the charges, for the owners charged something.
    balances: dict = field(default_factory=dict)
    # user_id -> GPUs of the owner's running instances.
    running_gpus: dict = field(default_factory=dict)
    instances_charged: int = 0
    gpu_seconds: int = 0
    gpu_seconds_waived: int = 0
    # (instance id, GPU-seconds waived at the debt floor)
    waived: list = field(default_factory=list)


# The whole batch's charge in one statement, on PostgreSQL. The same arithmetic as period_charge()
# applied instance by instance in (user_id, id) order, with the balance carried from one to the next:
# with room = balance - floor and `before` the GPU-seconds owed by the owner's earlier instances,
# instance k is charged max(0, min(owed_k, room - before_k)), and the balance after it is
# balance - max(0, min(room, before_k + owed_k)). Every period ends on a whole second after
# metered_until. The ledger key and reason are usage_key() and _usage_reason() written in SQL.
# The caller holds the owners' account locks, taken in an earlier statement, so this statement's snapshot
# already has whatever a concurrent tick or stop committed. It also locks the instance rows (`locked`),
# in the order every other path locks them, and charges from the row versions that lock returned.
_CHARGE_SQL = """
WITH locked AS (
    SELECT i.id, i.user_id, i.size, i.metered_until,
        -- tick_until(): a host in doubt (down, or its latest heartbeat failed) is charged only up to
        -- the moment it last answered.
        CASE WHEN h.state = %(down)s OR h.last_error <> ''
            THEN greatest(i.metered_until, least(%(now)s, coalesce(h.last_seen_at, i.metered_until)))
            ELSE %(now)s END AS charge_until
    FROM {instance} i LEFT JOIN {host} h ON h.id = i.host_id
    WHERE i.user_id = ANY(%(users)s) AND i.state = %(running)s AND i.metered_until IS NOT NULL
    ORDER BY i.user_id, i.id FOR UPDATE OF i
),
running AS (
    SELECT i.id, i.user_id, i.metered_until, a.id AS account_id, a.balance_gpu_seconds AS balance,
        coalesce(size.gpus, 0) AS gpus, coalesce(size.name, i.size) AS size_name,
        floor(extract(epoch FROM (i.charge_until - i.metered_until)))::bigint AS seconds
    FROM locked i
    JOIN {account} a ON a.user_id = i.user_id
    LEFT JOIN unnest(%(size_keys)s::text[], %(size_gpus)s::bigint[], %(size_names)s::text[])
        AS size(key, gpus, name) ON size.key = i.size
),
owners AS (
    SELECT user_id, sum(gpus)::bigint AS gpus FROM running GROUP BY user_id
),
owed AS (
    SELECT running.*, owners.gpus AS owner_gpus, running.seconds * running.gpus AS owed,
        running.balance + greatest(owners.gpus, 1) * %(tick)s AS room,
        (sum(running.seconds * running.gpus) OVER (
            PARTITION BY running.user_id ORDER BY running.id ROWS UNBOUNDED PRECEDING
        ))::bigint AS owed_through
    FROM running JOIN owners USING (user_id)
    WHERE running.seconds > 0
),
charges AS (
    SELECT *, greatest(0, least(owed, room - (owed_through - owed))) AS charged,
        balance - greatest(0, least(room, owed_through)) AS balance_after
    FROM owed
),
metered AS (
    UPDATE {instance} i
    SET metered_until = c.metered_until + c.seconds * interval '1 second',
        charged_gpu_seconds = i.charged_gpu_seconds + c.charged
    FROM charges c WHERE i.id = c.id
),
entries AS (
    INSERT INTO {ledger}
        (account_id, kind, gpu_seconds, balance_after, idempotency_key, reason, actor_id, actor_name,
         created_at)
    SELECT account_id, %(usage)s, -charged, balance_after,
        'usage:' || id::text || ':'
            || to_char(metered_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
            || CASE WHEN date_trunc('second', metered_until) = metered_until THEN ''
                ELSE to_char(metered_until AT TIME ZONE 'UTC', '.US') END
            || '+00:00',
        size_name || ' instance ' || left(id::text, 8) || ': ' || seconds || ' s'
            || CASE WHEN owed > charged
                THEN ' (' || (owed - charged) || ' GPU-seconds waived at the debt floor)' ELSE '' END,
        NULL, 'system', %(created_at)s
    FROM charges WHERE charged > 0
    ORDER BY user_id, id
),
totals AS (
    SELECT account_id, sum(charged) AS charged FROM charges GROUP BY account_id HAVING sum(charged) > 0
),
balances AS (
    UPDATE {account} a SET balance_gpu_seconds = a.balance_gpu_seconds - totals.charged,
        updated_at = %(now)s
    FROM totals WHERE a.id = totals.account_id
    RETURNING a.user_id, a.balance_gpu_seconds
)
SELECT 'owner', owners.user_id::text, owners.gpus, balances.balance_gpu_seconds
    FROM owners LEFT JOIN balances USING (user_id)
UNION ALL
SELECT 'total', (count(*) FILTER (WHERE charged > 0))::text, coalesce(sum(charged), 0)::bigint,
    coalesce(sum(owed - charged), 0)::bigint
    FROM charges
UNION ALL
SELECT 'waived', id::text, owed - charged, NULL FROM charges WHERE owed > charged
"""


def _charge_in_database(batch: dict[int, list], accounts: dict, now: datetime) -> _BatchCharges:
    """Charge the running instances of the batch's owners in one statement (see _CHARGE_SQL)."""
    sql = _CHARGE_SQL.format(
        instance=Instance._meta.db_table,
        account=CreditAccount._meta.db_table,
        ledger=LedgerEntry._meta.db_table,
        host=GpuHost._meta.db_table,
    )
    params = {
        "down": GpuHost.State.DOWN,
        "users": sorted(batch),
        "running": Instance.State.RUNNING,
        "now": now,
        "tick": settings.METER_TICK_SECONDS,
        "size_keys": list(SIZES),
        "size_gpus": [size.gpus for size in SIZES.values()],
        "size_names": [size.name for size in SIZES.values()],
        "usage": LedgerEntry.Kind.USAGE,
        "created_at": timezone.now(),
    }
    charged = _BatchCharges()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for what, key, number, other in cursor.fetchall():
            if what == "owner":
                charged.running_gpus[int(key)] = number
                if other is not None:
                    charged.balances[int(key)] = other
            elif what == "total":
                charged.instances_charged = int(key)
                charged.gpu_seconds, charged.gpu_seconds_waived = number, other
            else:
                charged.waived.append((key, number))
    return charged


def _charge_in_python(batch: dict[int, list], accounts: dict, now: datetime) -> _BatchCharges:
    """Charge the running instances of the batch's owners with period_charge(), one by one, and write
    the result in bulk. For SQLite (`make run`'s default database); PostgreSQL runs _CHARGE_SQL."""
    rows = (
        Instance.objects.select_for_update(of=("self",))
        .filter(user_id__in=sorted(batch), state=Instance.State.RUNNING, metered_until__isnull=False)
        .order_by("user_id", "id")
        .values_list(
            "id", "user_id", "size", "metered_until", "charged_gpu_seconds",
            "host__state", "host__last_error", "host__last_seen_at",
        )
    )  # fmt: skip
    instances, until = [], {}
    for *columns, host_state, host_last_error, host_last_seen_at in rows:
        instance = _Metered(*columns)
        instances.append(instance)
        until[instance.id] = tick_until(
            now=now,
            metered_until=instance.metered_until,
            host_state=host_state,
            host_last_error=host_last_error,
            host_last_seen_at=host_last_seen_at,
        )
    charged = _BatchCharges()
    for instance in instances:
        charged.running_gpus[instance.user_id] = charged.running_gpus.get(instance.user_id, 0) + gpus_of(
            instance.size
        )
    entries, changed = [], []
    for instance in instances:
        account = accounts[instance.user_id]
        charge = period_charge(
            instance=instance,
            until=until[instance.id],
            balance=account[1],
            floor=debt_floor(charged.running_gpus[instance.user_id]),
        )
        if charge is None:
            continue
        instance.metered_until = charge.period_end
        instance.charged_gpu_seconds += charge.gpu_seconds
        changed.append(instance)
        charged.gpu_seconds_waived += charge.waived
        if charge.waived:
            charged.waived.append((str(instance.id), charge.waived))
        if not charge.gpu_seconds:
            continue
        account[1] -= charge.gpu_seconds
        charged.balances[instance.user_id] = account[1]
        entries.append(
            LedgerEntry(
                account_id=account[0],
                kind=LedgerEntry.Kind.USAGE,
                gpu_seconds=-charge.gpu_seconds,
                balance_after=account[1],
                idempotency_key=usage_key(instance.id, charge.period_start),
                reason=_usage_reason(instance, charge),
                actor_name="system",
            )
        )
        charged.instances_charged += 1
        charged.gpu_seconds += charge.gpu_seconds
    if entries:
        LedgerEntry.objects.bulk_create(entries, batch_size=1000)
        _save_balances([accounts[user_id] for user_id in charged.balances], now)
    if changed:
        _save_metering(changed)
    return charged


def _notify_batch(*, balances: dict[int, int], running_gpus: dict[int, int], stopped_ids: list) -> None:
    """Tell owners what a committed batch means for them: the credit warnings (about 1 hour, about 10
    minutes left at their running GPUs' burn) and the instance_stopped email for each instance stopped
    because credits ran out. Both are once per event, so a repeated tick sends nothing new.

    Queries only for owners whose runway is within the widest warning and for the stopped instances:
    a tick in which nobody runs low costs no query at all.
    """
    warn_within = max(limit for _, limit in CREDIT_WARNINGS)
    # The same runway credit_warnings_check works out: balance / (GPUs x 3600) hours.
    low = [
        user_id
        for user_id, balance in balances.items()
        if 0 < balance and running_gpus.get(user_id) and balance // running_gpus[user_id] <= warn_within
    ]
    if low:
        for user in get_user_model().objects.filter(pk__in=low):
            credit_warnings_check(
                user=user,
                balance_gpu_seconds=balances[user.pk],
                burn_gpu_seconds_per_hour=running_gpus[user.pk] * 3600,
            )
    if stopped_ids:
        for instance in Instance.objects.filter(id__in=stopped_ids).select_related("user", "image"):
            notify_instance_stopped(instance=instance, reason=StopReason.CREDITS_EXHAUSTED)


def _save_balances(balances: list, now: datetime) -> None:
    """Write [account id, balance] pairs in bulk (the SQLite path; PostgreSQL writes them in _CHARGE_SQL)."""
    CreditAccount.objects.bulk_update(
        [CreditAccount(pk=pk, balance_gpu_seconds=balance, updated_at=now) for pk, balance in balances],
        ["balance_gpu_seconds", "updated_at"],
        batch_size=500,
    )


def _save_metering(instances: list[_Metered]) -> None:
    """Write metered_until and charged_gpu_seconds of many instances in bulk (see _save_balances)."""
    Instance.objects.bulk_update(
        [
            Instance(pk=i.id, metered_until=i.metered_until, charged_gpu_seconds=i.charged_gpu_seconds)
            for i in instances
        ],
        ["metered_until", "charged_gpu_seconds"],
        batch_size=500,
    )


def _stop_exhausted(user_ids: list[int], now: datetime, result: TickResult) -> None:
    """Stop every live instance of these owners through the instance transitions' bulk stop: running and
    provisioning ones go to STOPPING for a teardown, queued ones straight to STOPPED.

    Runs inside the batch's transaction, under the owners' account locks, after the batch charged their
    running instances up to `now`.
    """
    stopped = transitions.bulk_stop(
        Instance.objects.filter(user_id__in=user_ids),
        reason=StopReason.CREDITS_EXHAUSTED,
        message="Your credits ran out, so DevCloud stopped this instance. Add credits to launch again.",
        now=now,
    )
    result.stopping_ids.extend(stopped.stopping_ids)
    result.stopped_queued_ids.extend(stopped.stopped_queued_ids)


def account_locked(user_id) -> CreditAccount:
    """Lock and return a user's account, creating it first if needed. Call inside transaction.atomic()."""
    account_for_id(user_id)
    return CreditAccount.objects.select_for_update().get(user_id=user_id)


def account_for_id(user_id) -> CreditAccount:
    account, _ = CreditAccount.objects.get_or_create(user_id=user_id)
    return account
