"""Reads of the API's own: tokens, what `me` shows, and an instance's last log lines."""

from django.conf import settings

from portal.credits import selectors as credit_selectors
from portal.credits.models import LedgerEntry, hours
from portal.instances import entitlements, logs
from portal.instances import selectors as instance_selectors
from portal.instances.models import Instance, LaunchPolicy
from portal.sshgateway import host_key

from .models import ApiToken

# The user inside every instance, as the images create it.
INSTANCE_USER = "developer"
MAX_LOG_LINES = 1000


def tokens_of(user):
    """The user's tokens, newest first, revoked and expired ones included (the page marks them)."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def ledger_of(user):
    """All of the user's ledger entries, newest first, for the API to paginate (the dashboard shows the
    latest few through portal.credits.selectors.ledger_for)."""
    return LedgerEntry.objects.filter(account__user=user).order_by("-created_at", "-id")


def ssh_access() -> dict:
    """How to reach an instance over SSH: the gateway `ssh -J` jumps through, its host key (known_hosts
    lines and fingerprint, None with a note while the gateway has none), and the user inside."""
    host = getattr(settings, "SSH_GATEWAY_HOST", "127.0.0.1")
    port = getattr(settings, "SSH_GATEWAY_PORT", 2222)
    jump = f"{host}:{port}"
    key = host_key.published_key(private_path=settings.SSH_GATEWAY_HOST_KEY, host=host, port=port)
    return {
        "gateway_host": host,
        "gateway_port": port,
        "proxy_jump": jump,
        "host_key": key.known_hosts or None,
        "host_key_fingerprint": key.fingerprint or None,
        "host_key_note": key.note,
        "user": INSTANCE_USER,
        "example": f"ssh -J {jump} {INSTANCE_USER}@<instance short id>",
    }


def account_summary(user, *, token: ApiToken | None) -> dict:
    """What GET /api/v1/me returns: balance, entitlements (tier and sizes) and limits."""
    policy = LaunchPolicy.current()
    tier = entitlements.tier_of(user)
    balance = credit_selectors.balance_for(user)
    live = Instance.objects.filter(user=user, state__in=instance_selectors.BURNING_STATES).count()
    return {
        "email": user.email,
        "email_verified": user.email_verified,
        "suspended": user.is_suspended,
        "suspension": user.suspension_notice,
        "balance_gpu_seconds": balance,
        "balance_gpu_hours": hours(balance),  # four decimals when two would show nothing
        "held_gpu_seconds": instance_selectors.held_gpu_seconds(user=user),
        "entitlements": {"tier": tier, "sizes": entitlements.allowed_sizes(user, policy, tier=tier)},
        "limits": {
            "max_live_instances": policy.max_live_instances,
            "live_instances": live,
            "launch_min_credit_minutes": settings.LAUNCH_MIN_CREDIT_MINUTES,
            "bonus_cap_gpu_hours": settings.BONUS_CAP_GPU_HOURS,
        },
        "token": (
            {"name": token.name, "scope": token.scope, "expires_at": token.expires_at}
            if token is not None
            else None
        ),
        "ssh": ssh_access(),
    }


def instance_log_lines(instance: Instance, *, lines: int) -> tuple[list[str], str]:
    """The last `lines` lines the instance printed, with its Jupyter token hidden, read by a worker
    (portal/instances/logs.py). Returns (lines, note), where note says why there are none."""
    return logs.log_lines(instance, lines=lines)
