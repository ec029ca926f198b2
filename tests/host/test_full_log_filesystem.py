"""A log filesystem with no space left: the job cannot be started, and the Attempt says so
(``failed`` with the start error), instead of ending ``lost`` without a receipt and burning an
idempotent task's attempts. The filesystem is real: a small tmpfs, filled."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess

import pytest

from dispatcher_helpers import now_ms, running, small_tmpfs, state_of, write_settings


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


def test_a_log_filesystem_filling_mid_job_keeps_the_job_and_records_its_exit(tmp_path):
    """The job's own output fills the log filesystem while it runs. Recorded `lost`, a job that
    ran to its end with exit 0 would be reported as vanished (and an idempotent task run again),
    and nothing would say the log was cut short by the full filesystem."""
    marker = tmp_path / "finished"
    with small_tmpfs(tmp_path / "logfs", "256k") as logfs:
        settings = write_settings(tmp_path, log_dir=str(logfs / "logs"))

        async def body() -> None:
            async with running(settings) as h:
                await h.put_task("chatty", ["sh", "-c", "echo begin; head -c 600000 /dev/zero | tr '\\0' x; "
                                                        f"echo; touch {marker}; exit 0"],
                                 idempotent=True, retry={"max_attempts": 3, "initial_backoff_ms": 1000})
                run_id = await h.admit("chatty")
                detail = await h.until_ended(run_id)
                assert state_of(detail.run.state) == "succeeded" and detail.run.exit_code == 0, detail
                (attempt,) = detail.attempts
                assert "no space left on the log filesystem" in attempt.reason, attempt.reason
                assert marker.exists(), "the job did not run to its end"
                assert open(f"{attempt.attempt_dir}/log", "rb").read(6) == b"begin\n"

        asyncio.run(body())


def test_a_log_filesystem_full_only_for_the_receipt_still_records_the_exit(tmp_path):
    """The filesystem fills (here by the job itself, as by any other writer) after the job's
    output was logged, before its receipt: recorded `lost`, its exit 3 would be hidden behind "ended
    without a completion receipt", as if the job had vanished."""
    with small_tmpfs(tmp_path / "logfs", "256k") as logfs:
        settings = write_settings(tmp_path, log_dir=str(logfs / "logs"))

        async def body() -> None:
            async with running(settings) as h:
                await h.put_task("filler", ["sh", "-c", f"dd if=/dev/zero of={logfs}/fill bs=4k 2>/dev/null; exit 3"],
                                 idempotent=True)
                run_id = await h.admit("filler")
                detail = await h.until_ended(run_id)
                assert state_of(detail.run.state) == "failed" and detail.run.exit_code == 3, detail
                (attempt,) = detail.attempts
                assert state_of(attempt.state) == "failed" and attempt.exit_code == 3
                assert "no space left on the log filesystem" in attempt.reason, attempt.reason

        asyncio.run(body())


def test_a_full_log_filesystem_fails_an_event_runs_attempt_at_start_once(tmp_path, full_fs):
    """A Run admitted with an event payload (a webhook delivery) writes its event file first: on
    a full log filesystem that failure was an executor error, the Attempt was put back in the
    queue and tried again every pass, for ever, with an error each time and the Run never ending."""
    from qinglong.contracts.hooks import HOOK_KIND
    from qinglong.contracts.records import MisfirePolicy, TriggerDefinition

    settings = write_settings(tmp_path, log_dir=str(full_fs / "logs"))
    marker = tmp_path / "ran"

    async def body() -> None:
        async with running(settings) as h:
            await h.put_task("job", ["sh", "-c", f"touch {marker}"])
            await h.backend.publisher().put_trigger(TriggerDefinition(
                "p", "gh", "job", HOOK_KIND, {"secret": "x" * 40}, MisfirePolicy.FIRE_ONCE, 60_000, True))
            payload = {"body": "{}", "content_type": "application/json", "delivery": "d-1"}
            result = await h.backend.occurrences().admit_occurrence(HOOK_KIND, "gh", "d-1", payload, now_ms())
            h.dispatcher.wake()
            detail = await h.until_ended(result.run_id)
            assert state_of(detail.run.state) == "failed", detail
            (attempt,) = detail.attempts
            assert "no space left on the log filesystem" in attempt.reason, attempt.reason
            assert not marker.exists(), "the job ran"
            assert h.dispatcher.stats.start_failed == 1

    asyncio.run(body())


def test_a_log_filesystem_out_of_inodes_fails_the_attempt_with_the_same_error(tmp_path):
    """No inode left (many small files) is the same full filesystem for the operator: a start
    error worded differently ("cannot create the attempt directory ...") would hide it from
    whoever looks for "no space left on the log filesystem", and the reason must name it."""
    mount = tmp_path / "logfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=3,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        (mount / "logs").mkdir()
        taken = 0
        try:
            while True:
                (mount / "logs" / f"f{taken}").touch()
                taken += 1
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        settings = write_settings(tmp_path, log_dir=str(mount / "logs"))
        marker = tmp_path / "ran"

        async def body() -> None:
            async with running(settings) as h:
                await h.put_task("job", ["sh", "-c", f"touch {marker}"], idempotent=True)
                run_id = await h.admit("job")
                detail = await h.until_ended(run_id)
                assert state_of(detail.run.state) == "failed", detail
                (attempt,) = detail.attempts
                assert "no space left on the log filesystem" in attempt.reason, attempt.reason
                assert not marker.exists(), "the job ran"

        asyncio.run(body())
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
