"""Reads for credit pages."""

from .models import BonusApplication, BonusProgram, LedgerEntry
from .services import account_for


def ledger_for(user, limit: int = 50):
    return LedgerEntry.objects.filter(account__user=user).order_by("-created_at", "-id")[:limit]


def applications_for(user):
    return BonusApplication.objects.filter(user=user).select_related("program")


def open_programs():
    return BonusProgram.objects.filter(is_active=True)


def balance_for(user) -> int:
    return account_for(user).balance_gpu_seconds
