"""What crosses the gateway in each direction, and what does not.

Upstream (to JupyterLab) the portal's own cookies and the gateway's lab cookies are removed, over HTTP and
websockets alike: code in the instance must never see the portal session (the lab cookie carries it,
encrypted), which would let it act as the user. The token is sent as
`Authorization: token ...`, which Jupyter Server (2.x) treats as token authentication. A
token-authenticated request skips both of Jupyter's cross-site defences: `check_xsrf_cookie` returns
early and `skip_check_origin` is true (IdentityProvider.should_check_origin). So the browser needs no
`_xsrf` dance, and the gateway's own Origin check (`origin_allowed`) is the only thing standing
between another origin and the kernel, with the session cookie's SameSite=Lax behind it. Origin is
still rewritten to JupyterLab's own, so the request also passes should a later Jupyter check it.

Downstream (to the browser) the instance is treated as untrusted: it may not set or overwrite portal
cookies or cookies outside its own path, and its CORS headers are dropped (the gateway serves the lab
to its own origin only).
"""

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.core.signals import setting_changed

from .tickets import handshake_cookie_name, lab_cookie_name

# RFC 9110 section 7.6.1, plus headers the gateway sets itself.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
CLIENT_HEADERS_DROPPED = HOP_BY_HOP | {
    "host",
    "cookie",
    "authorization",
    "origin",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "forwarded",
}
UPSTREAM_HEADERS_DROPPED = HOP_BY_HOP | {
    "set-cookie",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-allow-headers",
    "access-control-allow-methods",
    "access-control-expose-headers",
}

_UPSTREAM_HEADERS_DROPPED_BYTES = frozenset(name.encode() for name in UPSTREAM_HEADERS_DROPPED)


# Prefixes a browser enforces on cookie names; a cookie is the same cookie to the portal with or without.
COOKIE_PREFIXES = ("__Host-", "__Secure-")


def portal_cookie_names() -> frozenset[str]:
    """Cookies that belong to the portal or the gateway and never go to an instance.

    The lab cookie carries the portal session (encrypted): anyone holding it is the owner in that lab, so
    it is as secret from the instance as the session itself. Each name is also dropped with or without a
    `__Host-`/`__Secure-` prefix, so a name changed between environments never slips through.
    """
    # Every lab request asks twice; the names change only with the settings (as tests change them).
    global _portal_cookie_names
    if _portal_cookie_names is None:
        names = {
            settings.SESSION_COOKIE_NAME,
            settings.CSRF_COOKIE_NAME,
            settings.LANGUAGE_COOKIE_NAME,
            "messages",  # django.contrib.messages' cookie storage
            lab_cookie_name(),
            handshake_cookie_name(),
        }
        bare = {_unprefixed(name) for name in names}
        prefixed = {prefix + name for name in bare for prefix in COOKIE_PREFIXES}
        _portal_cookie_names = frozenset(bare | prefixed)
    return _portal_cookie_names


_portal_cookie_names: frozenset[str] | None = None


def _forget_cookie_names(**kwargs) -> None:
    global _portal_cookie_names
    _portal_cookie_names = None


setting_changed.connect(_forget_cookie_names, dispatch_uid="gateway_forget_cookie_names")


def _unprefixed(name: str) -> str:
    for prefix in COOKIE_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def decoded_headers(scope) -> dict[str, str]:
    """The request headers as a lower-case dict; repeated headers are joined as HTTP allows."""
    result: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        if name in result:
            result[name] = f"{result[name]}; {value}" if name == "cookie" else f"{result[name]}, {value}"
        else:
            result[name] = value
    return result


def cookie_value(cookie_header: str, name: str) -> str | None:
    for part in cookie_header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None


def strip_portal_cookies(cookie_header: str) -> str:
    """Returns the Cookie header without the portal's cookies, every occurrence (kept verbatim otherwise)."""
    dropped = portal_cookie_names()
    kept = [
        part.strip()
        for part in cookie_header.split(";")
        if part.strip() and part.partition("=")[0].strip() not in dropped
    ]
    return "; ".join(kept)


def upstream_origin(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.netloc}"


