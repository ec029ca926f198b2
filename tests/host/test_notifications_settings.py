"""``[notifications]`` settings: a mistaken channel is refused naming it, and never shows the
channel's secret or URL (which may carry a token)."""

from __future__ import annotations

SECRET = "supersecret-value-123"
TOKEN = "tok-secret-999"


def test_a_bad_channel_is_refused_without_echoing_its_secret_or_url(cli, tmp_path):
    settings = tmp_path / "s.toml"
    settings.write_text(f'[backend]\npath = "{tmp_path / "q.db"}"\n'
                        f'[notifications.channels.hook]\nkind = 5\nsecret = "{SECRET}"\n'
                        f'url = "http://hooks.example/x?token={TOKEN}"\n')
    result = cli("--settings", str(settings), "notifications")
    assert result.returncode != 0 and "channel 'hook'" in result.stderr
    assert SECRET not in result.stderr + result.stdout and TOKEN not in result.stderr


def test_an_unknown_channel_kind_names_the_offered_ones_and_a_bad_option_hides_its_value(cli, tmp_path):
    settings = tmp_path / "s.toml"
    base = f'[backend]\npath = "{tmp_path / "q.db"}"\n'
    settings.write_text(base + '[notifications.channels.hook]\nkind = "pager"\n')
    result = cli("--settings", str(settings), "run", "--for-seconds", "1")
    assert "kind 'pager' is not offered" in result.stderr and "email, webhook" in result.stderr
    settings.write_text(base + '[notifications.channels.hook]\nkind = "webhook"\n'
                               'url = "http://127.0.0.1:9/"\nsecret = 123456789\n')
    result = cli("--settings", str(settings), "run", "--for-seconds", "1")
    assert "key 'secret'" in result.stderr and "123456789" not in result.stderr


def test_a_channels_operator_events_must_be_a_boolean_and_is_not_a_notifier_option(cli, tmp_path):
    """``operator_events`` is the host's switch, not the notifier's: a string there would be read
    as on by a careless check (paging a team that never asked), and handed to the notifier it
    would be refused as an unknown option."""
    settings = tmp_path / "s.toml"
    base = (f'[backend]\npath = "{tmp_path / "q.db"}"\n[notifications.channels.hook]\n'
            'kind = "webhook"\nurl = "http://127.0.0.1:9/"\nsecret = "0123456789abcdef"\n')
    settings.write_text(base + 'operator_events = "yes"\n')
    result = cli("--settings", str(settings), "run", "--for-seconds", "1")
    assert result.returncode != 0
    assert "channel 'hook': operator_events: expected true or false" in result.stderr
    settings.write_text(base + "operator_events = true\n")
    result = cli("--settings", str(settings), "run", "--for-seconds", "1")
    assert result.returncode == 0, result.stderr


def test_a_webhook_url_whose_port_cannot_be_read_is_refused_at_start(cli, tmp_path):
    """``url = "http://hooks.example:99999/x"`` was accepted at start: urllib checks a port only
    when it is read, so every event was retried and finally dead-lettered on a URL no send could
    ever use, instead of ``run`` naming the channel and key."""
    settings = tmp_path / "s.toml"
    for url in ("http://hooks.example:99999/x", "http://hooks.example:\u00b2/x", "http://hooks.example:-1/x"):
        settings.write_text(f'[backend]\npath = "{tmp_path / "q.db"}"\n[notifications.channels.hook]\n'
                            f'kind = "webhook"\nurl = "{url}"\nsecret = "0123456789abcdef"\n')
        result = cli("--settings", str(settings), "run", "--for-seconds", "0")
        assert result.returncode == 3, result.stderr
        assert "channel 'hook': key 'url': expected an http:// or https:// URL" in result.stderr
        assert "Traceback" not in result.stderr
