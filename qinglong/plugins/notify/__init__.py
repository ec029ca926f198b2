"""The built-in notifiers: ``webhook`` (a signed JSON POST) and ``email`` (SMTP with STARTTLS).

Registered by entry point ``notify`` (group ``qinglong.plugins``) like any third-party plugin;
imports only :mod:`qinglong.contracts` and the standard library. A channel's secret (the webhook's
signing secret, the mail password) comes from its table or, better, from an environment variable
the table names (``secret_env``, ``password_env``); it is read when the channel is built and never
appears in an error, a log line or a delivery's recorded error.
"""

from __future__ import annotations

from qinglong.contracts.hookspecs import hookimpl


def _webhook(name, options):
    from .webhook import WebhookNotifier

    return WebhookNotifier.from_options(name, options)


def _email(name, options):
    from .mail import EmailNotifier

    return EmailNotifier.from_options(name, options)


@hookimpl
def qinglong_notifiers():
    """Offer the ``webhook`` and ``email`` channel kinds (the events contracts are read here, not
    at plugin load: a worker loads this plugin and never asks for notifiers)."""
    from qinglong.contracts.events import NotifierSpec

    return [NotifierSpec("webhook", _webhook, "a JSON POST signed with HMAC-SHA256"),
            NotifierSpec("email", _email, "a plain-text mail over SMTP with STARTTLS")]
