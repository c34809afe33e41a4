"""GpuHost.gpus_present and gpus_free, kept by triggers on PostgreSQL, so placement picks a host without
counting GPUs.

The triggers are statement-level, with transition tables: one bulk insert of eight allocations, or one
release, changes its host's row once, in two statements, as they run in every allocate() and release().
Each first locks the hosts it is about to change (by id, so two statements cannot deadlock on them), and
only then reads the other table (is the GPU present, is it held). Reading after the lock matters: a release and a discovery of the same host may run at once, and
whichever locks second must see what the first committed, or the count would drift by one. allocate()
and host_discover() hold that lock already; a release, an admin edit or a test's bulk write takes it
here.

Creating the triggers locks GPUs and allocations against writes until the migration commits, and the fill
counts after that, so no allocation slips in between the count and the triggers.

SQLite (make run's embedded database) gets no triggers and keeps 0 in both columns: a trigger there names
the host table in its body, and Django's rebuild of that table for a later migration (how it alters
tables on SQLite) would then fail, or silently drop the triggers of a rebuilt GPU table. The scheduler
counts rows on SQLite instead, which is cheap on the one host it serves.
"""

from django.db import migrations, models
from django.db.models import Count

GPU_COUNTS = """
-- A GPU row added (sign 1) or deleted (sign -1): present GPUs count on its host, and free ones unless
-- an instance holds them. The insert and delete triggers both name their rows changed_rows.
CREATE FUNCTION provisioning_gpu_added_or_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sign integer := CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END;
BEGIN
    PERFORM 1 FROM provisioning_gpuhost
    WHERE id IN (SELECT host_id FROM changed_rows WHERE is_present) ORDER BY id FOR UPDATE;
    UPDATE provisioning_gpuhost AS host
    SET gpus_present = host.gpus_present + sign * delta.present,
        gpus_free = host.gpus_free + sign * delta.free
    FROM (
        SELECT gpu.host_id, count(*) AS present, count(*) FILTER (WHERE NOT EXISTS (
            SELECT 1 FROM provisioning_gpuallocation live
            WHERE live.gpu_id = gpu.id AND live.released_at IS NULL
        )) AS free
        FROM changed_rows gpu WHERE gpu.is_present GROUP BY gpu.host_id
    ) AS delta
    WHERE host.id = delta.host_id;
    RETURN NULL;
END $$;

-- A GPU marked absent or present again (or moved to another host): the same, for the rows that changed.
CREATE FUNCTION provisioning_gpu_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM provisioning_gpuhost WHERE id IN (
        SELECT unnest(ARRAY[old_row.host_id, new_row.host_id])
        FROM old_rows old_row JOIN new_rows new_row USING (id)
        WHERE old_row.is_present <> new_row.is_present OR old_row.host_id <> new_row.host_id
    ) ORDER BY id FOR UPDATE;
    UPDATE provisioning_gpuhost AS host
    SET gpus_present = host.gpus_present + delta.present, gpus_free = host.gpus_free + delta.free
    FROM (
        SELECT change.host_id, sum(change.sign) AS present,
            coalesce(sum(change.sign) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM provisioning_gpuallocation live
                WHERE live.gpu_id = change.gpu_id AND live.released_at IS NULL
            )), 0) AS free
        FROM (
            SELECT new_row.host_id, new_row.id AS gpu_id, 1 AS sign
            FROM old_rows old_row JOIN new_rows new_row USING (id)
            WHERE new_row.is_present AND (NOT old_row.is_present OR old_row.host_id <> new_row.host_id)
            UNION ALL
            SELECT old_row.host_id, old_row.id, -1
            FROM old_rows old_row JOIN new_rows new_row USING (id)
            WHERE old_row.is_present AND (NOT new_row.is_present OR old_row.host_id <> new_row.host_id)
        ) AS change
        GROUP BY change.host_id
    ) AS delta
    WHERE host.id = delta.host_id AND (delta.present <> 0 OR delta.free <> 0);
    RETURN NULL;
END $$;

-- A live allocation added (sign -1) or deleted (sign 1) changes its host's free count, if its GPU is
-- present (a GPU that vanished was not counted free).
CREATE FUNCTION provisioning_gpuallocation_added_or_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sign integer := CASE TG_OP WHEN 'INSERT' THEN -1 ELSE 1 END;
BEGIN
    PERFORM 1 FROM provisioning_gpuhost WHERE id IN (
        SELECT gpu.host_id FROM changed_rows JOIN provisioning_gpu gpu ON gpu.id = changed_rows.gpu_id
        WHERE changed_rows.released_at IS NULL
    ) ORDER BY id FOR UPDATE;
    UPDATE provisioning_gpuhost AS host SET gpus_free = host.gpus_free + sign * delta.live
    FROM (
        SELECT gpu.host_id, count(*) AS live
        FROM changed_rows JOIN provisioning_gpu gpu ON gpu.id = changed_rows.gpu_id AND gpu.is_present
        WHERE changed_rows.released_at IS NULL
        GROUP BY gpu.host_id
    ) AS delta
    WHERE host.id = delta.host_id;
    RETURN NULL;
END $$;

-- An allocation released (or, in principle, made live again or moved to another GPU).
CREATE FUNCTION provisioning_gpuallocation_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM provisioning_gpuhost WHERE id IN (
        SELECT gpu.host_id FROM old_rows old_row JOIN new_rows new_row USING (id)
        JOIN provisioning_gpu gpu ON gpu.id IN (old_row.gpu_id, new_row.gpu_id)
        WHERE (old_row.released_at IS NULL) <> (new_row.released_at IS NULL)
            OR old_row.gpu_id <> new_row.gpu_id
    ) ORDER BY id FOR UPDATE;
    UPDATE provisioning_gpuhost AS host SET gpus_free = host.gpus_free + delta.free
    FROM (
        SELECT gpu.host_id, sum(change.sign) AS free
        FROM (
            SELECT old_row.gpu_id, 1 AS sign FROM old_rows old_row JOIN new_rows new_row USING (id)
            WHERE old_row.released_at IS NULL
                AND (new_row.released_at IS NOT NULL OR old_row.gpu_id <> new_row.gpu_id)
            UNION ALL
            SELECT new_row.gpu_id, -1 FROM old_rows old_row JOIN new_rows new_row USING (id)
            WHERE new_row.released_at IS NULL
                AND (old_row.released_at IS NOT NULL OR old_row.gpu_id <> new_row.gpu_id)
        ) AS change
        JOIN provisioning_gpu gpu ON gpu.id = change.gpu_id AND gpu.is_present
        GROUP BY gpu.host_id
    ) AS delta
    WHERE host.id = delta.host_id AND delta.free <> 0;
    RETURN NULL;
END $$;

CREATE TRIGGER provisioning_gpu_counts_insert AFTER INSERT ON provisioning_gpu
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION provisioning_gpu_added_or_deleted();
CREATE TRIGGER provisioning_gpu_counts_delete AFTER DELETE ON provisioning_gpu
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION provisioning_gpu_added_or_deleted();
CREATE TRIGGER provisioning_gpu_counts_update AFTER UPDATE ON provisioning_gpu
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION provisioning_gpu_updated();

CREATE TRIGGER provisioning_gpuallocation_counts_insert AFTER INSERT ON provisioning_gpuallocation
    REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION provisioning_gpuallocation_added_or_deleted();
CREATE TRIGGER provisioning_gpuallocation_counts_delete AFTER DELETE ON provisioning_gpuallocation
    REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION provisioning_gpuallocation_added_or_deleted();
CREATE TRIGGER provisioning_gpuallocation_counts_update AFTER UPDATE ON provisioning_gpuallocation
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION provisioning_gpuallocation_updated();
"""

