"""The built-in ``email`` notifier against a real local SMTP server (aiosmtpd) that requires
STARTTLS and a login, with a certificate made for the test."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

import qinglong.plugins.notify as notify
from qinglong.contracts.events import DeliveryFailed, Message, OutboxEvent
from qinglong.host.plugins import PluginHost

PASSWORD = "mail-pa55-xyz"
EVENT = OutboxEvent("ab" * 16, 7, "run.timed_out", "ops/backup", "ops", "backup", "nightly",
                    "run-42", "timed_out", None, 3_600_000, "the timeout expired", 1_800_000_000_000)


class Inbox:
    def __init__(self) -> None:
        self.mails = []

    async def handle_DATA(self, server, session, envelope):
        self.mails.append((session.authenticated, envelope.mail_from, envelope.rcpt_tos,
                           envelope.content.decode("utf-8", "replace")))
        return "250 OK"


def authenticator(server, session, envelope, mechanism, auth_data):
    ok = auth_data.login == b"robot" and auth_data.password == PASSWORD.encode()
    return AuthResult(success=ok)


@pytest.fixture
def smtp(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=context,
                            require_starttls=True, authenticator=authenticator,
                            auth_require_tls=True)
    controller.start()
    yield inbox, port, str(cert)
    controller.stop()


def channel(port, ca_file, **more):
    host = PluginHost()
    host.register(notify, "notify")
    return host.notifier_specs()["email"].create("mail", {
        "kind": "email", "host": "127.0.0.1", "port": port, "ca_file": ca_file,
        "username": "robot", "password_env": "QL_TEST_MAIL_PASSWORD", "from": "ql@example.net",
        "to": ["ops@example.net"], **more})


def test_a_mail_goes_over_starttls_after_login_and_says_what_ended(smtp, monkeypatch):
    """A notification sent in clear text would expose the login and the log tail; one that does
    not say the task, Run and state tells the reader nothing."""
    inbox, port, ca = smtp
    monkeypatch.setenv("QL_TEST_MAIL_PASSWORD", PASSWORD)
    asyncio.run(channel(port, ca).send(Message(EVENT, ("step 3 of 5",))))
    [(authenticated, sender, to, content)] = inbox.mails
    assert authenticated and sender == "ql@example.net" and to == ["ops@example.net"]
    assert "Subject: [qinglong] ops/backup: run timed_out" in content
    assert f"X-Qinglong-Event: {EVENT.event_id}" in content
    assert "run: run-42" in content and "duration: 3600.0 s" in content and "step 3 of 5" in content
    assert PASSWORD not in content


def test_a_wrong_password_or_an_untrusted_certificate_is_a_failed_try_without_the_secret(smtp, monkeypatch):
    inbox, port, ca = smtp
    monkeypatch.setenv("QL_TEST_MAIL_PASSWORD", "wrong-password-1")
    with pytest.raises(DeliveryFailed) as refused:
        asyncio.run(channel(port, ca).send(Message(EVENT)))
    assert "wrong-password-1" not in str(refused.value) and str(refused.value).startswith("SMTP")
    monkeypatch.setenv("QL_TEST_MAIL_PASSWORD", PASSWORD)
    with pytest.raises(DeliveryFailed, match="SSLCertVerificationError"):
        asyncio.run(channel(port, None).send(Message(EVENT)))
    assert inbox.mails == []


def test_bad_options_are_refused_naming_the_key_and_never_the_secret(monkeypatch):
    monkeypatch.delenv("QL_TEST_MAIL_PASSWORD", raising=False)
    with pytest.raises(ValueError, match="QL_TEST_MAIL_PASSWORD"):
        channel(25, None)
    with pytest.raises(ValueError, match="'starttls'") as refused:
        channel(25, None, starttls=False, host="mail.example.net")
    host = PluginHost()
    host.register(notify, "notify")
    with pytest.raises(ValueError) as refused:
        host.notifier_specs()["webhook"].create("h", {"kind": "webhook", "url": "http://x/",
                                                     "secret": 12345678})
    assert "12345678" not in str(refused.value)


def test_hook_qinglong_notifiers_offers_webhook_and_email_and_refuses_a_duplicate_kind():
    """A channel whose kind two plugins claim would be sent by whichever loaded last."""
    from qinglong.contracts.errors import PluginLoadError
    from qinglong.contracts.events import NotifierSpec
    from qinglong.contracts.hookspecs import hookimpl

    class Twin:
        @staticmethod
        @hookimpl
        def qinglong_notifiers():
            return [NotifierSpec("email", lambda name, options: None)]

    host = PluginHost()
    host.register(notify, "notify")
    assert sorted(host.notifier_specs()) == ["email", "webhook"]
    host.register(Twin(), "twin")
    with pytest.raises(PluginLoadError, match="notifier kind 'email'"):
        host.notifier_specs()
