"""Who may launch what: the operators' LaunchPolicy applied to one person, with reasons they can act on.

A person's tier is derived, never stored: "free" until one of their bonus applications is approved by an
operator or by a certificate list that names them as the holder, "bonus" after. A certificate list
trusted on bare IDs grants hours but not the tier: whoever knows or guesses a listed ID gets those.
Each tier opens the sizes the policy lists for it, and an operator can open more sizes to one person
(User.extra_sizes). A suspended account launches nothing.

instance_launch enforces these rules and the launch page shows the same refusals before anyone
clicks; both call the functions here, so the page and the service never disagree.
"""

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.urls import reverse

from portal.audit.services import audit_record
from portal.credits.models import BonusApplication, BonusProgram

from .models import LaunchPolicy
from .sizes import SIZES, Size

TIER_FREE = "free"
TIER_BONUS = "bonus"
TIER_LABELS = {
    TIER_FREE: "Free (no approved bonus application)",
    TIER_BONUS: "Bonus (a bonus application approved by an operator or on the holder's identity)",
}

# The fields an operator may change, in the order the audit log lists them.
POLICY_FIELDS = (
    "free_sizes",
    "bonus_sizes",
    "max_live_instances",
    "max_session_hours",
    "idle_minutes",
    "idle_grace_minutes",
)
SIZE_LIST_FIELDS = ("free_sizes", "bonus_sizes")
PER_SIZE_FIELDS = ("max_session_hours", "idle_minutes")


@dataclass(frozen=True)
class Refusal:
    """Why something is not allowed, and where the person can go to change that (optional)."""

    message: str
    action_url: str = ""
    action_label: str = ""

    def __str__(self):
        return self.message


def standing_applications(user) -> list[BonusApplication]:
    """The user's pending and approved bonus applications, with their programs: what decides their tier
    and what a refusal of a bonus size tells them, in one read."""
    return list(
        BonusApplication.objects.filter(
            user_id=user.pk, status__in=(BonusApplication.Status.PENDING, BonusApplication.Status.APPROVED)
        ).select_related("program")
    )


def tier_of(user, *, applications: list[BonusApplication] | None = None) -> str:
    """TIER_BONUS when one of the user's bonus applications was approved by an operator or on the listed
    holder's identity (BonusApplication.VOUCHED_BASES), else TIER_FREE. `applications`
    (standing_applications()), when the caller already has them, saves reading them."""
    if applications is None:
        applications = standing_applications(user)
    vouched = any(
        application.status == BonusApplication.Status.APPROVED
        and application.approval_basis in BonusApplication.VOUCHED_BASES
        for application in applications
    )
    return TIER_BONUS if vouched else TIER_FREE


def tier_sizes(policy: LaunchPolicy, tier: str) -> list[str]:
    """Size keys `policy` opens to everyone in `tier`, in catalogue order."""
    opened = set(policy.free_sizes) | (set(policy.bonus_sizes) if tier == TIER_BONUS else set())
    return [key for key in SIZES if key in opened]


def allowed_sizes(user, policy: LaunchPolicy, *, tier: str | None = None) -> list[str]:
    """Size keys the user may launch under `policy` (their tier's and their own extra sizes), in
    catalogue order, suspension aside."""
    opened = set(tier_sizes(policy, tier or tier_of(user))) | set(user.extra_sizes or [])
    return [key for key in SIZES if key in opened]


def suspension_refusal(user) -> Refusal | None:
    """The refusal every launch of a suspended user gets; None when the account is not suspended."""
    return Refusal(user.suspension_notice) if user.is_suspended else None


def open_program_names() -> list[str]:
    """Names of the bonus programs taking applications, in name order."""
    return list(BonusProgram.objects.filter(is_active=True).values_list("name", flat=True))


def size_refusal(
    user,
    size: Size,
    policy: LaunchPolicy,
    *,
    tier: str | None = None,
    open_programs: list[str] | None = None,
    applications: list[BonusApplication] | None = None,
) -> Refusal | None:
    """Why the policy keeps `size` closed to `user`, and how to open it; None when it is open. `tier`,
    `open_programs` (open_program_names()) and `applications` (standing_applications()), when the caller
    already has them, save reading them again."""
    tier = tier or tier_of(user, applications=applications)
    if size.key in allowed_sizes(user, policy, tier=tier):
        return None
    if size.key not in policy.bonus_sizes:
        return Refusal(f"{size.name} is not open to accounts right now. Contact support if you need it.")
    opens = f"{size.name} opens once an operator approves one of your bonus-hour applications"
    bonus_page = reverse("credits:bonus")
    if applications is None:
        applications = standing_applications(user)
    pending = next((a for a in applications if a.status == BonusApplication.Status.PENDING), None)
    if pending is not None:
        return Refusal(
            f"{opens}; yours for {pending.program.name} is waiting for review.",
            bonus_page,
            "See your applications",
        )
    bare = next(
        (
            a
            for a in applications
            if a.status == BonusApplication.Status.APPROVED
            and a.approval_basis == BonusApplication.ApprovalBasis.BARE_ID
        ),
        None,
    )
    if bare is not None:
        return Refusal(
            f"{opens}; yours for {bare.program.name} was approved from the certificate list alone, which "
            f"adds bonus hours but does not open {size.name}. Contact support to have it reviewed."
        )
    programs = open_program_names() if open_programs is None else open_programs
    if not programs:
        return Refusal(f"{opens}; no bonus program is taking applications right now.")
    return Refusal(
        f"{opens}: apply through the {' or '.join(programs)} program.", bonus_page, "Apply for bonus hours"
    )


