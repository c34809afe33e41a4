"""Invariants of the fields added in 0005, once they are backfilled (a migration of its own, so the
ALTER TABLE does not share a transaction with the backfill's updates)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("credits", "0005_certificate_holders"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='bonusapplication',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'approved'), models.Q(('approval_basis', ''), _negated=True)), models.Q(models.Q(('status', 'approved'), _negated=True), ('approval_basis', '')), _connector='OR'), name='credits_approval_has_basis'),
        ),
        migrations.AddConstraint(
            model_name='certificateimport',
            constraint=models.CheckConstraint(condition=models.Q(('trust_bare_ids', False), ('with_holders', 0), _connector='OR'), name='credits_bare_trust_only_without_holders'),
        ),
    ]
