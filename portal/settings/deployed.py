"""What a deployed portal runs with: every secret from the environment, HTTPS only, DEBUG off.

portal.settings.production is this plus the refusal of unsafe settings. Only the benchmarks use this
module directly: they run the shipped configuration on loopback (plain HTTP behind no proxy), which the
refusal would stop.
"""

from .base import *  # noqa: F403
from .base import env

DEBUG = False

SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# `__Host-` names: a browser keeps such a cookie only when it is Secure, has Path=/ and no Domain, so code
# on a lab subdomain cannot plant one for the portal or for another lab (cookie tossing). Renaming the
# session cookie signs everybody out once. Keep SESSION_COOKIE_DOMAIN, CSRF_COOKIE_DOMAIN and the paths
# at their defaults (None, "/"): the browser would drop the cookies otherwise.
SESSION_COOKIE_NAME = "__Host-sessionid"
CSRF_COOKIE_NAME = "__Host-csrftoken"
GATEWAY_LAB_COOKIE_NAME = "__Host-devcloud_lab"
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
# Production is HTTPS only, so GitHub's OAuth callback URL must be https:// even when the TLS proxy in
# front forgets X-Forwarded-Proto; otherwise GitHub refuses the redirect_uri as a mismatch.
SOCIAL_AUTH_REDIRECT_IS_HTTPS = True
