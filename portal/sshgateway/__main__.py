"""`python -m portal.sshgateway`: the same as `manage.py ssh_gateway`."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")
    from django.core.management import execute_from_command_line

    execute_from_command_line([sys.argv[0], "ssh_gateway", *sys.argv[1:]])
