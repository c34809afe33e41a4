"""The REST API under /api/v1/: personal access tokens, and the same operations as the pages.

Views call the services and selectors the pages call (portal.instances, portal.credits,
portal.accounts); this app adds only what an API needs of its own: tokens, idempotent launches,
problem-details errors and per-token rate limits.
"""
