"""Why an instance stopped: one vocabulary for the instance row, its page, its timeline and the owner's email.

A leaf module (Django only), so that notifications and provisioning can name a reason without importing
the instance services. The reason is a machine word; the person's own words (an operator's reason for a
force stop or an eviction) go in Instance.stop_note beside it.
"""

from django.db import models


class StopReason(models.TextChoices):
    USER = "user", "Stopped by its owner"
    CREDITS_EXHAUSTED = "credits_exhausted", "Credits ran out"
    OPERATOR = "operator", "Stopped by an operator"
    IDLE = "idle", "Idle"
    MAX_LENGTH = "max_length", "Reached the longest session allowed"
    DEADLINE = "deadline", "Reached the time limit its launch set"
    SUSPENDED = "suspended", "Account suspended"
    HOST_EVICTED = "host_evicted", "Host evicted by an operator"
    HOST_DOWN = "host_down", "Host stopped answering"
    ACCOUNT_DELETED = "account_deleted", "Account deleted"
    PROJECT_OWNER = "project_owner", "Stopped by an owner of its project"
    REMOVED_FROM_PROJECT = "removed_from_project", "Its owner was removed from the project"


# Reasons that come with the operator's own words in stop_note, which the owner reads.
NEEDS_NOTE = (StopReason.OPERATOR, StopReason.HOST_EVICTED)
# Longest stop_note: what an operator may type as a reason.
STOP_NOTE_MAX = 200
