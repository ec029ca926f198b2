"""The ``webhook`` notifier: each message as a JSON POST, signed as GitHub and Stripe sign theirs.

Headers: ``X-Qinglong-Event`` (the event id, stable across redeliveries: dedupe on it),
``X-Qinglong-Timestamp`` (unix seconds when this try was sent) and ``X-Qinglong-Signature:
sha256=<hex>``, the HMAC-SHA256 with the channel's secret over ``<timestamp>.<body>``
(:mod:`qinglong.contracts.signing`, the rule ``hook`` triggers verify). A receiver
recomputes it over the raw body, compares in constant time, and refuses a timestamp too old
(a replay). A 2xx answer is a delivery; anything else, a refused connection or a timeout is a
failed try, recorded with the status only.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from qinglong.contracts.events import DeliveryFailed, Message
from qinglong.contracts.signing import signature, verify  # noqa: F401 (verify: for receivers)

from .options import number, refuse_unknown, secret, text

KEYS = ("kind", "url", "secret", "secret_env", "timeout_ms")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect would resend the signed body elsewhere


class WebhookNotifier:
    def __init__(self, name: str, url: str, secret_value: str, timeout_s: float) -> None:
        self.name = name
        self._url = url
        self._secret = secret_value
        self._timeout_s = timeout_s
        self._opener = urllib.request.build_opener(_NoRedirect)

    def __repr__(self) -> str:  # never the secret, nor the URL (it may carry a token)
        return f"WebhookNotifier({self.name!r})"

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> "WebhookNotifier":
        refuse_unknown(name, options, KEYS)
        url = text(options, "url", required=True)
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # urllib checks the port only when it is read: here, not at the first send
        except ValueError:
            raise ValueError("key 'url': expected an http:// or https:// URL, its port from 0 to 65535") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("key 'url': expected an http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("key 'url': credentials in the URL are refused (use secret_env)")
        return cls(name, url, secret(options, "secret", required=True),
                   number(options, "timeout_ms", 10_000, 100, 300_000) / 1000)

    def request(self, message: Message, now_s: float | None = None) -> urllib.request.Request:
        body = json.dumps(message.to_json(), separators=(",", ":"), sort_keys=True).encode("utf-8")
        timestamp = str(int(time.time() if now_s is None else now_s))
        return urllib.request.Request(self._url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "qinglong-webhook",
            "X-Qinglong-Event": message.event.event_id, "X-Qinglong-Timestamp": timestamp,
            "X-Qinglong-Signature": signature(self._secret, timestamp, body)})

    def _post(self, request: urllib.request.Request) -> None:
        try:
            with self._opener.open(request, timeout=self._timeout_s) as answer:
                answer.read(65_536)
                status = answer.status
        except urllib.error.HTTPError as exc:
            raise DeliveryFailed(f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DeliveryFailed(f"no answer ({reason.__class__.__name__})") from None
        if not 200 <= status < 300:
            raise DeliveryFailed(f"HTTP {status}")

    async def send(self, message: Message) -> None:
        await asyncio.to_thread(self._post, self.request(message))
