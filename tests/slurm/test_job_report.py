"""The job's report of where it runs: only the job DevCloud submitted for an instance can say where that
instance listens. An attacker who can reach the portal, or a tenant's job, cannot redirect an instance's
gateway traffic to an address of their choosing."""

import json
import threading
import time
import uuid
from dataclasses import replace
from types import SimpleNamespace

import pytest
from django.db import connection

from provisioning.drivers import driver_for
from provisioning.drivers import slurm as slurm_driver
from provisioning.drivers.base import DriverError, NotPlacedYet
from provisioning.models import GpuHost, SlurmCluster, SlurmJob
from provisioning.slurm.callback import callback_token
from provisioning.slurm.rest import Job, Node


@pytest.fixture
def submitted(db):
    cluster = SlurmCluster.objects.create(
        name="hpc",
        rest_url="http://127.0.0.1:1",
        rest_user="devcloud",
        token_sealed="",
        image_root="/srv/img",
        workspace_root="/srv/ws",
        job_root="/srv/jobs",
        callback_url="http://127.0.0.1:8000",
    )
    host = GpuHost.objects.create(
        name="hpc/gpu", backend="slurm", slurm_cluster=cluster, slurm_partition="gpu"
    )
    return SlurmJob.objects.create(instance_id=uuid.uuid4(), host=host, name="devcloud-x", job_id=41)


def report(client, instance_id, body, token=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return client.post(
        f"/slurm/jobs/{instance_id}/report", data=json.dumps(body), content_type="application/json", **headers
    )


REPORT = {"node": "n1", "jupyter_port": 40001, "ssh_port": 40002, "job_id": 41}


def test_it_records_the_node_and_ports_the_instances_own_job_reports(client, submitted):
    answer = report(client, submitted.instance_id, REPORT, callback_token(submitted.instance_id))

    submitted.refresh_from_db()
    assert answer.status_code == 204
    assert (submitted.node, submitted.jupyter_port, submitted.ssh_port) == ("n1", 40001, 40002)
    assert submitted.reported_at is not None


def test_a_report_without_the_token_says_how_to_send_it(client, submitted):
    answer = report(client, submitted.instance_id, REPORT)

    assert answer.status_code == 401
    assert "Authorization: Bearer" in answer.json()["detail"]
    submitted.refresh_from_db()
    assert submitted.reported_at is None


def test_another_instances_token_cannot_redirect_this_instance(client, submitted):
    # A tenant's own job knows its own token; it must not move someone else's endpoint.
    their_token = callback_token(uuid.uuid4())

    answer = report(client, submitted.instance_id, {**REPORT, "node": "attacker"}, their_token)

    assert answer.status_code == 403
    submitted.refresh_from_db()
    assert submitted.node == ""


def test_a_report_naming_another_job_is_refused(client, submitted):
    answer = report(
        client, submitted.instance_id, {**REPORT, "job_id": 99}, callback_token(submitted.instance_id)
    )

    assert answer.status_code == 409
    submitted.refresh_from_db()
    assert submitted.node == ""


def test_an_ended_job_cannot_report_again(client, submitted):
    from django.utils import timezone

    SlurmJob.objects.filter(pk=submitted.pk).update(ended_at=timezone.now())

    answer = report(client, submitted.instance_id, REPORT, callback_token(submitted.instance_id))

    assert answer.status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {**REPORT, "node": "n1; rm -rf /"},
        {**REPORT, "jupyter_port": 70000},
        {**REPORT, "jupyter_port": "40001"},
        {**REPORT, "job_id": "forty-one"},
        ["not", "an", "object"],
    ],
)
def test_a_malformed_report_is_refused_and_changes_nothing(client, submitted, body):
    answer = report(client, submitted.instance_id, body, callback_token(submitted.instance_id))

    assert answer.status_code == 400
    submitted.refresh_from_db()
    assert submitted.reported_at is None


def test_each_report_is_a_sighting_with_the_gpus_use_read_on_the_node(client, submitted):
    from provisioning import hostfs

    token = callback_token(submitted.instance_id)
    report(client, submitted.instance_id, REPORT, token)
    first = SlurmJob.objects.get(pk=submitted.pk).last_seen_running_at

    answer = report(
        client, submitted.instance_id, {**REPORT, "gpu_busy": {"renderD128": 3, "renderD136": 87}}, token
    )

    submitted.refresh_from_db()
    assert answer.status_code == 204
    assert submitted.last_seen_running_at > first
    assert submitted.gpu_busy_percent == 87
    assert hostfs.instances_gpu_busy([submitted.instance_id]) == {submitted.instance_id: 87}


