"""An example notifier plugin: Qinglong's events as ntfy-style push messages (see README.md)."""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from qinglong.contracts.events import FAILURE_KINDS, DeliveryFailed, Message, NotifierSpec
from qinglong.contracts.hookspecs import hookimpl

KEYS = ("kind", "server", "topic", "token_env", "timeout_ms")


class NtfyNotifier:
    def __init__(self, name: str, url: str, token: str | None, timeout_s: float) -> None:
        self.name = name
        self._url = url
        self._token = token
        self._timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"NtfyNotifier({self.name!r})"

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "NtfyNotifier":
        unknown = sorted(k for k in options if k not in KEYS)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} (expected one of {', '.join(KEYS)})")
        server, topic = options.get("server"), options.get("topic")
        if not isinstance(server, str) or urllib.parse.urlsplit(server).scheme not in ("http", "https"):
            raise ValueError("key 'server': expected an http:// or https:// URL")
        if not isinstance(topic, str) or not topic.replace("-", "").replace("_", "").isalnum():
            raise ValueError("key 'topic': expected letters, digits, - and _")
        token = None
        if "token_env" in options:
            token = os.environ.get(str(options["token_env"]))
            if not token:
                raise ValueError(f"key 'token_env': environment variable {options['token_env']!r} "
                                 "is not set or empty")
        timeout = options.get("timeout_ms", 10_000)
        if not isinstance(timeout, int) or not 100 <= timeout <= 300_000:
            raise ValueError("key 'timeout_ms': expected an integer from 100 to 300000")
        return cls(name, server.rstrip("/") + "/" + topic, token, timeout / 1000)

    def _post(self, message: Message) -> None:
        failed = message.event.kind in FAILURE_KINDS
        headers = {"Title": message.subject_line(), "Priority": "high" if failed else "default",
                   "Tags": "warning" if failed else "white_check_mark",
                   "X-Qinglong-Event": message.event.event_id}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self._url, data=message.text().encode("utf-8"),
                                         headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:
                answer.read(65_536)
        except urllib.error.HTTPError as exc:
            raise DeliveryFailed(f"HTTP {exc.code}") from None
        except OSError as exc:
            raise DeliveryFailed(f"no answer ({exc.__class__.__name__})") from None

    async def send(self, message: Message) -> None:
        await asyncio.to_thread(self._post, message)


@hookimpl
def qinglong_notifiers():
    """Offer the ``ntfy`` channel kind."""
    return [NotifierSpec("ntfy", NtfyNotifier.from_options, "an ntfy-style HTTP push message")]