def live_limit_refusal(live_count: int, limit: int) -> Refusal | None:
    """The refusal for one more launch when `live_count` instances are queued, starting or running and
    the policy allows `limit` (its max_live_instances); None when there is room."""
    if live_count < limit:
        return None
    return Refusal(
        f"You already have {live_count} instances running or starting; the limit is {limit} at once. "
        "Stop one to launch another."
    )


def session_limit_text(size: Size, policy: LaunchPolicy) -> str:
    """How long an instance of `size` may run and when an idle one stops, in one sentence ('' if neither)."""
    parts = []
    max_hours = policy.max_session_hours_for(size.key)
    if max_hours:
        parts.append(f"Instances at this size stop after {max_hours} hour{'s' if max_hours != 1 else ''}")
    idle = policy.idle_minutes_for(size.key)
    if idle:
        grace = policy.idle_grace_minutes
        parts.append(f"an idle one is warned after {idle} minutes and stopped {grace} minutes later")
    if not parts:
        return ""
    sentence = "; ".join(parts)
    return sentence[0].upper() + sentence[1:] + ". Your files in /workspace are kept."


def launch_access(user, policy: LaunchPolicy | None = None) -> dict:
    """For the operator's user page: the tier, the sizes open to the user and why, and any suspension."""
    policy = policy or LaunchPolicy.current()
    tier = tier_of(user)
    return {
        "tier": tier,
        "tier_label": TIER_LABELS[tier],
        "sizes": allowed_sizes(user, policy, tier=tier),
        "tier_sizes": tier_sizes(policy, tier),
        "extra_sizes": list(user.extra_sizes or []),
        "suspended": user.is_suspended,
    }


# --- Changing the policy ------------------------------------------------------------------------------


def _clean_policy_values(values: dict) -> dict:
    """Normalise what an operator entered; raises ValidationError naming the first bad value."""
    unknown = set(values) - set(POLICY_FIELDS)
    if unknown:
        raise ValueError(f"Not launch policy fields: {', '.join(sorted(unknown))}.")
    cleaned = {}
    for field, value in values.items():
        if field in SIZE_LIST_FIELDS:
            bad = [key for key in value if key not in SIZES]
            if bad:
                raise ValidationError(f"Unknown size {bad[0]!r} in {field}.")
            cleaned[field] = [key for key in SIZES if key in value]
        elif field in PER_SIZE_FIELDS:
            bad = [key for key in value if key not in SIZES]
            if bad:
                raise ValidationError(f"Unknown size {bad[0]!r} in {field}.")
            if any(int(number) < 0 for number in value.values()):
                raise ValidationError(f"{field} cannot be negative (0 means no limit).")
            cleaned[field] = {key: int(value[key]) for key in SIZES if key in value}
        else:
            if int(value) < 0:
                raise ValidationError(f"{field} cannot be negative.")
            cleaned[field] = int(value)
    return cleaned


def launch_policy_update(*, actor, reason: str, **values) -> tuple[LaunchPolicy, dict]:
    """Change the launch policy fields given in `values` (see POLICY_FIELDS) and audit the change.

    Returns (policy, changes), where changes maps each field that really changed to {"old", "new"};
    nothing is saved or audited when nothing changed. The audit entry ("setting.change") carries the
    same old and new values and the operator's reason, in the same transaction as the change.

    Raises PermissionDenied unless `actor` is staff, ValidationError for a blank reason, an unknown
    size or a negative number, and ValueError for a field that is not part of the policy.
    """
    if actor is None or not actor.is_staff:
        raise PermissionDenied("Only operators change the launch policy.")
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Say why you are changing the launch policy; the audit log keeps it.")
    cleaned = _clean_policy_values(values)
    LaunchPolicy.current()
    with transaction.atomic():
        policy = LaunchPolicy.objects.select_for_update().get(pk=LaunchPolicy.SINGLETON_PK)
        changes = {
            field: {"old": getattr(policy, field), "new": value}
            for field, value in cleaned.items()
            if getattr(policy, field) != value
        }
        if not changes:
            return policy, {}
        for field, change in changes.items():
            setattr(policy, field, change["new"])
        policy.save()
        audit_record(
            actor=actor,
            action="setting.change",
            target=policy,
            reason=reason,
            details={"setting": "launch policy", "changes": changes},
        )
    return policy, changes
