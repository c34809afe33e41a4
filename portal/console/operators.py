"""The "Operators" group: what an operator may do in the console, and nothing that hands out power.

It holds one permission per operator action (console.OperatorAction) and the view permissions the
console's pages need. It never holds a permission that edits users, groups or permissions
(accounts.change_user, auth.*): those would let an operator edit staff and superuser flags, group
membership or passwords, and so make themselves superuser.
"""

OPERATORS_GROUP = "Operators"

OPERATOR_PERMISSIONS = (
    # The operator actions, each its own permission (console.OperatorAction).
    "console.suspend_user",
    "console.unsuspend_user",
    "console.open_launch_sizes",
    "console.adjust_credits",
    "console.review_bonus",
    "console.drain_host",
    "console.evict_host",
    "console.retire_host",
    "console.activate_host",
    "console.discover_gpus",
    "console.check_engine",
    "console.ensure_images",
    "console.force_stop_instance",
    # Reading the pages those actions start from.
    "accounts.view_user",
    "accounts.view_sshkey",
    "credits.view_creditaccount",
    "credits.view_ledgerentry",
    "credits.view_bonusapplication",
    "credits.view_bonusprogram",
    "credits.view_signupgrantprogram",
    "credits.view_certificateimport",
    "instances.view_instance",
    "instances.view_image",
    "instances.view_launchpolicy",
    "provisioning.view_gpuhost",
    "provisioning.view_slurmcluster",
    "console.view_auditentry",
    "console.view_capacitysample",
    "notifications.view_notification",
    "sshgateway.view_sshsession",
)


# Added after console migration 0006, which seeds the group as it was before them.
ADDED_WITH_SLURM = ("provisioning.view_slurmcluster",)


def operators_group_seed(Group, Permission, permissions=OPERATOR_PERMISSIONS):
    """Create the "Operators" group if it is missing and give it exactly `permissions` (OPERATOR_PERMISSIONS;
    a migration passes the list as it was when it was written).

    Takes the Group and Permission models (historical ones in a migration). Returns the group.
    Raises LookupError naming any permission that does not exist, so a renamed model or action
    is noticed instead of silently dropped.
    """
    wanted = {tuple(name.split(".", 1)) for name in permissions}
    found = {
        (permission.content_type.app_label, permission.codename): permission
        for permission in Permission.objects.select_related("content_type").filter(
            codename__in={codename for _, codename in wanted}
        )
        if (permission.content_type.app_label, permission.codename) in wanted
    }
    missing = sorted(".".join(key) for key in wanted - set(found))
    if missing:
        raise LookupError(f"Permissions for the Operators group do not exist: {', '.join(missing)}")
    group, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
    group.permissions.set(found.values())
    return group
