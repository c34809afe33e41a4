"""The local Docker engine behind a TCP port on loopback, as a remote host's engine looks to the portal.

`EngineForwarder()` forwards plain TCP (an engine started with -H tcp://0.0.0.0:2375, which the portal
must refuse); with `tls=` an ssl server context it terminates TLS first (with or without demanding a
client certificate, as that context says). Every connection is handed to the machine's real dockerd
over its socket, so what goes through it (helper containers, launches, published ports) is real.
"""

import select
import socket
import ssl
import threading

DOCKER_SOCKET = "/var/run/docker.sock"


class EngineForwarder:
    def __init__(self, *, tls: ssl.SSLContext | None = None, target: str = DOCKER_SOCKET):
        self.tls = tls
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._running = True
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._running = False
        self._listener.close()
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while self._running:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(10)
        try:
            if self.tls is not None:
                # A refused client certificate ends here, as dockerd --tlsverify would end it.
                client = self.tls.wrap_socket(client, server_side=True)
            client.settimeout(None)
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.target)
        except (OSError, ssl.SSLError):
            client.close()
            return
        with self._lock:
            self._open.update((client, engine))
        try:
            self._pump(client, engine)
        finally:
            for sock in (client, engine):
                try:
                    sock.close()
                except OSError:
                    pass

    @staticmethod
    def _pump(client, engine) -> None:
        # One thread per connection, so an SSL socket is never read and written from two threads at once.
        while True:
            try:
                pending = isinstance(client, ssl.SSLSocket) and client.pending()
                readable = [client] if pending else select.select([client, engine], [], [], 30)[0]
            except (OSError, ValueError):
                # stop() closed the sockets from its own thread (a closed socket's fileno is -1).
                return
            if not readable:
                continue
            for source, sink in ((client, engine), (engine, client)):
                if source not in readable:
                    continue
                try:
                    data = source.recv(65536)
                except ssl.SSLWantReadError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    sink.sendall(data)
                except OSError:
                    return
