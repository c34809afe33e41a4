"""/healthz, /readyz and /metrics, answered by a middleware at the top of the stack.

They come before Django's host check and HTTPS redirect on purpose: a load balancer or Prometheus asks
by the machine's address over plain HTTP on the loopback or private network, and none of the three
reads a session or writes anything. /metrics needs METRICS_TOKEN as a bearer token, or a client address
in METRICS_ALLOWED_NETWORKS, or both when both are set; with neither set it does not exist (404).
"""

import hmac
import ipaddress
import logging

from django.conf import settings
from django.http import HttpResponse, JsonResponse

from . import health, metrics

logger = logging.getLogger(__name__)

PATHS = ("/healthz", "/readyz", "/metrics")
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ProbeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info.rstrip("/") or "/"
        if path not in PATHS:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
        if path == "/healthz":
            response = JsonResponse({"status": "ok"})
        elif path == "/readyz":
            response = readyz()
        else:
            response = metrics_view(request)
        response["Cache-Control"] = "no-store"
        return response


def readyz() -> JsonResponse:
    """200 when PostgreSQL and Redis answer and the migrations are applied, 503 naming what failed."""
    checks = health.readiness()
    ready = all(check.ok for check in checks)
    body = {
        "status": "ready" if ready else "not ready",
        "checks": {check.name: {"ok": check.ok, "detail": check.detail} for check in checks},
        "failed": [check.name for check in checks if not check.ok],
    }
    return JsonResponse(body, status=200 if ready else 503)


def _bearer(request) -> str:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _address_allowed(request, networks: list[str]) -> bool:
    from portal.accounts.views import client_ip

    try:
        address = ipaddress.ip_address(client_ip(request))
    except ValueError:
        return False
    for network in networks:
        try:
            if address in ipaddress.ip_network(network, strict=False):
                return True
        except ValueError:
            logger.warning("METRICS_ALLOWED_NETWORKS has an entry that is not a network: %r", network)
    return False


def metrics_refusal(request) -> int | None:
    """None when the request may read /metrics; otherwise the status to refuse it with: 404 when
    /metrics is switched off, 401 without the right token, 403 from an address outside the networks."""
    token, networks = settings.METRICS_TOKEN, settings.METRICS_ALLOWED_NETWORKS
    if not token and not networks:
        return 404
    if token and not hmac.compare_digest(_bearer(request).encode(), token.encode()):
        return 401
    if networks and not _address_allowed(request, networks):
        return 403
    return None


def metrics_view(request) -> HttpResponse:
    refusal = metrics_refusal(request)
    if refusal == 404:
        return HttpResponse("Not found\n", status=404, content_type="text/plain")
    if refusal == 401:
        return HttpResponse(
            "Unauthorized\n", status=401, content_type="text/plain", headers={"WWW-Authenticate": "Bearer"}
        )
    if refusal == 403:
        return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
    return HttpResponse(metrics.exposition(), content_type=PROMETHEUS_CONTENT_TYPE)
