"""ASGI entry point (`uvicorn portal.asgi:application`): Django plus the JupyterLab gateway.

Paths under /instances/<uuid>/lab/ (HTTP and websockets) and /instances/<uuid>/auth go to the gateway
(portal/gateway/); everything else goes to Django.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")
django_application = get_asgi_application()

# Imported after Django is set up: the gateway reads sessions and instances through the ORM.
from portal.console.instrumentation import InstrumentedGateway
from portal.gateway.app import Gateway, Router

gateway = Gateway()
# The wrapper records the gateway's request latency and open websockets for /metrics.
application = Router(django_app=django_application, gateway=InstrumentedGateway(gateway))
