"""The audit log's model moves here from the console app. State only: the table console_auditentry, its
indexes and its append-only trigger were made by console migrations 0001 and 0002 and stay as they are,
so no row moves and nothing here touches the database (nor needs portal.lib's trigger helper)."""

import django.core.serializers.json
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        # The table and its trigger must exist before this app claims them.
        ("console", "0002_audit_append_only"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEntry",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("actor_name", models.CharField(max_length=300)),
                        ("action", models.CharField(db_index=True, max_length=50)),
                        ("target_type", models.CharField(blank=True, default="", max_length=100)),
                        ("target_id", models.CharField(blank=True, default="", max_length=64)),
                        ("target_repr", models.CharField(blank=True, default="", max_length=300)),
                        ("reason", models.TextField(blank=True, default="")),
                        (
                            "details",
                            models.JSONField(
                                blank=True,
                                default=dict,
                                encoder=django.core.serializers.json.DjangoJSONEncoder,
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        (
                            "actor",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "console_auditentry",
                        "ordering": ["-created_at", "-id"],
                        "verbose_name_plural": "audit entries",
                        "default_permissions": (),
                        "indexes": [
                            models.Index(fields=["target_type", "target_id"], name="console_audit_target")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
