"""Slurm clusters as a place for instances: registration, the console's view of their nodes, the beat's
check of slurmrestd, and handing a launch to a partition.

A cluster is a SlurmCluster row; each partition DevCloud may use is a GpuHost with backend "slurm" named
<cluster>/<partition>. Slurm decides which node and GPUs a job gets; DevCloud keeps the launch policy,
credit, entitlements and billing (docs/architecture.md, "Backends").
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from portal.audit.services import audit_record
from portal.instances.models import Instance
from portal.lib.sealed import seal

from ..models import GpuHost, SlurmCluster
from .rest import SlurmAuthError, SlurmBadToken, SlurmError, SlurmRest, SlurmUnreachable

logger = logging.getLogger(__name__)


class ClusterRefused(Exception):
    """Registration (or a new token) was refused: the message says what is wrong and what to do."""

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.message = message
        # Which form field is at fault ("rest_url", "token", "partitions"...), or "" for the whole form.
        self.field = field


@dataclass
class NodeView:
    """One node as Slurm sees it, with what runs there: DevCloud's instances and everyone else's jobs."""

    name: str
    address: str
    state: str
    partitions: list[str]
    gpus: str
    gpus_used: str
    instances: list = field(default_factory=list)
    other_jobs: int = 0


def cluster_probe(*, rest_url: str, rest_user: str, token: str, partitions: list[str], gres_name: str) -> list:
    """Checks that slurmrestd answers with this token and knows the partitions, whose nodes offer the
    GRES. Returns Slurm's nodes. Raises ClusterRefused saying which check failed and what to do."""
    if not partitions:
        raise ClusterRefused("Name at least one partition DevCloud may submit to.", field="partitions")
    try:
        with SlurmRest(rest_url, user_name=rest_user, token=token, timeout=10) as rest:
            rest.ping()
            nodes = rest.nodes()
            known = {partition["name"] for partition in rest.partitions() if partition.get("name")}
    except SlurmUnreachable as error:
        raise ClusterRefused(
            f"slurmrestd does not answer at {rest_url} ({error.message}). Check the URL, and that slurmrestd "
            "runs there with JWT authentication (slurmrestd -a rest_auth/jwt).",
            field="rest_url",
        ) from error
    except (SlurmBadToken, SlurmAuthError) as error:
        raise ClusterRefused(
            f"slurmrestd refused the token for user {rest_user} ({error.message}). Make a new one on the "
            f"cluster with `scontrol token username={rest_user} lifespan=<seconds>` and paste it here.",
            field="token",
        ) from error
    except SlurmError as error:
        raise ClusterRefused(f"slurmrestd answered with an error: {error.message}", field="rest_url") from error
    known |= {partition for node in nodes for partition in node.partitions}
    unknown = [partition for partition in partitions if partition not in known]
    if unknown:
        raise ClusterRefused(
            f"The cluster has no partition named {', '.join(unknown)} (it has: {', '.join(sorted(known)) or 'none'}). "
            "Use the names `sinfo -s` lists.",
            field="partitions",
        )
    for partition in partitions:
        if not any(partition in node.partitions and gres_name in (node.gres or "") for node in nodes):
            raise ClusterRefused(
                f"No node of partition {partition} offers GRES {gres_name!r} (gres.conf and the node lines "
                "of slurm.conf name the GPUs). Check the GRES name.",
                field="gres_name",
            )
    return nodes


def cluster_register(*, actor, name: str, rest_url: str, rest_user: str, token: str, partitions: list[str],
                     gres_name: str = "gpu", image_root: str, workspace_root: str, job_root: str,
                     device_dir: str = "/dev", callback_url: str) -> SlurmCluster:
    """Registers a cluster after cluster_probe passed, with one GpuHost per partition; audited as
    slurm.cluster_registered. Returns the SlurmCluster. Raises ClusterRefused (see cluster_probe), also
    for a name already taken."""
    if SlurmCluster.objects.filter(name=name).exists():
        raise ClusterRefused(f"A cluster named {name} is already registered.", field="name")
    nodes = cluster_probe(rest_url=rest_url, rest_user=rest_user, token=token, partitions=partitions,
                          gres_name=gres_name)
    with transaction.atomic():
        cluster = SlurmCluster.objects.create(
            name=name, rest_url=rest_url.rstrip("/"), rest_user=rest_user, token_sealed=seal(token),
            gres_name=gres_name, image_root=image_root, workspace_root=workspace_root, job_root=job_root,
            device_dir=device_dir, callback_url=callback_url.rstrip("/"), last_seen_at=timezone.now(),
        )
        for partition in partitions:
            GpuHost.objects.create(
                name=f"{name}/{partition}", backend=GpuHost.Backend.SLURM, slurm_cluster=cluster,
                slurm_partition=partition, docker_url="", last_seen_at=timezone.now(),
            )
        audit_record(
            actor=actor, action="slurm.cluster_registered", target=cluster,
            details={"rest_url": cluster.rest_url, "partitions": partitions, "nodes": len(nodes)},
        )
    return cluster


