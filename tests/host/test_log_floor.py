"""The free-space floor of log retention on a real small filesystem (a tmpfs): scaled to the
filesystem, the newest logs of each task kept, only logs under the guarded directory touched,
and said at start."""

from __future__ import annotations

import asyncio
import os

from dispatcher_helpers import fill, marker_script, now_ms, running, small_tmpfs, write_settings

from qinglong.host.execution.retention import space_floor

MIB = 1024 * 1024


def test_a_log_filesystem_smaller_than_min_free_bytes_keeps_its_logs_and_says_so(tmp_path, capfd):
    """With the absolute 64 MiB floor on an 8 MiB filesystem every log was deleted as soon as its
    job ended: `qinglong logs RUN` always answered "deleted by log retention"."""
    (tmp_path / "marks").mkdir()
    with small_tmpfs(tmp_path / "logfs", "8m") as logfs:
        settings = write_settings(tmp_path, level="warning", log_dir=str(logfs / "logs"))

        async def body() -> None:
            async with running(settings) as h:
                await h.put_task("talk", marker_script(tmp_path / "marks", "echo worth keeping"))
                runs = [await h.admit("talk") for _ in range(4)]
                for run in runs:
                    await h.until_ended(run)
                report = await h.dispatcher.retention.sweep(now_ms())
                assert report.logs_deleted_for_space == 0
                for run in runs:
                    assert not (await h.detail(run)).attempts[0].log_deleted
                assert h.dispatcher.retention.floor() == int(8 * MIB * 0.1)

        asyncio.run(body())
    err = capfd.readouterr().err
    assert "execution.log_floor_scaled" in err and "does not fit" in err, err


def test_under_the_floor_the_newest_logs_of_each_task_and_logs_elsewhere_stay(tmp_path):
    """Space was made by deleting every log, newest included, and logs kept under an earlier
    log_dir on another filesystem (which frees nothing here): a full disk erased all evidence."""
    (tmp_path / "marks").mkdir()
    marks = tmp_path / "marks"
    elsewhere = write_settings(tmp_path, log_dir=str(tmp_path / "old-logs"))

    async def before() -> list[str]:
        async with running(elsewhere) as h:
            await h.put_task("c", marker_script(marks, "echo elsewhere"))
            runs = [await h.admit("c") for _ in range(4)]
            for run in runs:
                await h.until_ended(run)
            return runs

    old_runs = asyncio.run(before())
    with small_tmpfs(tmp_path / "logfs", "8m") as logfs:
        settings = write_settings(tmp_path, log_dir=str(logfs / "logs"))

        async def body() -> None:
            async with running(settings) as h:
                await h.put_task("a", marker_script(marks, "echo a"))
                await h.put_task("b", marker_script(marks, "echo b"))
                a_runs = []
                for _ in range(5):
                    a_runs.append(await h.admit("a"))
                    await h.until_ended(a_runs[-1])
                b_run = await h.admit("b")
                await h.until_ended(b_run)
                fill(logfs / "fill", leave_free=64 * 1024)
                report = await h.dispatcher.retention.sweep(now_ms())
                assert report.logs_deleted_for_space == 2
                deleted = [(await h.detail(run)).attempts[0].log_deleted for run in a_runs]
                assert deleted == [True, True, False, False, False]
                assert not (await h.detail(b_run)).attempts[0].log_deleted
                for run in old_runs:
                    view = (await h.detail(run)).attempts[0]
                    assert not view.log_deleted and os.path.exists(view.attempt_dir)

        asyncio.run(body())


def test_the_floor_is_min_free_bytes_where_it_fits_else_the_fraction():
    """A floor above the filesystem's size deletes every log; one scaled where the absolute
    default fits would leave a big disk fuller than configured."""
    assert space_floor(64 * MIB, 100 * 1024 * MIB, 0.1) == 64 * MIB
    assert space_floor(64 * MIB, 16 * MIB, 0.1) == int(1.6 * MIB)
    assert space_floor(64 * MIB, None, 0.1) == 64 * MIB
    assert space_floor(0, 16 * MIB, 0.1) == 0