DROP_GPU_COUNTS = """
DROP TRIGGER provisioning_gpuallocation_counts_update ON provisioning_gpuallocation;
DROP TRIGGER provisioning_gpuallocation_counts_delete ON provisioning_gpuallocation;
DROP TRIGGER provisioning_gpuallocation_counts_insert ON provisioning_gpuallocation;
DROP TRIGGER provisioning_gpu_counts_update ON provisioning_gpu;
DROP TRIGGER provisioning_gpu_counts_delete ON provisioning_gpu;
DROP TRIGGER provisioning_gpu_counts_insert ON provisioning_gpu;
DROP FUNCTION provisioning_gpuallocation_updated();
DROP FUNCTION provisioning_gpuallocation_added_or_deleted();
DROP FUNCTION provisioning_gpu_updated();
DROP FUNCTION provisioning_gpu_added_or_deleted();
"""


def fill_gpu_counts(apps):
    """Sets every host's counts from its GPU and allocation rows."""
    GpuHost = apps.get_model("provisioning", "GpuHost")
    Gpu = apps.get_model("provisioning", "Gpu")
    GpuAllocation = apps.get_model("provisioning", "GpuAllocation")
    present = dict(
        Gpu.objects.filter(is_present=True)
        .values("host_id")
        .annotate(count=Count("id"))
        .values_list("host_id", "count")
    )
    held = dict(
        GpuAllocation.objects.filter(released_at__isnull=True, gpu__is_present=True)
        .values("gpu__host_id")
        .annotate(count=Count("id"))
        .values_list("gpu__host_id", "count")
    )
    hosts = list(GpuHost.objects.only("pk"))
    for host in hosts:
        host.gpus_present = present.get(host.pk, 0)
        host.gpus_free = host.gpus_present - held.get(host.pk, 0)
    GpuHost.objects.bulk_update(hosts, ["gpus_present", "gpus_free"], batch_size=500)


def install_gpu_counts(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(GPU_COUNTS)
        fill_gpu_counts(apps)


def remove_gpu_counts(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DROP_GPU_COUNTS)


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0005_workspaces"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpuhost",
            name="gpus_present",
            field=models.PositiveIntegerField(db_default=0, editable=False),
        ),
        migrations.AddField(
            model_name="gpuhost",
            name="gpus_free",
            field=models.PositiveIntegerField(db_default=0, editable=False),
        ),
        migrations.RunPython(install_gpu_counts, remove_gpu_counts),
        migrations.AddConstraint(
            model_name="gpuhost",
            constraint=models.CheckConstraint(
                condition=models.Q(("gpus_free__gte", 0), ("gpus_free__lte", models.F("gpus_present"))),
                name="provisioning_gpuhost_free_within_present",
            ),
        ),
        migrations.AddIndex(
            model_name="gpuhost",
            index=models.Index(
                models.OrderBy(models.F("gpus_present") - models.F("gpus_free"), descending=True),
                models.F("gpus_free"),
                models.F("name"),
                models.F("id"),
                condition=models.Q(("gpus_free__gt", 0), ("state", "active")),
                name="provisioning_gpuhost_packing",
            ),
        ),
    ]