def cluster_token_replace(*, actor, cluster: SlurmCluster, token: str) -> None:
    """Stores a new token once slurmrestd accepts it; audited. Raises ClusterRefused when it is refused."""
    partitions = list(cluster.partitions.values_list("slurm_partition", flat=True))
    cluster_probe(rest_url=cluster.rest_url, rest_user=cluster.rest_user, token=token, partitions=partitions,
                  gres_name=cluster.gres_name)
    with transaction.atomic():
        SlurmCluster.objects.filter(pk=cluster.pk).update(
            token_sealed=seal(token), health=SlurmCluster.Health.OK, last_error="", last_seen_at=timezone.now()
        )
        audit_record(actor=actor, action="slurm.token_replaced", target=cluster)


def cluster_nodes(cluster: SlurmCluster) -> list[NodeView]:
    """The cluster's nodes from Slurm's own view: state, GPUs (GRES) and what runs on each, DevCloud's
    instances by name and a count of other jobs. Raises SlurmError when slurmrestd cannot be asked."""
    from ..drivers.slurm import job_prefix, rest_for

    with rest_for(cluster) as rest:
        nodes = rest.nodes()
        jobs = [job for job in rest.jobs() if job.state == "RUNNING"]
    prefix = job_prefix()
    ours = {job.name[len(prefix):]: job for job in jobs if job.name.startswith(prefix)}
    instances = {str(i.id): i for i in Instance.objects.filter(id__in=list(ours)).select_related("user")}
    views = {
        node.name: NodeView(node.name, node.address, node.state, node.partitions, node.gres, node.gres_used)
        for node in nodes
    }
    for job in jobs:
        view = views.get(job.nodes)
        if view is None:
            continue
        instance = instances.get(job.name[len(prefix):]) if job.name.startswith(prefix) else None
        if instance is not None:
            view.instances.append(instance)
        else:
            view.other_jobs += 1
    return list(views.values())


def clusters_check(*, now: datetime | None = None) -> dict:
    """Asks every cluster's slurmrestd whether it answers and takes the token. A change of health is
    audited (slurm.cluster_unreachable, slurm.token_refused, slurm.cluster_answering) and shown on the
    console; the cluster's instances are not touched (their jobs run on, and are settled one by one by
    the reconciler). Returns {cluster name: health}."""
    from ..drivers.slurm import rest_for

    now = now or timezone.now()
    seen = {}
    for cluster in SlurmCluster.objects.all():
        health, error = SlurmCluster.Health.OK, ""
        try:
            with rest_for(cluster, timeout=5) as rest:
                rest.ping()
        except SlurmUnreachable as failure:
            health, error = SlurmCluster.Health.UNREACHABLE, failure.message
        except (SlurmBadToken, SlurmAuthError) as failure:
            health, error = SlurmCluster.Health.TOKEN_REFUSED, (
                f"{failure.message} Make a new token with `scontrol token username={cluster.rest_user}` and "
                "enter it on the cluster's console page."
            )
        except SlurmError as failure:
            health, error = SlurmCluster.Health.UNREACHABLE, failure.message
        except ValueError as failure:  # a token sealed with another key (portal/lib/sealed.py)
            health, error = SlurmCluster.Health.TOKEN_REFUSED, str(failure)
        changes = {"health": health, "last_error": error}
        if health == SlurmCluster.Health.OK:
            changes["last_seen_at"] = now
        with transaction.atomic():
            if SlurmCluster.objects.filter(pk=cluster.pk).exclude(health=health).update(**changes):
                action = {
                    SlurmCluster.Health.OK: "slurm.cluster_answering",
                    SlurmCluster.Health.UNREACHABLE: "slurm.cluster_unreachable",
                    SlurmCluster.Health.TOKEN_REFUSED: "slurm.token_refused",
                }[health]
                audit_record(actor=None, action=action, target=cluster, reason=error[:500])
                logger.warning("Slurm cluster %s: %s %s", cluster.name, action, error)
            else:
                SlurmCluster.objects.filter(pk=cluster.pk).update(**changes)
        seen[cluster.name] = health
    return seen


def partition_place(*, instance_id) -> GpuHost | None:
    """Hands a queued or provisioning launch with no place yet to the Slurm partition in service with the
    fewest live instances, for Slurm to place. Returns the partition's GpuHost, or None when there is none
    (or the launch has a place already, or ended)."""
    partitions = (
        GpuHost.objects.filter(backend=GpuHost.Backend.SLURM, state=GpuHost.State.ACTIVE)
        .annotate(live=Count("instances", filter=Q(instances__state__in=Instance.LIVE_STATES)))
        .order_by("live", "name")
    )
    partition = partitions.first()
    if partition is None:
        return None
    moved = Instance.objects.filter(
        id=instance_id, host__isnull=True, state__in=[Instance.State.QUEUED, Instance.State.PROVISIONING]
    ).update(host=partition, driver="slurm")
    return partition if moved else None
