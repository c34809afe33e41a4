"""The SSH jump gateway: an asyncssh server that lets a person's OpenSSH client reach the sshd inside
their own running instances, and nothing else.

    ssh -J <SSH_GATEWAY_HOST>:<SSH_GATEWAY_PORT> developer@<instance short id>

- Authentication: public keys only, checked against the keys on active accounts at every connection (a
  key removed in Settings is refused on the next one). No password, keyboard-interactive or host-based
  authentication is offered. The SSH user name given to the gateway is ignored: the key says who it is.
- Forwarding: only direct-tcpip (what `-J` and `-W` send) to port 22 of an instance the key's owner has
  running, named by short id (see access.route_for). The gateway connects to that instance's sshd where
  its host publishes it (the host's private address) and copies bytes both ways; the SSH session inside
  is the client's own, encrypted end to end. Refusals carry a sentence OpenSSH prints ("open failed").
- A shell or command on the gateway itself prints a help text and exits; remote forwarding (-R),
  Unix sockets and everything else are refused.
- Each forwarded connection is recorded (models.SshSession): who, which instance, which key, when, bytes
  each way, refreshed every HEARTBEAT_SECONDS while it is open; idle culling counts an open one as use.

Run it with `manage.py ssh_gateway` (or `python -m portal.sshgateway`); `make run` starts it.
"""

import asyncio
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncssh
from asyncssh.forward import SSHForwarder
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from . import access, host_key, selectors, services

logger = logging.getLogger("portal.sshgateway")

HEARTBEAT_SECONDS = 30
CONNECT_TIMEOUT_SECONDS = 10
# A key refresh inside the instance before connecting; past this the connection goes ahead without it
# (the gateway has already checked the person's current keys, and beat catches up).
KEY_PUSH_TIMEOUT_SECONDS = 5
LOGIN_TIMEOUT_SECONDS = 30
KEEPALIVE_SECONDS = 30
# How long a login waits on one database call before it is told the database does not answer; well
# inside LOGIN_TIMEOUT_SECONDS, and shorter than the connection pool's wait (portal/settings/base.py).
DATABASE_WAIT_SECONDS = 10
# What a person reads while the gateway's database does not answer (a restart, an outage): the gateway
# cannot tell whose key it is or which instances are theirs, so it lets no one through until it answers.
DATABASE_DOWN = (
    "The SSH gateway cannot check access right now: its database does not answer. Try again in a minute; "
    "if it lasts, tell the operators."
)


# Threads for calls that reach a host's engine (the key refresh before a connection). A stuck dockerd holds
# such a call for its client's whole timeout, far past KEY_PUSH_TIMEOUT_SECONDS, so they never run in the
# pool the database calls use: there, a few connections to a stuck host would hold up everyone's login.
ENGINE_THREADS = 16
_engine_threads = ThreadPoolExecutor(max_workers=ENGINE_THREADS, thread_name_prefix="ssh-gateway-engine")


def _db(function, /, **kwargs):
    """Run a database function in a worker thread of its own connection handling: a connection that broke
    meanwhile (a database restart) is dropped first, and the thread's connection is closed after."""
    return _in_thread(None, function, kwargs)


async def _asked(function, /, **kwargs):
    """_db for a call a person's login waits on, within DATABASE_WAIT_SECONDS: a database that hangs (a
    connection pool waiting for a connection, a network that drops packets) must not outlast the login's
    own timeout, so the person reads why. Raises DatabaseError for a database that failed or did not
    answer in time."""
    try:
        return await asyncio.wait_for(_db(function, **kwargs), DATABASE_WAIT_SECONDS)
    except TimeoutError:
        raise DatabaseError(f"no answer within {DATABASE_WAIT_SECONDS} s") from None


def _engine(function, /, **kwargs):
    """_db for a function that also reaches a host's engine: in a thread of ENGINE_THREADS."""
    return _in_thread(_engine_threads, function, kwargs)


def _in_thread(executor, function, kwargs):
    def call():
        close_old_connections()
        try:
            return function(**kwargs)
        finally:
            close_old_connections()

    return asyncio.get_running_loop().run_in_executor(executor, call)


def load_host_key(path: str) -> asyncssh.SSHKey:
    """The gateway's host key at `path`, made (Ed25519, mode 0600) the first time, so clients see the same
    key across restarts, with its public half written beside it (`<path>.pub`) for the portal to publish.
    Returns the key."""
    key = _read_or_make_host_key(Path(path))
    try:
        host_key.write_public(key, path)
    except OSError:
        # The gateway still serves; the portal derives the public key from the private one if it can.
        logger.warning("Could not write %s", host_key.public_path(path), exc_info=True)
    return key


