"""Certificate holders on imported lists, the one certificate ID an application names, and what each
approval rests on.

Backfilled: an application's certificate ID from its evidence (blank when the evidence names none or
several); the basis of approvals made so far: "operator" when an operator approved by hand, "bare_id"
when a certificate list approved it (lists had no holders then), so those no longer open 8x. Imports
made so far are not trusted on bare IDs: their IDs approve nothing more by themselves.
"""

from django.conf import settings
from django.db import migrations, models

from portal.credits.models import certificate_id_or_blank


def backfill(apps, schema_editor):
    BonusApplication = apps.get_model("credits", "BonusApplication")
    changed = []
    for application in BonusApplication.objects.only("pk", "evidence", "status", "approved_via_id"):
        application.certificate_id = certificate_id_or_blank(application.evidence)
        if application.status == "approved":
            application.approval_basis = "bare_id" if application.approved_via_id else "operator"
        changed.append(application)
    BonusApplication.objects.bulk_update(changed, ["certificate_id", "approval_basis"], batch_size=1000)


class Migration(migrations.Migration):

    dependencies = [
        ('credits', '0004_certificate_imports'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='bonusapplication',
            name='approval_basis',
            field=models.CharField(blank=True, choices=[('operator', 'An operator reviewed it'), ('holder', "Certificate list: ID and holder's identity matched"), ('bare_id', 'Certificate list: ID alone (operator trusted bare IDs)')], default='', max_length=10),
        ),
        migrations.AddField(
            model_name='bonusapplication',
            name='certificate_id',
            field=models.CharField(blank=True, db_index=True, default='', max_length=200, verbose_name='certificate ID'),
        ),
        migrations.AddField(
            model_name='certificateimport',
            name='needs_review_count',
            field=models.PositiveIntegerField(default=0, verbose_name='left pending (not the holder / ID alone)'),
        ),
        migrations.AddField(
            model_name='certificateimport',
            name='trust_bare_ids',
            field=models.BooleanField(default=False, verbose_name='approves on the ID alone'),
        ),
        migrations.AddField(
            model_name='certificateimport',
            name='with_holders',
            field=models.PositiveIntegerField(default=0, verbose_name='IDs with a holder'),
        ),
        migrations.AddField(
            model_name='issuedcertificate',
            name='holder_email',
            field=models.CharField(blank=True, default='', max_length=254),
        ),
        migrations.AddField(
            model_name='issuedcertificate',
            name='holder_github',
            field=models.CharField(blank=True, default='', max_length=100, verbose_name="holder's GitHub login"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
