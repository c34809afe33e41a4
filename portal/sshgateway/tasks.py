"""Celery tasks of the SSH gateway: keep the owner's keys inside running instances current."""

from celery import shared_task

from . import services


@shared_task(name="sshgateway.push_keys", ignore_result=True, soft_time_limit=120, time_limit=150)
def push_keys(user_id: int) -> int:
    return services.push_user_keys(user_id=user_id)


@shared_task(name="sshgateway.sync_keys", ignore_result=True, soft_time_limit=300, time_limit=330)
def sync_keys() -> int:
    return services.push_all_keys()
