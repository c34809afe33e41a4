"""ASGI entry point (`uvicorn portal.asgi:application`): Django plus the JupyterLab gateway.

Paths under /instances/<uuid>/lab/ (HTTP and websockets) and /instances/<uuid>/auth go to the gateway
(portal/gateway/); everything else goes to Django.

Every Django view is synchronous, so Django runs as a WSGI application on a fixed pool of WEB_THREADS
threads (a2wsgi) rather than through Django's ASGI handler, which starts a thread and an event-loop
round trip per request: under load that overhead took a third of a web process's time and tripled the
pages' tail latency (benchmarks/bench_pages.py measures it).
"""

import os

from a2wsgi import WSGIMiddleware
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")
wsgi_application = get_wsgi_application()

# Imported after Django is set up: the gateway reads sessions and instances through the ORM.
from django.conf import settings

from portal.console import metrics
from portal.console.instrumentation import InstrumentedGateway
from portal.gateway import fast_path
from portal.gateway.app import Gateway, Router

django_application = WSGIMiddleware(wsgi_application, workers=settings.WEB_THREADS)
gateway = Gateway()
# The wrapper records the gateway's request latency and open websockets for /metrics.
application = Router(django_app=django_application, gateway=InstrumentedGateway(gateway))
# Under `--http portal.gateway.fast_path:LabHttpProtocol`, lab GETs of sessions the gateway has just
# allowed skip the layers above (portal/gateway/fast_path.py); they are timed for /metrics too.
fast_path.serve(gateway, observe=metrics.GATEWAY_LATENCY.labels("lab").observe)
