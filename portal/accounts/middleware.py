class SocialAuthErrorMiddleware:
    """Turns GitHub login failures into a friendly page (filled in by the GitHub work)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)
