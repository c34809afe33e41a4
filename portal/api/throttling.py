"""Rate limits per token: each token (and each browser session's user) has its own API_RATE_PER_TOKEN."""

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import SimpleRateThrottle

from portal.accounts.views import client_ip

from .models import ApiToken


class PerTokenThrottle(SimpleRateThrottle):
    # The database cache the pages' rate limits use, so every web process counts the same requests.
    cache = caches["ratelimit"]
    scope = "token"

    def get_rate(self):
        # Read at request time, so operators' settings and tests apply without a restart.
        return settings.API_RATE_PER_TOKEN

    def allow_request(self, request, view):
        # The rate is read per request; SimpleRateThrottle parsed it once, when the view was built.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request, view):
        if isinstance(request.auth, ApiToken):
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{client_ip(request)}"
        return f"api-throttle:{ident}"
