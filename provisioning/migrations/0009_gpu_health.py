"""GPU health: a GPU can be drained on its own (provisioning/gpu_health.py), and a drained GPU leaves its
host's GPU counts.

The count triggers of migration 0006 counted a GPU when it was present. Here the same functions are
replaced so that they count a GPU when it is present and not drained: a drained GPU is neither present
nor free in GpuHost.gpus_present / gpus_free, so placement (which picks hosts by those counts) never
sees it as free, whoever drains it and whenever its holder releases it. Returning it to service counts
it again in the same statement. The function bodies are 0006's, with every test of is_present widened
to (is_present AND NOT is_drained); the triggers themselves are unchanged.
"""

import importlib
import re

from django.db import migrations, models
from django.db.models import Count

_gpu_counts = importlib.import_module("provisioning.migrations.0006_host_gpu_counts")


def _functions_only(sql: str) -> str:
    """0006's SQL up to its CREATE TRIGGER statements, as CREATE OR REPLACE (the triggers stay)."""
    functions = sql[: sql.index("CREATE TRIGGER")]
    return functions.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def _counted(match: re.Match) -> str:
    prefix = match.group(1) or ""
    return f"({prefix}is_present AND NOT {prefix}is_drained)"


COUNTED_FUNCTIONS = re.sub(r"\b(\w+\.)?is_present\b", _counted, _functions_only(_gpu_counts.GPU_COUNTS))
PRESENT_ONLY_FUNCTIONS = _functions_only(_gpu_counts.GPU_COUNTS)


def _fill(apps, *, skip_drained: bool):
    GpuHost = apps.get_model("provisioning", "GpuHost")
    Gpu = apps.get_model("provisioning", "Gpu")
    GpuAllocation = apps.get_model("provisioning", "GpuAllocation")
    counted = Gpu.objects.filter(is_present=True)
    held = GpuAllocation.objects.filter(released_at__isnull=True, gpu__is_present=True)
    if skip_drained:
        counted = counted.filter(is_drained=False)
        held = held.filter(gpu__is_drained=False)
    present = dict(counted.values("host_id").annotate(count=Count("id")).values_list("host_id", "count"))
    live = dict(held.values("gpu__host_id").annotate(count=Count("id")).values_list("gpu__host_id", "count"))
    hosts = list(GpuHost.objects.only("pk"))
    for host in hosts:
        host.gpus_present = present.get(host.pk, 0)
        host.gpus_free = host.gpus_present - live.get(host.pk, 0)
    GpuHost.objects.bulk_update(hosts, ["gpus_present", "gpus_free"], batch_size=500)


def count_in_service(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(COUNTED_FUNCTIONS)
        _fill(apps, skip_drained=True)


def count_present(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(PRESENT_ONLY_FUNCTIONS)
        _fill(apps, skip_drained=False)


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0008_host_shares"),
    ]

    operations = [
        migrations.AddField(model_name="gpu", name="is_drained", field=models.BooleanField(default=False)),
        migrations.AddField(
            model_name="gpu", name="drained_reason", field=models.TextField(blank=True, default="")
        ),
        migrations.AddField(model_name="gpu", name="drained_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(
            model_name="gpu", name="ras_uncorrectable", field=models.PositiveBigIntegerField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="gpu", name="ras_correctable", field=models.PositiveBigIntegerField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="gpu", name="health_checked_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.RunPython(count_in_service, count_present),
    ]
