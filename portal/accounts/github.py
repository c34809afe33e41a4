"""GitHub login (social-auth). Helper fills in: backend with configurable URLs and the pipeline steps."""

from social_core.backends.github import GithubOAuth2 as _GithubOAuth2


class GithubOAuth2(_GithubOAuth2):
    pass


def require_verified_email(backend, details, response, *args, **kwargs):
    return None


def associate_verified_email(backend, details, user=None, *args, **kwargs):
    return None


def create_user(strategy, details, backend, user=None, *args, **kwargs):
    from social_core.pipeline.user import create_user as _create_user

    return _create_user(strategy, details, backend, user, *args, **kwargs)


def after_login(backend, user=None, *args, **kwargs):
    return None