def _read_or_make_host_key(key_path: Path) -> asyncssh.SSHKey:
    if key_path.exists():
        return asyncssh.read_private_key(str(key_path))
    key_path.parent.mkdir(parents=True, exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519", comment=f"{settings.SITE_NAME} SSH gateway")
    partial = key_path.with_name(key_path.name + ".new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.export_private_key())
    # A second gateway starting at the same moment must not overwrite the first one's key.
    try:
        os.link(partial, key_path)
    except FileExistsError:
        key = asyncssh.read_private_key(str(key_path))
    finally:
        partial.unlink(missing_ok=True)
    logger.info("Made the SSH gateway host key %s (%s)", key_path, key.get_fingerprint())
    return key


class Forward:
    """One forwarded connection: its record, its byte counts, and its end."""

    def __init__(self, gateway: "Gateway", session_id: int):
        self.gateway = gateway
        self.session_id = session_id
        self.bytes_from_client = 0
        self.bytes_to_client = 0
        self.ended = False

    def report(self, *, ended: bool = False):
        return _db(
            services.session_progress,
            session_id=self.session_id,
            bytes_from_client=self.bytes_from_client,
            bytes_to_client=self.bytes_to_client,
            ended=ended,
        )

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.gateway.forwards.discard(self)
        self.gateway.track(self.report(ended=True))


class CountingForwarder(SSHForwarder):
    """asyncssh's forwarder, counting the bytes it receives; `client_side` is the SSH channel's end.

    The instance's side reads nothing until the client's channel is open. Its sshd sends its greeting
    as soon as it accepts, and asyncssh's forwarder drops bytes that arrive before it has a peer with a
    transport to write them to: the client then read the sshd's key exchange as its greeting ("banner
    line contains invalid characters").
    """

    def __init__(self, peer=None, *, forward: Forward, client_side: bool):
        super().__init__(peer)
        self._forward = forward
        self._client_side = client_side

    def connection_made(self, transport):
        super().connection_made(transport)
        if not self._client_side:
            transport.pause_reading()
        elif self._peer is not None:
            self._peer.resume_reading()

    def close_unless_opened(self):
        """Close both sides when the client's channel never opened: its connection closed while the gateway
        connected to the instance, and asyncssh then drops the channel without a word to this forwarder."""
        if self._client_side and self._transport is None:
            self.close()

    def data_received(self, data, datatype=None):
        if self._client_side:
            self._forward.bytes_from_client += len(data)
        else:
            self._forward.bytes_to_client += len(data)
        super().data_received(data, datatype)

    def close(self):
        super().close()
        self._forward.end()


class GatewayServer(asyncssh.SSHServer):
    """One client connection to the gateway."""

    def __init__(self, gateway: "Gateway"):
        self.gateway = gateway
        self.conn = None
        self.client_address = ""
        self.fingerprint = ""
        self._candidate = ""

    def connection_made(self, conn):
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("?", 0)
        self.client_address = f"{peer[0]}:{peer[1]}"

    def begin_auth(self, username):
        return True

    def password_auth_supported(self):
        return False

    def kbdint_auth_supported(self):
        return False

    def host_based_auth_supported(self):
        return False

    def public_key_auth_supported(self):
        return True

    async def validate_public_key(self, username, key):
        # asyncssh calls this for every key the client offers, and again for the signed attempt, right
        # before it checks the signature and (with no await in between) reports success and calls
        # auth_completed. A newer auth request cancels an older one mid-lookup. So the candidate left
        # when auth_completed runs is the key whose signature was just verified, never one merely
        # offered (someone offering Alice's public key without her private key is never taken for her).
        fingerprint = key.get_fingerprint("sha256")
        try:
            known = await _asked(access.key_is_known, fingerprint=fingerprint)
        except DatabaseError as error:
            logger.warning("Could not check key %s from %s: the database did not answer: %s", fingerprint,
                           self.client_address, error)
            raise asyncssh.DisconnectError(asyncssh.DISC_SERVICE_NOT_AVAILABLE, DATABASE_DOWN) from None
        if known:
            self._candidate = fingerprint
        else:
            logger.info("Refused key %s from %s: on no account", fingerprint, self.client_address)
        return known

    def auth_completed(self):
        self.fingerprint = self._candidate
        logger.info("Authenticated %s with key %s", self.client_address, self.fingerprint)

    def session_requested(self):
        return self._help

    async def _help(self, stdin, stdout, stderr):
        try:
            text = await _asked(access.help_text, fingerprint=self.fingerprint)
        except DatabaseError as error:
            logger.warning("Could not answer %s: the database did not answer: %s", self.client_address, error)
            text = f"{DATABASE_DOWN}\n"
        stdout.write(text)
        stdout.channel.exit(1)

    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        return self._forward(dest_host, dest_port)

    async def _forward(self, dest_host: str, dest_port: int):
        try:
            return await self._forward_to(dest_host, dest_port)
        except DatabaseError as error:
            logger.warning("Could not forward %s to %s:%s: the database did not answer: %s", self.client_address,
                           dest_host, dest_port, error)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, DATABASE_DOWN) from None

    async def _forward_to(self, dest_host: str, dest_port: int):
        try:
            route = await _asked(access.route_for, fingerprint=self.fingerprint, target=dest_host, port=dest_port)
        except access.Refused as refused:
            logger.info(
                "Refused %s (key %s) a connection to %s:%s: %s",
                self.client_address, self.fingerprint, dest_host, dest_port, refused.message,
            )
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, refused.message) from None
        await self._refresh_keys(route)
        session = await _asked(
            services.session_open, route=route, client_address=self.client_address, gateway=self.gateway.name
        )
        forward = Forward(self.gateway, session.pk)
        loop = asyncio.get_running_loop()
        try:
            _, instance_side = await asyncio.wait_for(
                loop.create_connection(
                    lambda: CountingForwarder(forward=forward, client_side=False), route.address, route.port
                ),
                CONNECT_TIMEOUT_SECONDS,
            )
        except (OSError, TimeoutError) as error:
            await forward.report(ended=True)
            logger.warning("Instance %s's sshd at %s:%s did not answer: %s", route.short_id, route.address,
                           route.port, error)
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED,
                f"Instance {route.short_id} is running but its SSH server does not answer. Try again in a "
                "moment; if it lasts, stop the instance and launch a new one.",
            ) from None
        self.gateway.forwards.add(forward)
        logger.info(
            "Forwarding %s (user %s, key %s) to instance %s at %s:%s",
            self.client_address, route.user_id, route.key_name, route.short_id, route.address, route.port,
        )
        client_side = CountingForwarder(instance_side, forward=forward, client_side=True)
        # asyncssh opens the channel as soon as this returns, before the loop runs anything else.
        loop.call_soon(client_side.close_unless_opened)
        return client_side

    async def _refresh_keys(self, route) -> None:
        """Write the owner's current keys into the instance before connecting, so the sshd inside trusts
        what the gateway just checked."""

        def push():
            from portal.instances.models import Instance

            instance = Instance.objects.select_related("host").get(pk=route.instance_id)
            return services.push_keys_to(instance, services.authorized_keys_text(route.user_id))

        try:
            await asyncio.wait_for(_engine(push), KEY_PUSH_TIMEOUT_SECONDS)
        except TimeoutError:
            logger.warning(
                "Could not refresh the keys of instance %s: its host's engine did not answer within %s s; "
                "connecting with the keys it has", route.short_id, KEY_PUSH_TIMEOUT_SECONDS,
            )
        except Exception:  # the connection matters more; beat's sync catches up
            logger.warning("Could not refresh the keys of instance %s", route.short_id, exc_info=True)


