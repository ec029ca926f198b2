"""The ``email`` notifier: a plain-text mail through the standard library's SMTP client.

The connection is upgraded with STARTTLS before anything is sent (``starttls = false`` only for a
relay on the loopback), the server's certificate checked against the system's authorities or
``ca_file``; then LOGIN when ``username`` is set, with ``password`` or ``password_env``.
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from email.message import EmailMessage
from typing import Any, Mapping

from qinglong.contracts.events import DeliveryFailed, Message

from .options import number, refuse_unknown, secret, text

KEYS = ("kind", "host", "port", "starttls", "ca_file", "username", "password", "password_env",
        "from", "to", "timeout_ms")


class EmailNotifier:
    def __init__(self, name: str, host: str, port: int, starttls: bool, ca_file: str | None,
                 username: str | None, password: str | None, sender: str, to: tuple[str, ...],
                 timeout_s: float) -> None:
        self.name = name
        self._host, self._port, self._starttls, self._ca_file = host, port, starttls, ca_file
        self._username, self._password = username, password
        self._sender, self._to, self._timeout_s = sender, to, timeout_s

    def __repr__(self) -> str:
        return f"EmailNotifier({self.name!r})"

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "EmailNotifier":
        refuse_unknown(name, options, KEYS)
        host = text(options, "host", required=True)
        starttls = options.get("starttls", True)
        if not isinstance(starttls, bool):
            raise ValueError("key 'starttls': expected true or false")
        if not starttls and host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("key 'starttls': false only for a relay on the loopback")
        to = options.get("to")
        if isinstance(to, str):
            to = [to]
        if not isinstance(to, list) or not to or not all(isinstance(t, str) and "@" in t for t in to):
            raise ValueError("key 'to': expected one address or a list of addresses")
        sender = text(options, "from", required=True)
        if "@" not in sender:
            raise ValueError("key 'from': expected an address")
        username = text(options, "username")
        password = secret(options, "password", required=username is not None)
        return cls(name, host, number(options, "port", 587, 1, 65_535), starttls,
                   text(options, "ca_file"), username, password, sender, tuple(to),
                   number(options, "timeout_ms", 10_000, 100, 300_000) / 1000)

    def mail(self, message: Message) -> EmailMessage:
        mail = EmailMessage()
        mail["Subject"] = message.subject_line()
        mail["From"] = self._sender
        mail["To"] = ", ".join(self._to)
        mail["Message-ID"] = f"<{message.event.event_id}@qinglong>"
        mail["X-Qinglong-Event"] = message.event.event_id
        mail.set_content(message.text())
        return mail

    def _send(self, mail: EmailMessage) -> None:
        try:
            with smtplib.SMTP(self._host, self._port, timeout=self._timeout_s) as smtp:
                if self._starttls:
                    context = ssl.create_default_context(cafile=self._ca_file)
                    smtp.starttls(context=context)
                if self._username is not None:
                    smtp.login(self._username, self._password or "")
                smtp.send_message(mail)
        except smtplib.SMTPResponseException as exc:
            raise DeliveryFailed(f"SMTP {exc.smtp_code}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryFailed(f"SMTP failed ({exc.__class__.__name__})") from None

    async def send(self, message: Message) -> None:
        await asyncio.to_thread(self._send, self.mail(message))
