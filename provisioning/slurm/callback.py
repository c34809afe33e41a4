"""The job's report of where it runs: POST /slurm/jobs/<instance uuid>/report from the node.

The batch script (provisioning/slurm/job.py) sends {"node", "jupyter_port", "ssh_port", "job_id"} with
`Authorization: Bearer <token>` once the job starts, and again every few seconds while it runs, with
"gpu_busy" (gpu_busy_percent of each of the job's own GPUs, read on the node). Each report is a sighting
of the job on its node; where the token is an HMAC of the instance id under the portal's
SECRET_KEY: only the job DevCloud submitted for that instance knows it (it travels in the job's
environment, which Slurm shows to the job's user and root only, and the script removes it before the
container starts). The report only says where the job listens; the gateways still reach that address
with the instance's own credentials, and only while the instance is live.
"""

import hashlib
import hmac
import json
import re
import uuid

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ..models import SlurmJob

NODE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def callback_token(instance_id) -> str:
    """The bearer token the job of `instance_id` reports with."""
    message = f"devcloud slurm job report {instance_id}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


class ReportRefused(Exception):
    """A report DevCloud does not take: `status` is the HTTP status to answer, the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _port(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ReportRefused(400, "jupyter_port and ssh_port must be port numbers (ssh_port 0 for none).")
    return value


def job_report(*, instance_id, token: str, report: dict) -> SlurmJob:
    """Records where the job of `instance_id` runs. Returns the SlurmJob.

    Raises ReportRefused: 403 for a wrong token, 404 when DevCloud submitted no such job (or it ended),
    409 when the report names another job than the one DevCloud submitted, 400 for a malformed report.
    """
    if not hmac.compare_digest(token, callback_token(instance_id)):
        raise ReportRefused(403, "The report's token is not this instance's.")
    node, job_id = report.get("node"), report.get("job_id")
    if not isinstance(node, str) or not NODE_NAME.match(node):
        raise ReportRefused(400, "node must be the Slurm node's name.")
    jupyter_port, ssh_port = _port(report.get("jupyter_port")), _port(report.get("ssh_port") or 0)
    if not jupyter_port:
        raise ReportRefused(400, "jupyter_port must be the port JupyterLab listens on.")
    try:
        job_id = int(job_id)
    except (TypeError, ValueError):
        raise ReportRefused(400, "job_id must be the Slurm job id.") from None
    busy = report.get("gpu_busy") or {}
    if not isinstance(busy, dict) or not all(
        value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 100)
        for value in busy.values()
    ):
        raise ReportRefused(400, "gpu_busy must map each GPU to its busy percent (0-100) or null.")
    record = SlurmJob.objects.filter(instance_id=instance_id, ended_at__isnull=True).first()
    if record is None:
        raise ReportRefused(404, "DevCloud has no live Slurm job for this instance.")
    if record.job_id not in (None, job_id):
        raise ReportRefused(409, f"This instance's job is {record.job_id}, not {job_id}.")
    now = timezone.now()
    changes = {"last_seen_running_at": now}
    if record.reported_at is None or (record.node, record.jupyter_port) != (node, jupyter_port):
        changes.update(job_id=job_id, node=node, address=None, jupyter_port=jupyter_port,
                       ssh_port=ssh_port or None, reported_at=now)
    if busy:
        readings = [value for value in busy.values() if value is not None]
        changes["gpu_busy_percent"] = max(readings) if readings else None
    SlurmJob.objects.filter(pk=record.pk).update(**changes)
    if "reported_at" in changes:
        report_signal(instance_id)
    record.refresh_from_db()
    return record


# The start waiting for a job's report (provisioning/drivers/slurm.py) blocks on this Redis list instead of
# reading the job's row over and over: a burst of launches polling was CPU their own jobs' start needed.
REPORT_SIGNAL_KEEP_SECONDS = 300


def report_signal_key(instance_id) -> str:
    return f"devcloud:slurm-reported:{instance_id}"


def report_signal(instance_id) -> None:
    """Wakes the start waiting for this instance's report. A Redis that does not answer is no error: the
    start also reads the job's row once a second."""
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
        with client.pipeline() as pipe:
            pipe.rpush(report_signal_key(instance_id), "reported")
            pipe.expire(report_signal_key(instance_id), REPORT_SIGNAL_KEEP_SECONDS)
            pipe.execute()
    except (redis.RedisError, OSError):
        pass


@csrf_exempt
@require_POST
def job_report_view(request, instance_id: uuid.UUID):
    """The endpoint the job calls; answers 204, or the refusal's status with {"detail": why}."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    try:
        if scheme.lower() != "bearer" or not token:
            raise ReportRefused(401, "Send the job's token as `Authorization: Bearer <token>`.")
        try:
            report = json.loads(request.body or b"{}")
        except ValueError:
            raise ReportRefused(400, "The report must be JSON.") from None
        if not isinstance(report, dict):
            raise ReportRefused(400, "The report must be a JSON object.")
        job_report(instance_id=instance_id, token=token.strip(), report=report)
    except ReportRefused as refused:
        return JsonResponse({"detail": refused.message}, status=refused.status)
    return HttpResponse(status=204)
