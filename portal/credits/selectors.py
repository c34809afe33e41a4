"""Reads for credit pages and the console. Nothing here writes."""

from dataclasses import dataclass

from django.db.models import Count

from portal.instances.sizes import SIZES, Size

from .models import BonusApplication, BonusProgram, CreditAccount, LedgerEntry, SignupGrantProgram


# The dashboard shows the latest few movements and links to the whole history, a page at a time.
DASHBOARD_LEDGER_ROWS = 10
HISTORY_PAGE_ROWS = 50


def ledger_for(user, limit: int = DASHBOARD_LEDGER_ROWS):
    """The user's latest ledger entries, newest first, each with its account (the current balance) read in
    the same query."""
    return ledger_of(user).select_related("account")[:limit]


def ledger_of(user):
    """Every ledger entry of the user, newest first (for paging through)."""
    return LedgerEntry.objects.filter(account__user=user).order_by("-created_at", "-id")


def applications_for(user):
    return BonusApplication.objects.filter(user=user).select_related("program")


def open_programs():
    return BonusProgram.objects.filter(is_active=True)


def account_of(user) -> CreditAccount | None:
    """The user's credit account, or None before their first ledger entry."""
    return CreditAccount.objects.filter(user=user).first()


def balance_for(user) -> int:
    """Balance in GPU-seconds; 0 for someone who never had an entry."""
    account = account_of(user)
    return account.balance_gpu_seconds if account else 0


def current_signup_program() -> SignupGrantProgram | None:
    return SignupGrantProgram.objects.filter(is_active=True).order_by("-id").first()


def application_counts_for(user) -> dict[str, int]:
    """{"pending": n, "approved": n, "rejected": n} for the user's bonus applications."""
    counts = dict.fromkeys(BonusApplication.Status.values, 0)
    rows = BonusApplication.objects.filter(user=user).values("status").annotate(n=Count("id"))
    for row in rows:
        counts[row["status"]] = row["n"]
    return counts


@dataclass(frozen=True)
class SizeOffer:
    size: Size
    # Wall-clock seconds the balance lasts at this size (balance / GPUs); 0 when empty or negative.
    runway_seconds: int

    @property
    def runway(self) -> str:
        """e.g. '3 h 07 min'; '0 min' when the balance cannot pay for a minute."""
        minutes = self.runway_seconds // 60
        if minutes < 60:
            return f"{minutes} min"
        return f"{minutes // 60} h {minutes % 60:02d} min"


def size_offers(balance_gpu_seconds: int) -> list[SizeOffer]:
    return [SizeOffer(size, max(balance_gpu_seconds, 0) // size.gpus) for size in SIZES.values()]


def applications_naming_same_id(application) -> list[BonusApplication]:
    """Every other application, of any person and program, naming the certificate ID `application`
    names, oldest first; [] when it names none. A certificate ID is personal: several names on one is
    sharing or guessing."""
    if not application.certificate_id:
        return []
    return list(
        BonusApplication.objects.filter(certificate_id=application.certificate_id)
        .exclude(pk=application.pk)
        .select_related("user", "program")
        .order_by("created_at", "pk")
    )