def test_a_reading_older_than_three_heartbeats_says_nothing_about_now(client, submitted, settings):
    from datetime import timedelta

    from django.utils import timezone

    from provisioning import hostfs

    report(
        client,
        submitted.instance_id,
        {**REPORT, "gpu_busy": {"renderD128": 90}},
        callback_token(submitted.instance_id),
    )
    stale = timezone.now() - timedelta(seconds=3 * settings.SLURM_JOB_HEARTBEAT_SECONDS + 1)
    SlurmJob.objects.filter(pk=submitted.pk).update(last_seen_running_at=stale)

    assert hostfs.instances_gpu_busy([submitted.instance_id]) == {submitted.instance_id: None}


@pytest.mark.parametrize("busy", [{"renderD128": 101}, {"renderD128": "90"}, ["renderD128"]])
def test_a_gpu_reading_that_is_not_a_percent_is_refused(client, submitted, busy):
    answer = report(
        client, submitted.instance_id, {**REPORT, "gpu_busy": busy}, callback_token(submitted.instance_id)
    )

    assert answer.status_code == 400
    submitted.refresh_from_db()
    assert submitted.gpu_busy_percent is None


def test_deleting_an_account_removes_its_workspace_directory_on_the_clusters_storage(submitted, tmp_path):
    from portal.accounts.services import account_delete
    from portal.audit.models import AuditEntry
    from provisioning.workspaces import workspace_name, workspace_removals_run
    from tests.conftest import make_user

    dora = make_user("dora@example.com")
    cluster = submitted.host.slurm_cluster
    cluster.workspace_root = str(tmp_path)
    cluster.save()
    files = tmp_path / workspace_name(dora.pk)
    files.mkdir()
    (files / "notes.txt").write_text("mine")

    account_delete(user=dora)
    workspace_removals_run()

    assert not files.exists()
    assert AuditEntry.objects.filter(action="account.workspaces_removed", target_id=str(dora.pk)).exists()


def _wait_in_thread(instance_id, seconds):
    """SlurmDriver._until_reported in a thread of its own: (thread, {"reported": bool, "after": seconds,
    "queries": how many the wait made})."""
    import threading
    import time

    from django.db import connection

    from provisioning.drivers.slurm import SlurmDriver

    outcome = {"queries": 0}

    def count(execute, sql, params, many, context):
        outcome["queries"] += 1
        return execute(sql, params, many, context)

    def wait():
        started = time.monotonic()
        try:
            with connection.execute_wrapper(count):
                outcome["reported"] = SlurmDriver._until_reported(instance_id, seconds)
            outcome["after"] = time.monotonic() - started
        finally:
            connection.close()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, outcome


@pytest.mark.django_db(transaction=True)
def test_a_start_waiting_for_the_report_wakes_when_it_comes_not_at_its_next_look(client, submitted):
    thread, outcome = _wait_in_thread(submitted.instance_id, 30)

    report(client, submitted.instance_id, REPORT, callback_token(submitted.instance_id))
    thread.join(35)

    assert outcome["reported"] is True
    assert outcome["after"] < 10, outcome


