"""A log filesystem with no space left: the job cannot be started, and the Attempt says so
(``failed`` with the start error), instead of ending ``lost`` without a receipt and burning an
idempotent task's attempts. The filesystem is real: a small tmpfs, filled."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess

import pytest

from dispatcher_helpers import running, state_of, write_settings


@pytest.fixture
def full_fs(tmp_path):
    """A 64 KiB tmpfs at ``tmp_path/logfs``, every byte of it taken by ``fill``."""
    mount = tmp_path / "logfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        fd = os.open(mount / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_log_filesystem_fails_the_attempt_as_not_started_and_never_lost(tmp_path, full_fs):
    """Recorded `lost` ("ended without a completion receipt"), every Attempt of an idempotent
    task would be retried and burned although the job never ran, and the operator would never
    learn the log filesystem is full."""
    settings = write_settings(tmp_path, log_dir=str(full_fs / "logs"))
    marker = tmp_path / "ran"

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("job", ["sh", "-c", f"touch {marker}"], idempotent=True,
                             retry={"max_attempts": 3, "initial_backoff_ms": 1000})
            run_id = await h.admit("job")
            detail = await h.until_ended(run_id)
            assert state_of(detail.run.state) == "failed", detail
            (attempt,) = detail.attempts
            assert state_of(attempt.state) == "failed"
            assert "no space left on the log filesystem" in attempt.reason, attempt.reason
            assert "completion receipt" not in (detail.run.reason or "")
            assert not marker.exists(), "the job ran"
            assert h.dispatcher.stats.start_failed == 1

    asyncio.run(body())