def upstream_request_headers(
    scope, token: str, endpoint: str, headers: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """Headers for the request to JupyterLab: the client's, minus portal cookies, plus the token.

    Origin is rewritten to JupyterLab's own, so its `check_origin` (Origin host == Host) accepts what
    the gateway already checked against the portal's host. `headers` is decoded_headers(scope), when
    the caller has it already.
    """
    if headers is None:
        headers = decoded_headers(scope)
    connection_tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    result = [
        (name, value)
        for name, value in headers.items()
        if name not in CLIENT_HEADERS_DROPPED
        and name not in connection_tokens
        and not name.startswith("sec-websocket-")
    ]
    # Only encodings the gateway can decode (http_proxy._decoded), so it can scrub any page it has to.
    accepted = [e.strip() for e in headers.get("accept-encoding", "").split(",")]
    usable = [e for e in accepted if e.split(";")[0].strip() in ("gzip", "deflate", "identity")]
    result = [(name, value) for name, value in result if name != "accept-encoding"]
    if usable:
        result.append(("accept-encoding", ", ".join(usable)))
    cookies = strip_portal_cookies(headers.get("cookie", ""))
    if cookies:
        result.append(("cookie", cookies))
    if "origin" in headers:
        result.append(("origin", upstream_origin(endpoint)))
    if headers.get("content-length"):
        result.append(("content-length", headers["content-length"]))
    if token:
        # An exposed port (portal/ports) has no token: the instance's own app gets no credential.
        result.append(("authorization", f"token {token}"))
    return result


def request_scheme(scope, headers: dict[str, str]) -> str:
    """Returns "https" or "http": how the browser reached us, decided as Django's `request.scheme` does.

    Behind a TLS-terminating proxy, settings.SECURE_PROXY_SSL_HEADER (X-Forwarded-Proto in production)
    decides when present; otherwise the connection's own scheme (uvicorn applies X-Forwarded-Proto from
    the proxies it trusts, --forwarded-allow-ips).
    """
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        meta_name, secure_value = proxy_header
        value = headers.get(meta_name.removeprefix("HTTP_").replace("_", "-").lower())
        if value is not None:
            return "https" if value.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("https", "wss") else "http"


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the port made explicit, or None when `netloc` cannot be read."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        if not parts.hostname or parts.username is not None or parts.password is not None:
            return None
        return scheme, parts.hostname.lower(), parts.port or DEFAULT_PORTS[scheme]
    except (ValueError, KeyError):
        return None


def origin_allowed(scope, headers: dict[str, str]) -> bool:
    """True unless the request carries an Origin other than the one it was sent to: scheme, host, port.

    Browsers send Origin on websocket handshakes and on every POST/PUT/PATCH/DELETE, so this is what
    stops another site (or, in subdomain mode, another instance's origin) from driving a kernel with
    the user's cookies. The scheme counts: behind TLS, a page on http:// with the same host name (which
    a network attacker can inject into any plain-http response) is another origin. A malformed or
    "null" Origin is refused. Requests without Origin (curl, scripts) carry no ambient browser authority.
    """
    origin = headers.get("origin")
    if origin is None:
        return True
    try:
        claimed = urlsplit(origin.strip())
    except ValueError:
        return False
    if claimed.scheme not in DEFAULT_PORTS or claimed.path or claimed.query or claimed.fragment:
        return False
    sender = _origin_of(claimed.scheme, claimed.netloc)
    receiver = _origin_of(request_scheme(scope, headers), headers.get("host", ""))
    return sender is not None and sender == receiver


# What a browser recognises after a cookie's name=value (RFC 6265 section 5.2, RFC 6265bis).
COOKIE_ATTRIBUTES = {"expires", "max-age", "domain", "path", "secure", "httponly", "samesite", "partitioned"}


def set_cookie_parts(value: str) -> tuple[str, dict[str, str]] | None:
    """(name, attributes) of a Set-Cookie value, read as RFC 6265 section 5.2 has a browser read it.

    The name is what precedes the first "=" of the part before the first ";", trimmed; each attribute's
    name is lower-cased and the last of a kind wins. None when there is no name, or an attribute a
    browser would not recognise (a second "name=value", say), so such a header is dropped rather than
    guessed at. JupyterLab sets one of these on nearly every answer, and this reading is a few string
    splits where http.cookies' regular expressions cost more than the rest of a forwarded poll.
    """
    pair, *attributes = value.split(";")
    name, equals, _ = pair.partition("=")
    name = name.strip()
    if not equals or not name:
        return None
    found: dict[str, str] = {}
    for attribute in attributes:
        key, _, attribute_value = attribute.partition("=")
        key = key.strip().lower()
        if not key:
            continue
        if key not in COOKIE_ATTRIBUTES:
            return None
        found[key] = attribute_value.strip()
    return name, found


def _safe_set_cookie(value: str, path_prefix: str) -> bool:
    """Whether an instance's Set-Cookie may reach the browser: its own path, no domain, no portal name."""
    parts = set_cookie_parts(value)
    if parts is None:
        return False
    name, attributes = parts
    # Any Domain, even an empty one (which browsers are told to ignore), is refused.
    if name in portal_cookie_names() or "domain" in attributes:
        return False
    path = attributes.get("path", "")
    # No Path means the request's directory, which is under the instance's prefix.
    return not path or path.rstrip("/") + "/" == path_prefix or path.startswith(path_prefix)


def strip_token_from_url(location: str, endpoint: str) -> str:
    """A redirect as the browser may see it: no upstream host, no `token=` in the query."""
    if endpoint and location.startswith(endpoint):
        location = location[len(endpoint) :] or "/"
    parts = urlsplit(location)
    if "token" in parts.query:
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"])
        location = urlunsplit(parts._replace(query=query))
    return location


def downstream_response_headers(raw_headers, *, path_prefix: str, endpoint: str, rewrite_body: bool):
    """Headers for the browser from JupyterLab's response, filtered as the module docstring says.

    `raw_headers` is a list of (bytes, bytes). When `rewrite_body` is set, the length and encoding go
    too, because the gateway sends a decoded, rewritten body.
    """
    # Names compared as bytes: this runs on every forwarded answer, and most headers pass untouched.
    result = []
    named = [(raw_name.lower(), raw_name, raw_value) for raw_name, raw_value in raw_headers]
    dropped = _UPSTREAM_HEADERS_DROPPED_BYTES
    connection_tokens = {
        token.strip()
        for name, _, value in named
        if name == b"connection"
        for token in value.lower().split(b",")
    }
    if connection_tokens:
        dropped = dropped | connection_tokens
    for name, raw_name, raw_value in named:
        if name == b"set-cookie":
            if _safe_set_cookie(raw_value.decode("latin-1"), path_prefix):
                result.append((raw_name, raw_value))
            continue
        if name in dropped:
            continue
        if rewrite_body and name in (b"content-length", b"content-encoding"):
            continue
        if name == b"location":
            location = strip_token_from_url(raw_value.decode("latin-1"), endpoint)
            result.append((raw_name, location.encode("latin-1")))
            continue
        result.append((raw_name, raw_value))
    return result
