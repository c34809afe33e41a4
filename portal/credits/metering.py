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
- The paying account is the project's pool for an instance launched for a project (Instance.project),
  and the owner's own account otherwise (`payer_of`). Ticks batch and lock by paying account.
- After charging, every live instance paid by an account whose balance is at or below zero is stopped
  with stop_reason credits_exhausted, through the bulk stop in portal/instances/transitions.py: a
  project's pool running dry stops the project's instances, never its members' personal ones.
- Once a batch has committed, owners of personal accounts get the credit warnings (about 1 hour or 10
  minutes left at their running GPUs' burn), and whoever launched a stopped instance gets the "stopped:
  credits ran out" email, each once per event. Project pools get no runway warnings.

Lock order everywhere: the paying CreditAccount rows in id order, then the Instance rows (launch and
stop follow it too).
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Case, F, IntegerField, Q, Sum, Value, When
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

# Instances charged per transaction. Each batch takes its paying accounts' locks for one short
# transaction; the instances one account pays for always fall in the same batch.
BATCH_SIZE = 1000


def payer_of(*, user_id, project_id) -> CreditAccount:
    """The account that pays for an instance launched by `user_id`: the pool of `project_id` when set,
    the person's own account otherwise. Creates it when missing (a pool is made with its project)."""
    if project_id is not None:
        account, _ = CreditAccount.objects.get_or_create(project_id=project_id)
    else:
        account, _ = CreditAccount.objects.get_or_create(user_id=user_id)
    return account


def paid_by(account: CreditAccount) -> Q:
    """The instances `account` pays for, as a filter on Instance."""
    if account.project_id is not None:
        return Q(project_id=account.project_id)
    return Q(user_id=account.user_id, project__isnull=True)


def payer_locked(instance) -> CreditAccount:
    """Lock and return the account paying for `instance`. Call inside transaction.atomic(), before
    locking the instance row."""
    account = payer_of(user_id=instance.user_id, project_id=instance.project_id)
    return CreditAccount.objects.select_for_update().get(pk=account.pk)


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
    caller runs inside transaction.atomic() and has locked the paying CreditAccount (payer_locked) and
    then the instance row (select_for_update), in that order. Idempotent per period through the ledger
    key, which is charged to the paying account and names the instance.
    """
    account = payer_locked(instance)
    running_gpus = (
        Instance.objects.filter(paid_by(account), state=Instance.State.RUNNING).aggregate(
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
            account=account,
            kind=LedgerEntry.Kind.USAGE,
            gpu_seconds=-charge.gpu_seconds,
            idempotency_key=usage_key(instance.id, charge.period_start),
            reason=_usage_reason(instance, charge),
            instance=instance,
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
    The caller holds the paying CreditAccount's lock and then the instance's row lock.
    """
    if instance.metered_until is None or instance.metered_until <= until:
        return charge_until(instance=instance, until=until)
    past = instance.metered_until - until
    seconds = int(past.total_seconds()) + (1 if past.total_seconds() % 1 else 0)
    refund = min(seconds * gpus_of(instance.size), instance.charged_gpu_seconds)
    if refund > 0:
        ledger_post(
            account=payer_locked(instance),
            instance=instance,
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
    metered = Instance.objects.filter(state=Instance.State.RUNNING, metered_until__isnull=False)
    # An owner without an account cannot have launched through instance_launch; make one so the charge
    # has somewhere to go rather than letting the instance run free.
    orphans = metered.filter(project__isnull=True, user__credit_account__isnull=True)
    for user_id in sorted(set(orphans.values_list("user_id", flat=True))):
        CreditAccount.objects.get_or_create(user_id=user_id)
    # Nor a project without its pool, which project_create makes with it.
    pool_less = metered.filter(project__isnull=False, project__credit_account__isnull=True)
    for project_id in sorted(set(pool_less.values_list("project_id", flat=True))):
        CreditAccount.objects.get_or_create(project_id=project_id)
    running = (
        metered.annotate(payer_id=_payer_id_expression())
        .filter(payer_id__isnull=False)
        .order_by("payer_id", "id")
        .values_list("payer_id", "id")
    )
    for batch in _batches_by_payer(running.iterator(chunk_size=5000), batch_size):
        _charge_batch(batch, now, result)
    return result


def _payer_id_expression():
    """The id of the account paying for each instance (payer_of), as SQL: joins, not a subquery per row."""
    return Case(
        When(project__isnull=False, then=F("project__credit_account__id")),
        default=F("user__credit_account__id"),
    )


def _batches_by_payer(rows, batch_size):
    """Group (account_id, instance_id) rows, sorted by account, into batches that never split an account."""
    batch: dict[int, list] = {}
    count = 0
    for account_id, paid in groupby(rows, key=lambda row: row[0]):
        ids = [instance_id for _, instance_id in paid]
        if count and count + len(ids) > batch_size:
            yield batch
            batch, count = {}, 0
        batch[account_id] = ids
        count += len(ids)
    if batch:
        yield batch


@dataclass(slots=True)
class _Metered:
    """The columns of a running instance a tick needs; cheaper than a model instance, times thousands."""

    id: object
    account_id: int
    size: str
    metered_until: datetime
    charged_gpu_seconds: int

    @property
    def short_id(self) -> str:
        return str(self.id)[:8]


def _charge_batch(batch: dict[int, list], now: datetime, result: TickResult) -> None:
    stopping_before, queued_before = len(result.stopping_ids), len(result.stopped_queued_ids)
    with transaction.atomic():
        accounts = _lock_accounts(sorted(batch))
        charge = _charge_in_database if connection.vendor == "postgresql" else _charge_in_python
        charged = charge(batch, accounts, now)
        for account_id, balance in charged.balances.items():
            accounts[account_id][1] = balance
        result.instances_charged += charged.instances_charged
        result.gpu_seconds += charged.gpu_seconds
        result.gpu_seconds_waived += charged.gpu_seconds_waived
        for instance_id, waived in charged.waived:
            logger.warning("Waived %s GPU-seconds of %s at the debt floor", waived, instance_id)

        exhausted = [account for account in accounts.values() if account[1] <= 0]
        if exhausted:
            _stop_exhausted(exhausted, now, result)

    # After the commit, so a rolled-back batch tells nobody and no email waits on the account locks.
    try:
        _notify_batch(
            owners={account_id: account[2] for account_id, account in accounts.items() if account[2]},
            balances=charged.balances,
            running_gpus=charged.running_gpus,
            stopped_ids=result.stopping_ids[stopping_before:] + result.stopped_queued_ids[queued_before:],
        )
    except Exception:
        # The charges stand and the next batches must still be charged; a lost notice is only logged.
        logger.exception("Could not notify the owners of a metering batch")


def _lock_accounts(account_ids: list[int]) -> dict[int, list]:
    """Lock these accounts, in id order like every other path that locks accounts, and return
    account id -> [account id, balance, user_id or None, project_id or None]."""
    return {
        account_id: [account_id, balance, user_id, project_id]
        for account_id, balance, user_id, project_id in CreditAccount.objects.select_for_update()
        .filter(pk__in=account_ids)
        .order_by("id")
        .values_list("id", "balance_gpu_seconds", "user_id", "project_id")
    }


@dataclass
class _BatchCharges:
    """What charging one batch did, for the tick's result and the owners' notices."""

    # account id -> balance after the charges, for the accounts charged something.
    balances: dict = field(default_factory=dict)
    # account id -> GPUs of the running instances it pays for.
    running_gpus: dict = field(default_factory=dict)
    instances_charged: int = 0
    gpu_seconds: int = 0
    gpu_seconds_waived: int = 0
    # (instance id, GPU-seconds waived at the debt floor)
    waived: list = field(default_factory=list)


# The whole batch's charge in one statement, on PostgreSQL. The same arithmetic as period_charge()
# applied instance by instance in (paying account, id) order, with the balance carried from one to the
# next: with room = balance - floor and `before` the GPU-seconds owed by the account's earlier instances,
# instance k is charged max(0, min(owed_k, room - before_k)), and the balance after it is
# balance - max(0, min(room, before_k + owed_k)). Every period ends on a whole second after
# metered_until. The ledger key and reason are usage_key() and _usage_reason() written in SQL.
# The caller holds the paying accounts' locks, taken in an earlier statement, so this statement's snapshot
# already has whatever a concurrent tick or stop committed. It also locks the instance rows (`locked`),
# in the order every other path locks them, and charges from the row versions that lock returned.
_CHARGE_SQL = """
WITH batch AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(payers)s::bigint[]) AS b(id, account_id)
),
locked AS (
    SELECT i.id, b.account_id, i.size, i.metered_until,
        -- tick_until(): a host in doubt (down, or its latest heartbeat failed) is charged only up to
        -- the moment it last answered.
        CASE WHEN h.state = %(down)s OR h.last_error <> ''
            THEN greatest(i.metered_until, least(%(now)s, coalesce(h.last_seen_at, i.metered_until)))
            ELSE %(now)s END AS charge_until
    FROM batch b JOIN {instance} i ON i.id = b.id LEFT JOIN {host} h ON h.id = i.host_id
    WHERE i.state = %(running)s AND i.metered_until IS NOT NULL
    ORDER BY b.account_id, i.id FOR UPDATE OF i
),
running AS (
    SELECT i.id, i.metered_until, a.id AS account_id, a.balance_gpu_seconds AS balance,
        coalesce(size.gpus, 0) AS gpus, coalesce(size.name, i.size) AS size_name,
        floor(extract(epoch FROM (i.charge_until - i.metered_until)))::bigint AS seconds
    FROM locked i
    JOIN {account} a ON a.id = i.account_id
    LEFT JOIN unnest(%(size_keys)s::text[], %(size_gpus)s::bigint[], %(size_names)s::text[])
        AS size(key, gpus, name) ON size.key = i.size
),
payers AS (
    SELECT account_id, sum(gpus)::bigint AS gpus FROM running GROUP BY account_id
),
owed AS (
    SELECT running.*, payers.gpus AS payer_gpus, running.seconds * running.gpus AS owed,
        running.balance + greatest(payers.gpus, 1) * %(tick)s AS room,
        (sum(running.seconds * running.gpus) OVER (
            PARTITION BY running.account_id ORDER BY running.id ROWS UNBOUNDED PRECEDING
        ))::bigint AS owed_through
    FROM running JOIN payers USING (account_id)
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
         created_at, instance_id)
    SELECT account_id, %(usage)s, -charged, balance_after,
        'usage:' || id::text || ':'
            || to_char(metered_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
            || CASE WHEN date_trunc('second', metered_until) = metered_until THEN ''
                ELSE to_char(metered_until AT TIME ZONE 'UTC', '.US') END
            || '+00:00',
        size_name || ' instance ' || left(id::text, 8) || ': ' || seconds || ' s'
            || CASE WHEN owed > charged
                THEN ' (' || (owed - charged) || ' GPU-seconds waived at the debt floor)' ELSE '' END,
        NULL, 'system', %(created_at)s, id
    FROM charges WHERE charged > 0
    ORDER BY account_id, id
),
totals AS (
    SELECT account_id, sum(charged) AS charged FROM charges GROUP BY account_id HAVING sum(charged) > 0
),
balances AS (
    UPDATE {account} a SET balance_gpu_seconds = a.balance_gpu_seconds - totals.charged,
        updated_at = %(now)s
    FROM totals WHERE a.id = totals.account_id
    RETURNING a.id AS account_id, a.balance_gpu_seconds
)
SELECT 'payer', payers.account_id::text, payers.gpus, balances.balance_gpu_seconds
    FROM payers LEFT JOIN balances USING (account_id)
UNION ALL
SELECT 'total', (count(*) FILTER (WHERE charged > 0))::text, coalesce(sum(charged), 0)::bigint,
    coalesce(sum(owed - charged), 0)::bigint
    FROM charges
UNION ALL
SELECT 'waived', id::text, owed - charged, NULL FROM charges WHERE owed > charged
"""


def _charge_in_database(batch: dict[int, list], accounts: dict, now: datetime) -> _BatchCharges:
    """Charge the running instances of the batch's accounts in one statement (see _CHARGE_SQL)."""
    sql = _CHARGE_SQL.format(
        instance=Instance._meta.db_table,
        account=CreditAccount._meta.db_table,
        ledger=LedgerEntry._meta.db_table,
        host=GpuHost._meta.db_table,
    )
    params = {
        "down": GpuHost.State.DOWN,
        "ids": [instance_id for account_id in sorted(batch) for instance_id in batch[account_id]],
        "payers": [account_id for account_id in sorted(batch) for _ in batch[account_id]],
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
            if what == "payer":
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
    """Charge the running instances of the batch's accounts with period_charge(), one by one, and write
    the result in bulk. For SQLite (`make run`'s default database); PostgreSQL runs _CHARGE_SQL."""
    payer = {instance_id: account_id for account_id, ids in batch.items() for instance_id in ids}
    rows = (
        Instance.objects.select_for_update(of=("self",))
        .filter(id__in=list(payer), state=Instance.State.RUNNING, metered_until__isnull=False)
        .order_by("id")
        .values_list(
            "id", "size", "metered_until", "charged_gpu_seconds",
            "host__state", "host__last_error", "host__last_seen_at",
        )
    )  # fmt: skip
    instances, until = [], {}
    for instance_id, *columns, host_state, host_last_error, host_last_seen_at in rows:
        instance = _Metered(instance_id, payer[instance_id], *columns)
        instances.append(instance)
        until[instance.id] = tick_until(
            now=now,
            metered_until=instance.metered_until,
            host_state=host_state,
            host_last_error=host_last_error,
            host_last_seen_at=host_last_seen_at,
        )
    instances.sort(key=lambda instance: (instance.account_id, str(instance.id)))
    charged = _BatchCharges()
    for instance in instances:
        charged.running_gpus[instance.account_id] = charged.running_gpus.get(
            instance.account_id, 0
        ) + gpus_of(instance.size)
    entries, changed = [], []
    for instance in instances:
        account = accounts[instance.account_id]
        charge = period_charge(
            instance=instance,
            until=until[instance.id],
            balance=account[1],
            floor=debt_floor(charged.running_gpus[instance.account_id]),
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
        charged.balances[instance.account_id] = account[1]
        entries.append(
            LedgerEntry(
                account_id=account[0],
                kind=LedgerEntry.Kind.USAGE,
                gpu_seconds=-charge.gpu_seconds,
                balance_after=account[1],
                idempotency_key=usage_key(instance.id, charge.period_start),
                reason=_usage_reason(instance, charge),
                actor_name="system",
                instance_id=instance.id,
            )
        )
        charged.instances_charged += 1
        charged.gpu_seconds += charge.gpu_seconds
    if entries:
        LedgerEntry.objects.bulk_create(entries, batch_size=1000)
        _save_balances([accounts[account_id] for account_id in charged.balances], now)
    if changed:
        _save_metering(changed)
    return charged


def _notify_batch(
    *, owners: dict[int, int], balances: dict[int, int], running_gpus: dict[int, int], stopped_ids: list
) -> None:
    """Tell people what a committed batch means for them: the credit warnings (about 1 hour, about 10
    minutes left at their running GPUs' burn) to the owners of personal accounts (`owners`: account id
    -> user id; a project's pool warns nobody), and the instance_stopped email to whoever launched each
    instance stopped because credits ran out. Both are once per event, so a repeated tick sends nothing
    new.

    Queries only for owners whose runway is within the widest warning and for the stopped instances:
    a tick in which nobody runs low costs no query at all.
    """
    warn_within = max(limit for _, limit in CREDIT_WARNINGS)
    # The same runway credit_warnings_check works out: balance / (GPUs x 3600) hours.
    low = {
        owners[account_id]: account_id
        for account_id, balance in balances.items()
        if account_id in owners
        and balance > 0
        and running_gpus.get(account_id)
        and balance // running_gpus[account_id] <= warn_within
    }
    if low:
        for user in get_user_model().objects.filter(pk__in=low):
            account_id = low[user.pk]
            credit_warnings_check(
                user=user,
                balance_gpu_seconds=balances[account_id],
                burn_gpu_seconds_per_hour=running_gpus[account_id] * 3600,
            )
    if stopped_ids:
        for instance in Instance.objects.filter(id__in=stopped_ids).select_related("user", "image", "project"):
            pool = {"project_name": instance.project.name} if instance.project_id else {}
            notify_instance_stopped(instance=instance, reason=StopReason.CREDITS_EXHAUSTED, **pool)


def _save_balances(balances: list, now: datetime) -> None:
    """Write [account id, balance] pairs in bulk (the SQLite path; PostgreSQL writes them in _CHARGE_SQL)."""
    CreditAccount.objects.bulk_update(
        [CreditAccount(pk=pk, balance_gpu_seconds=balance, updated_at=now) for pk, balance, *_ in balances],
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


def _stop_exhausted(accounts: list[list], now: datetime, result: TickResult) -> None:
    """Stop every live instance these accounts ([id, balance, user_id, project_id]) pay for, through the
    instance transitions' bulk stop: running and provisioning ones go to STOPPING for a teardown, queued
    ones straight to STOPPED. A project's pool stops the project's instances; a person's account stops
    their personal ones only.

    Runs inside the batch's transaction, under the accounts' locks, after the batch charged their
    running instances up to `now`.
    """
    user_ids = [user_id for _, _, user_id, _ in accounts if user_id is not None]
    project_ids = [project_id for _, _, _, project_id in accounts if project_id is not None]
    stopped = transitions.bulk_stop(
        Instance.objects.filter(Q(user_id__in=user_ids, project__isnull=True) | Q(project_id__in=project_ids)),
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
