"""Work a web request needs done by a worker, waited for: a question to an engine that the web process has
no way to (deploy/systemd/devcloud-web.service hides the Docker socket from it).

The web publishes the task with one more argument, the name of a Redis list of the request's own, and
waits on that list (BLPOP) at most `seconds`; the task answers with `reply`. Under eager Celery (tests, a
portal without workers) the task runs in this process and its return value is the answer.

    answer = ask_worker(some_task, args=[host_id], seconds=20)     # the web's half
    return reply(reply_to, {"version": "..."})                     # the task's half
"""

import json
import uuid

import redis
from django.conf import settings

from .tasks import publish

# How long an unread answer stays in Redis (the request that asked gave up on it).
REPLY_KEEP_SECONDS = 60


class NoAnswer(Exception):
    """No worker answered: the task queue did not take the task (`published` False), or no worker
    answered within `seconds`."""

    def __init__(self, message: str, *, published: bool, seconds: float):
        super().__init__(message)
        self.message = message
        self.published = published
        self.seconds = seconds


def ask_worker(task, *, args=(), seconds: float):
    """Runs `task(*args, reply_to)` on a worker and returns its answer (whatever JSON it sent).

    Raises NoAnswer when the queue is unreachable or no answer comes within `seconds`; under eager
    Celery, whatever the task raises.
    """
    if task.app.conf.task_always_eager:
        # Nothing blocks here: the task has already run. Celery's guard against waiting inside a task is
        # process-wide, so it would trip whenever another thread happens to be running a task eagerly.
        return task.apply(args=[*args, ""]).get(disable_sync_subtasks=False)
    reply_to = f"devcloud:reply:{task.name}:{uuid.uuid4().hex}"
    if not publish(task, args=[*args, reply_to]):
        raise NoAnswer(f"the task queue did not take {task.name}", published=False, seconds=seconds)
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=seconds + 5)
        # BLPOP takes whole seconds (0 would wait forever).
        answer = client.blpop([reply_to], timeout=max(1, round(seconds)))
    except (redis.RedisError, OSError):
        answer = None
    if answer is None:
        raise NoAnswer(f"no worker answered {task.name} within {seconds:g} s", published=True, seconds=seconds)
    return json.loads(answer[1])


def reply(reply_to: str, answer):
    """The task's half: pushes `answer` (JSON-serialisable) onto `reply_to` for the waiting request, or
    does nothing when there is none (eager mode). Returns `answer`."""
    if reply_to:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5)
        with client.pipeline() as pipe:
            pipe.rpush(reply_to, json.dumps(answer))
            pipe.expire(reply_to, REPLY_KEEP_SECONDS)
            pipe.execute()
    return answer
