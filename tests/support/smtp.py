"""A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps what it receives, for tests that send mail."""

import email
import email.policy
import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from aiosmtpd.controller import Controller


@dataclass
class ReceivedMessage:
    mail_from: str
    rcpt_tos: list[str]
    message: email.message.EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def body(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        return part.get_content() if part is not None else ""

    def links(self) -> list[str]:
        return re.findall(r"https?://\S+", self.body)


class CollectingHandler:
    """aiosmtpd handler that stores every message and wakes up waiters."""

    def __init__(self):
        self.messages: list[ReceivedMessage] = []
        self._changed = threading.Condition()

    async def handle_DATA(self, server, session, envelope):
        parsed = email.message_from_bytes(
            envelope.original_content or envelope.content, policy=email.policy.default
        )
        with self._changed:
            self.messages.append(ReceivedMessage(envelope.mail_from, list(envelope.rcpt_tos), parsed))
            self._changed.notify_all()
        return "250 Message accepted for delivery"

    def wait_for(self, predicate=lambda message: True, *, timeout: float = 30) -> ReceivedMessage:
        """The first message matching `predicate`, waiting at most `timeout` seconds.

        Raises TimeoutError listing what did arrive.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for message in self.messages:
                    if predicate(message):
                        return message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    got = [(m.rcpt_tos, m.subject) for m in self.messages]
                    raise TimeoutError(f"No matching email within {timeout:.0f}s; received: {got}")
                self._changed.wait(remaining)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextmanager
def smtp_server(host: str = "127.0.0.1", port: int | None = None):
    """Run an SMTP server in a thread for the duration of the block. Yields (handler, port)."""
    handler = CollectingHandler()
    controller = Controller(handler, hostname=host, port=port or free_port(host), ready_timeout=10)
    controller.start()
    try:
        yield handler, controller.port
    finally:
        controller.stop()
