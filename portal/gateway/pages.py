"""The answers the gateway gives instead of JupyterLab: sign in, not found, not running, not answering.

A browser asking for a page gets one in the portal's layout; JupyterLab's own scripts (which ask for
JSON) get `{"message": ...}`, the shape Jupyter's API errors have, so the lab shows it.
"""

import json
from dataclasses import dataclass, field
from functools import lru_cache
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.shortcuts import resolve_url
from django.template import Context, Engine
from django.templatetags.static import static
from django.urls import reverse


@dataclass
class Reply:
    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


@lru_cache(maxsize=1)
def _engine() -> Engine:
    # The gateway is not an installed app, so it brings its own template directory. Its page stands
    # alone instead of extending base.html, whose tags need a request and the database.
    return Engine(dirs=[str(Path(__file__).parent / "templates")], app_dirs=False)


def wants_html(headers: dict[str, str]) -> bool:
    return "text/html" in headers.get("accept", "")


def _reply(
    status: int,
    headers: dict[str, str],
    *,
    heading: str,
    message: str,
    advice: str = "",
    retry_url: str = "",
    on_lab_host: bool = False,
) -> Reply:
    no_store = (b"cache-control", b"no-store")
    if not wants_html(headers):
        body = json.dumps({"message": f"{message} {advice}".strip(), "reason": heading}).encode()
        return Reply(status, [(b"content-type", b"application/json"), no_store], body)
    portal_url = settings.SITE_URL if on_lab_host else ""
    css_url = static("css/portal.css")
    context = Context(
        {
            "SITE_NAME": settings.SITE_NAME,
            "heading": heading,
            "message": message,
            "advice": advice,
            "retry_url": retry_url,
            "portal_url": portal_url,
            "instances_url": portal_url + reverse("instances:list"),
            "css_url": css_url if css_url.startswith(("http://", "https://")) else portal_url + css_url,
        }
    )
    body = _engine().get_template("gateway/page.html").render(context).encode()
    return Reply(status, [(b"content-type", b"text/html; charset=utf-8"), no_store], body)


def sign_in(method: str, path_with_query: str, headers: dict[str, str]) -> Reply:
    """A browser opening a page is sent to log in and back; anything else gets 401."""
    if method in ("GET", "HEAD") and wants_html(headers):
        location = f"{resolve_url(settings.LOGIN_URL)}?next={quote(path_with_query, safe='/')}"
        return Reply(302, [(b"location", location.encode()), (b"cache-control", b"no-store")])
    return _reply(
        401,
        headers,
        heading="Sign in needed",
        message="Sign in to the portal to use this JupyterLab.",
    )


def not_found(headers: dict[str, str]) -> Reply:
    return _reply(
        404,
        headers,
        heading="No such instance",
        message="There is no instance of yours at this address.",
        advice="Open JupyterLab from your instances page.",
    )


def not_running(headers: dict[str, str], state: str) -> Reply:
    return _reply(
        409,
        headers,
        heading="This instance isn't running",
        message=f"This instance is {state}, so its JupyterLab is not available.",
        advice=(
            "It is still starting: JupyterLab opens once it is ready, and your instances page shows "
            "its progress."
            if state in ("queued", "provisioning")
            else "Launch it again from your instances page; your /workspace files are kept."
        ),
    )


def upstream_down(headers: dict[str, str], path_with_query: str) -> Reply:
    return _reply(
        502,
        headers,
        heading="JupyterLab isn't answering",
        message="JupyterLab isn't answering yet, or anymore.",
        advice=(
            "If the instance has just started, wait a few seconds and try again. If it keeps "
            "happening, check its status on your instances page, and stop and launch it again."
        ),
        retry_url=path_with_query,
    )


def forbidden_origin(headers: dict[str, str]) -> Reply:
    return _reply(
        403,
        headers,
        heading="Request refused",
        message="This request came from another site, so it was refused.",
    )


def link_expired(headers: dict[str, str]) -> Reply:
    """Shown on a lab's own host (subdomain mode), so it links back to the portal by full address."""
    return _reply(
        403,
        headers,
        heading="This link has expired",
        message="The link that opens JupyterLab works once, for a few seconds, in the browser that asked.",
        advice="Open JupyterLab again from your instances page.",
        on_lab_host=True,
    )


def port_refused(headers: dict[str, str], message: str) -> Reply:
    """A port or share link the caller may not use: 404, saying why (the port's own host or the portal)."""
    return _reply(404, headers, heading="Not available", message=message, on_lab_host=True)


def port_not_running(headers: dict[str, str], state: str) -> Reply:
    return _reply(
        409,
        headers,
        heading="This instance isn't running",
        message=f"The instance serving this address is {state}, so its ports are closed.",
        on_lab_host=True,
    )


def port_down(headers: dict[str, str], path_with_query: str, port: int) -> Reply:
    return _reply(
        502,
        headers,
        heading="Nothing is answering",
        message=f"Nothing in the instance answers on port {port}.",
        advice="Start your app listening on 0.0.0.0 at that port, then try again.",
        retry_url=path_with_query,
        on_lab_host=True,
    )


def set_cookie(name: str, value: str, max_age: int | None = None) -> tuple[bytes, bytes]:
    """A host-only Set-Cookie for the lab host: Path=/, HttpOnly, SameSite=Lax, Secure as the session's.

    Path=/, no Domain and Secure (production) are what a `__Host-` name requires of it.
    """
    cookie = SimpleCookie()
    cookie[name] = value
    morsel = cookie[name]
    morsel["path"], morsel["httponly"], morsel["samesite"] = "/", True, "Lax"
    morsel["secure"] = settings.SESSION_COOKIE_SECURE
    if max_age is not None:
        morsel["max-age"] = max_age
    return b"set-cookie", morsel.OutputString().encode()


def redirect(location: str) -> Reply:
    # no-referrer: the ticket in a redeem URL must not travel on in a Referer header.
    return Reply(
        302,
        [
            (b"location", location.encode()),
            (b"cache-control", b"no-store"),
            (b"referrer-policy", b"no-referrer"),
        ],
    )