@pytest.mark.django_db(transaction=True)
def test_without_redis_the_start_still_sees_the_report(client, submitted, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    thread, outcome = _wait_in_thread(submitted.instance_id, 30)

    report(client, submitted.instance_id, REPORT, callback_token(submitted.instance_id))
    thread.join(35)

    assert outcome["reported"] is True
    assert outcome["after"] < 10, outcome


@pytest.mark.django_db(transaction=True)
def test_a_start_waiting_without_a_report_does_not_keep_reading_the_database(submitted):
    # A burst of launches reading their job's row twenty times a second each took CPU from the jobs.
    thread, outcome = _wait_in_thread(submitted.instance_id, 2)
    thread.join(10)

    assert outcome["reported"] is False
    assert outcome["after"] < 5, outcome
    assert outcome["queries"] <= 2, outcome


class _Slurmrestd:
    """slurmrestd's answers about the one job: `job` as it stands, and the node it runs on."""

    def __init__(self, job):
        self.answer = job
        self.asked = 0

    def job(self, job_id):
        self.asked += 1
        return self.answer

    def nodes(self):
        return [
            Node(name="n1", address="10.0.0.7", state="ALLOCATED", gres="", gres_used="", partitions=["gpu"])
        ]


def _start_wait(submitted, job, slurmrestd=None):
    """The driver's wait for the job's report, as a start does it after submitting."""
    driver = driver_for(submitted.host)
    spec = SimpleNamespace(instance_id=submitted.instance_id, image_reference="devcloud/cpu:test")
    return driver._wait_for_report(slurmrestd or _Slurmrestd(job), spec, job, lambda line: None)


@pytest.mark.django_db(transaction=True)
def test_a_job_that_already_runs_is_waited_for_past_the_hand_back_time_not_handed_back(
    client, submitted, monkeypatch
):
    # In a loaded burst a running job may take longer than the start's own wait to report; handing it
    # back then left its report waiting for the lifecycle's next ask, seconds later.
    monkeypatch.setattr(slurm_driver, "START_WAIT_SECONDS", 0.5)
    monkeypatch.setattr(slurm_driver, "JOB_POLL_SECONDS", 0.2)
    running = Job(
        job_id=41, name="devcloud-x", state="RUNNING", reason="None", nodes="n1", start_time=int(time.time())
    )

    def reports_late():
        try:
            report(client, submitted.instance_id, REPORT, callback_token(submitted.instance_id))
        finally:
            connection.close()

    late = threading.Timer(1.5, reports_late)
    late.start()
    try:
        result = _start_wait(submitted, running)
    finally:
        late.join()

    assert result.endpoint == "http://10.0.0.7:40001"
    assert result.state["ssh_port"] == 40002


@pytest.mark.django_db(transaction=True)
def test_a_job_slurm_still_holds_is_handed_back_after_the_starts_wait(submitted, monkeypatch):
    monkeypatch.setattr(slurm_driver, "START_WAIT_SECONDS", 0.5)
    monkeypatch.setattr(slurm_driver, "JOB_POLL_SECONDS", 0.2)
    pending = Job(job_id=41, name="devcloud-x", state="PENDING", reason="Resources", nodes="")

    with pytest.raises(NotPlacedYet, match="waiting for GPUs"):
        _start_wait(submitted, pending)


@pytest.mark.django_db(transaction=True)
def test_a_start_waiting_for_its_job_asks_slurm_less_and_less_often(submitted, monkeypatch):
    # Each ask is an RPC to slurmctld, which schedules the whole cluster: a launch asking once a second
    # for as long as its job waits is load an operator sees on the controller.
    monkeypatch.setattr(slurm_driver, "START_WAIT_SECONDS", 3.0)
    monkeypatch.setattr(slurm_driver, "JOB_POLL_SECONDS", 0.1)
    monkeypatch.setattr(slurm_driver, "JOB_POLL_MAX_SECONDS", 0.8)
    slurmrestd = _Slurmrestd(Job(job_id=41, name="devcloud-x", state="PENDING", reason="Resources", nodes=""))

    with pytest.raises(NotPlacedYet):
        _start_wait(submitted, slurmrestd.answer, slurmrestd)

    # Asked after 0.1, 0.3, 0.7, 1.5, 2.3 and 3.0 s; once every 0.1 s it would have been 30 times.
    assert slurmrestd.asked <= 7, slurmrestd.asked


@pytest.mark.django_db(transaction=True)
def test_a_job_that_ends_before_reporting_fails_the_start_within_the_longest_gap(submitted, monkeypatch):
    monkeypatch.setattr(slurm_driver, "START_WAIT_SECONDS", 20.0)
    monkeypatch.setattr(slurm_driver, "JOB_POLL_SECONDS", 0.1)
    monkeypatch.setattr(slurm_driver, "JOB_POLL_MAX_SECONDS", 0.4)
    running = Job(
        job_id=41, name="devcloud-x", state="RUNNING", reason="None", nodes="n1", start_time=int(time.time())
    )
    slurmrestd = _Slurmrestd(running)
    threading.Timer(1.0, lambda: setattr(slurmrestd, "answer", replace(running, state="FAILED"))).start()
    started = time.monotonic()

    with pytest.raises(DriverError, match="ended before JupyterLab answered: FAILED") as failed:
        _start_wait(submitted, running, slurmrestd)

    assert failed.value.permanent
    # Noticed at the next ask (0.4 s apart by then), not when the start's 20 s wait is up.
    assert time.monotonic() - started < 5, time.monotonic() - started
