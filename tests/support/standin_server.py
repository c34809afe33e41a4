"""What the tests' HTTP stand-ins for outside services (tests/support/github_standin.py,
tests/support/oidc_issuer.py) share: a threaded server on a free loopback port, started and stopped by
the test, and a request handler that answers JSON quietly."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandinServer:
    """A loopback HTTP server run on a thread. `url` is its base URL; subclasses pass their handler
    class (which reaches the stand-in through the closure that made it) and a thread name."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str):
        self._lock = threading.Lock()
        self._stopped = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering; afterwards connections to `url` are refused. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class JsonHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing (test output stays quiet) and answers JSON."""

    json_content_type = "application/json"

    def log_message(self, format, *args):
        pass

    def _json(self, status: int, body) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", self.json_content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
