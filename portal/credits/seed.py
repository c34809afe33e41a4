"""The programs every install starts with: the early-registrant grant and ROCm Star.

Used by migration 0003 (with the historical models it is given) and by the tests, which restore them
after a transactional test empties the database.
"""

from datetime import datetime, timezone

from django.conf import settings


def seed_programs(SignupGrantProgram, BonusProgram) -> None:
    """Create the seeded programs if they are missing; never changes existing ones."""
    open_until = None
    if settings.SIGNUP_GRANT_OPEN_UNTIL:
        open_until = datetime.fromisoformat(settings.SIGNUP_GRANT_OPEN_UNTIL)
        if open_until.tzinfo is None:
            open_until = open_until.replace(tzinfo=timezone.utc)
    SignupGrantProgram.objects.get_or_create(
        name="Early-registrant grant",
        defaults={
            "gpu_seconds": settings.SIGNUP_GRANT_GPU_HOURS * 3600,
            "max_accounts": settings.SIGNUP_GRANT_MAX_ACCOUNTS,
            "open_until": open_until,
        },
    )
    BonusProgram.objects.get_or_create(
        slug="rocm-star",
        defaults={
            "name": "ROCm Star developer certificate",
            "description": "Earned the ROCm Star developer certificate? Give its ID or link and get up to 50 bonus GPU-hours.",
            "evidence_label": "Certificate ID or URL",
            "max_gpu_seconds": 50 * 3600,
        },
    )