class Gateway:
    """The gateway process: its listener, its open forwards and their heartbeat."""

    def __init__(self):
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.forwards: set[Forward] = set()
        self._tasks: set[asyncio.Future] = set()
        self.server = None

    def track(self, future) -> None:
        """Keep a background write alive until it finishes, and log its failure."""
        future = asyncio.ensure_future(future)
        self._tasks.add(future)

        def done(finished):
            self._tasks.discard(finished)
            if not finished.cancelled() and finished.exception():
                logger.warning("SSH session record failed: %s", finished.exception())

        future.add_done_callback(done)

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            for forward in list(self.forwards):
                try:
                    await forward.report()
                except Exception:
                    logger.warning("Could not refresh SSH session %s", forward.session_id, exc_info=True)

    async def start(self, *, host: str, port: int, host_key_path: str):
        """Listen on host:port. Returns the asyncssh server (its sockets say the port actually bound)."""
        key = load_host_key(host_key_path)
        closed = await _db(services.sessions_close_stale, older_than=selectors.OPEN_SESSION_FRESHNESS)
        if closed:
            logger.info("Ended %d SSH session record(s) left open by a gateway that stopped", closed)
        self.server = await asyncssh.create_server(
            lambda: GatewayServer(self),
            host,
            port,
            server_host_keys=[key],
            login_timeout=LOGIN_TIMEOUT_SECONDS,
            keepalive_interval=KEEPALIVE_SECONDS,
            # Agent forwarding and X11 are for the instance's sshd, never the gateway.
            agent_forwarding=False,
            x11_forwarding=False,
            allow_scp=False,
        )
        self.track(self.heartbeat())
        bound = self.server.sockets[0].getsockname()
        logger.info(
            "SSH gateway listening on %s:%s (host key %s, %s)", bound[0], bound[1], key.get_fingerprint(),
            host_key_path,
        )
        return self.server

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for forward in list(self.forwards):
            forward.ended = True
            await forward.report(ended=True)
        self.forwards.clear()


async def serve(*, host: str, port: int, host_key_path: str, ready=None) -> None:
    """Run the gateway until cancelled (SIGTERM/SIGINT in the management command)."""
    gateway = Gateway()
    await gateway.start(host=host, port=port, host_key_path=host_key_path)
    if ready is not None:
        ready(gateway)
    try:
        await asyncio.Event().wait()
    finally:
        await gateway.stop()
