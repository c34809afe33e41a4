"""Remove GitHub links from accounts whose address was never confirmed.

Until now an account could connect GitHub before confirming its address, so someone who signed up with
another person's address could keep a GitHub login into the account its owner would later take over.
New links need a confirmed address; this removes the links made before that rule. Their owners can
connect GitHub again once they confirm the address.
"""

from django.db import migrations


def unlink_github_from_unconfirmed_accounts(apps, schema_editor):
    UserSocialAuth = apps.get_model("social_django", "UserSocialAuth")
    UserSocialAuth.objects.filter(user__email_verified_at__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_user_suspension_and_extra_sizes"),
        ("social_django", "0022_nonce_timestamp_index"),
    ]

    operations = [migrations.RunPython(unlink_github_from_unconfirmed_accounts, migrations.RunPython.noop)]
