"""Reads for account pages."""

from .models import SshKey, User


def github_account_for(user: User):
    """The user's GitHub link (a social_django UserSocialAuth), or None."""
    return user.social_auth.filter(provider="github").first()


def ssh_keys_for(user: User):
    return SshKey.objects.filter(user=user).order_by("created_at", "id")


def active_user_by_pk(pk) -> User | None:
    """The active account with primary key `pk`, or None (deleted accounts are inactive)."""
    return User.objects.filter(pk=pk, is_active=True).first()
