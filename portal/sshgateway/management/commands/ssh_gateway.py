import asyncio
import logging
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from portal.sshgateway.server import serve


class Command(BaseCommand):
    help = (
        "Run the SSH jump gateway (ssh -J <host>:<port> developer@<instance>) on SSH_GATEWAY_BIND:"
        "SSH_GATEWAY_PORT until SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.SSH_GATEWAY_BIND, help="address to listen on")
        parser.add_argument("--port", type=int, default=settings.SSH_GATEWAY_PORT, help="port to listen on")
        parser.add_argument("--host-key", default=settings.SSH_GATEWAY_HOST_KEY, help="host key file")

    def handle(self, *args, bind, port, host_key, **options):
        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        asyncio.run(self._run(bind, port, host_key))

    async def _run(self, bind, port, host_key):
        task = asyncio.ensure_future(serve(host=bind, port=port, host_key_path=host_key))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass
