"""The operator's commands on the cluster's Runs, from any machine with the runtime role:
``runs``, ``runs show``, ``runs cancel`` and ``logs`` as ``qinglong`` subprocesses, reading and
cancelling what a worker did through the real protocol (the store's functions as
the gateway role, see ``control_helpers.ProtocolWorker``); log retention by a real
``qinglong run``."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import uuid

from qinglong.host.cli.runs import tail_offset

from tests.cluster.control_helpers import (
    PATIENCE_S,
    ProtocolWorker,
    Replica,
    admit,
    attempts_of,
    clean_env,
    cli,
    cli_json,
    publish,
    wait_for,
    write_settings,
)


def _text(result: subprocess.CompletedProcess) -> str:
    return result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")


def test_runs_cancel_ends_a_queued_cluster_run_at_once_and_a_running_ones_worker_reads_it_in_its_heartbeat(
        cluster, tmp_path):
    """A queued Run left queued by a cancel would still be handed to a worker and run; a running
    one whose request never reached its worker would run to the end; a cancel that answered
    before it was durable could be lost."""
    settings = write_settings(tmp_path / "cli.toml", cluster)
    busy = admit(cluster, publish(cluster, "busy", ["sleep", "600"]), offset_ms=-2000)
    later = admit(cluster, publish(cluster, "later", ["true"]))
    worker = ProtocolWorker(cluster, "w-cancel")
    try:
        (lease,) = worker.claim(1)  # dispatch order: the older occurrence first
        assert lease.run_id == busy
        worker.started(lease)

        result = cli(settings, "runs", "cancel", later)
        assert result.returncode == 0, _text(result)
        assert f"run {later}: cancelled (it was queued)" in result.stdout.decode()
        shown = cli_json(settings, "runs", "show", later)
        assert shown["state"] == "cancelled" and shown["finished_at_ms"] is not None
        (attempt,) = shown["attempts"]
        assert (attempt["state"], attempt["cancel_reason"]) == ("cancelled", "operator")
        assert worker.claim(4) == [], "a cancelled Run was still handed to a worker"
        assert "had already ended: cancelled" in cli(settings, "runs", "cancel", later).stdout.decode()

        assert worker.heartbeat([lease.attempt_id]) == {}
        answer = cli_json(settings, "runs", "cancel", busy)
        assert answer == {"run_id": busy, "state_before": "running", "state": "running"}
        shown = cli_json(settings, "runs", "show", busy)
        assert shown["state"] == "running"
        assert shown["attempts"][0]["cancel_reason"] == "operator"
        assert worker.heartbeat([lease.attempt_id]) == {lease.attempt_id: "operator"}
        text = cli(settings, "runs", "cancel", busy).stdout.decode()
        assert "cancel requested" in text and "heartbeat" in text
        assert worker.complete(lease, "cancelled", reason="cancelled by an operator") == ("accepted", "cancelled")
        assert cli_json(settings, "runs", "show", busy)["state"] == "cancelled"
        assert [r["run_id"] for r in cli_json(settings, "runs", "--state", "cancelled")] == [later, busy]
    finally:
        worker.close()
    for args in (("runs", "cancel", str(uuid.uuid4())), ("runs", "cancel", "nope")):
        result = cli(settings, *args)
        assert result.returncode == 3 and result.stdout == b"", _text(result)
        assert "does not exist" in result.stderr.decode()


def test_runs_show_and_logs_read_exactly_what_the_worker_stored(cluster, tmp_path):
    """The first question about a scheduler: did my job run, where, how did it end, what did it
    print. A log re-encoded (binary output, text that is not UTF-8), cut at a chunk boundary, read
    from the wrong Attempt, or a cut log that did not say so would answer it wrongly."""
    settings = write_settings(tmp_path / "cli.toml", cluster)
    run_id = admit(cluster, publish(cluster, "talk", ["sh", "-c", "..."],
                                    retry={"max_attempts": 2, "initial_backoff_ms": 0, "jitter": 0}))
    first_log = b"first attempt\n"
    body = b"".join(b"line %06d \xff\xfe\x00 not utf-8\n" % i for i in range(12_000))  # > one chunk
    second_log = b"\xff\xfe\x00raw\n" + body + b"line-a\nline-b\nlast-no-newline"
    worker = ProtocolWorker(cluster, "w-logs")
    try:
        (lease,) = worker.claim(1)
        worker.started(lease)
        worker.ship(lease, first_log)
        assert worker.complete(lease, "failed", exit_code=3, log_bytes=len(first_log))[1] == "retry_wait"
        (lease2,) = worker.claim(1)
        assert (lease2.run_id, lease2.attempt_no) == (run_id, 2)
        worker.started(lease2)
        assert worker.ship(lease2, second_log, chunk=100_000) == len(second_log)
        assert worker.complete(lease2, "succeeded", exit_code=0, log_bytes=len(second_log),
                               dropped=1234) == ("accepted", "succeeded")
    finally:
        worker.close()

    (listed,) = [r for r in cli_json(settings, "runs") if r["run_id"] == run_id]
    assert (listed["state"], listed["attempts"], listed["exit_code"]) == ("succeeded", 2, 0)
    assert isinstance(listed["duration_ms"], int) and listed["duration_ms"] >= 0
    assert listed["idempotency_key"].startswith("ql3:cron:v1:talk:")
    assert [r["run_id"] for r in cli_json(settings, "runs", "--state", "succeeded", "--task", "talk")] == [run_id]
    assert cli_json(settings, "runs", "--state", "failed") == []
    assert [r["run_id"] for r in cli_json(settings, "runs", "--trigger", "talk")] == [run_id]

    shown = cli_json(settings, "runs", "show", run_id)
    assert [(a["attempt_no"], a["state"], a["exit_code"], a["worker_id"]) for a in shown["attempts"]] == [
        (1, "failed", 3, "w-logs"), (2, "succeeded", 0, "w-logs")]
    assert [(a["log_bytes"], a["log_dropped_bytes"], a["log_deleted"]) for a in shown["attempts"]] == [
        (len(first_log), 0, False), (len(second_log), 1234, False)]
    text = cli(settings, "runs", "show", run_id).stdout.decode()
    assert "w-logs" in text and "succeeded" in text

    result = cli(settings, "logs", run_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout == second_log
    assert "1234 more bytes of output were dropped" in result.stderr.decode()
    assert cli(settings, "logs", run_id, "--attempt", "1").stdout == first_log
    for lines in (1, 5000):
        expected = second_log[tail_offset(io.BytesIO(second_log), len(second_log), lines):]
        assert cli(settings, "logs", run_id, "--tail", str(lines)).stdout == expected, lines
    assert cli(settings, "logs", run_id, "--tail", "2").stdout == b"line-b\nlast-no-newline"

    missing = cli(settings, "logs", run_id, "--attempt", "3")
    assert missing.returncode == 3 and "has no attempt 3" in missing.stderr.decode()
    for args in (("logs", "nope"), ("runs", "show", "nope"), ("runs", "show", str(uuid.uuid4())),
                 ("logs", str(uuid.uuid4()))):
        result = cli(settings, *args)
        assert result.returncode == 3 and result.stdout == b"", (args, _text(result))
        assert "does not exist" in result.stderr.decode(), args


def test_logs_follow_prints_what_is_shipped_while_it_runs_and_ends_when_the_attempt_ends(cluster, tmp_path):
    """A follower that stopped early would hide the end of the output; one that never stopped
    would hang the operator's terminal (or a script) after the job ended."""
    settings = write_settings(tmp_path / "cli.toml", cluster)
    run_id = admit(cluster, publish(cluster, "tail", ["sh", "-c", "..."]))
    first, second = b"starting\n", b"\x00\x01 binary middle\n" + b"z" * 300_000 + b"\ndone\n"
    worker = ProtocolWorker(cluster, "w-follow")
    try:
        (lease,) = worker.claim(1)
        worker.started(lease)
        worker.ship(lease, first)
        follower = subprocess.Popen([sys.executable, "-m", "qinglong", "logs", run_id, "--follow"],
                                    cwd=tmp_path, env=clean_env(settings), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
        seen = bytearray()

        def read():
            while True:
                block = follower.stdout.read1(65536)
                if not block:
                    return
                seen.extend(block)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            def printed(n: int):
                def check():
                    assert follower.poll() is None, (
                        f"the follower ended while the Attempt runs: {follower.stderr.read()!r}")
                    return len(seen) >= n
                return check

            wait_for(printed(len(first)), "the follower to print the first bytes")
            assert bytes(seen) == first
            worker.ship(lease, second, offset=len(first))
            wait_for(printed(len(first + second)), "the follower to print the new bytes")
            total = len(first + second)
            assert worker.complete(lease, "succeeded", exit_code=0, log_bytes=total)[0] == "accepted"
            assert follower.wait(timeout=PATIENCE_S) == 0, follower.stderr.read()
        finally:
            if follower.poll() is None:
                follower.kill()
            reader.join(PATIENCE_S)
    finally:
        worker.close()
    assert bytes(seen) == first + second


def test_log_retention_prunes_shipped_logs_of_ended_attempts_and_logs_reports_the_tombstone(cluster, tmp_path):
    """Without retention the store grows by every log for ever; one that pruned a running
    Attempt's log would lose output still being written; a pruned log shown as empty would look
    like a job that printed nothing."""
    retention_ms = 2000
    settings = write_settings(tmp_path / "cli.toml", cluster, owner="replica-ret",
                              retention_days=retention_ms / 86_400_000)
    ended = admit(cluster, publish(cluster, "ended", ["sh", "-c", "..."]), offset_ms=-2000)
    running = admit(cluster, publish(cluster, "running", ["sleep", "600"]))
    worker = ProtocolWorker(cluster, "w-ret")
    try:
        lease_ended, lease_running = worker.claim(2)
        assert (lease_ended.run_id, lease_running.run_id) == (ended, running)
        for lease in (lease_ended, lease_running):
            worker.started(lease)
            worker.ship(lease, b"output of " + lease.run_id.encode() + b"\n")
        assert worker.complete(lease_ended, "succeeded", exit_code=0,
                               log_bytes=len(b"output of " + ended.encode() + b"\n"))[0] == "accepted"
        assert cli(settings, "logs", ended).stdout == b"output of " + ended.encode() + b"\n"

        replica = Replica(settings)
        try:
            wait_for(lambda: attempts_of(cluster, ended)[0]["log_deleted_at_ms"] is not None,
                     "log retention to prune the ended Attempt's log")
        finally:
            replica.stop()
        (attempt,) = attempts_of(cluster, ended)
        assert attempt["log_deleted_at_ms"] - attempt["finished_at_ms"] >= retention_ms
        assert cluster.count("attempt_logs", "attempt_id = %s", (attempt["attempt_id"],)) == 0
        assert any(e.get("code") == "cluster_postgres.logs_pruned" for e in replica.events())

        result = cli(settings, "logs", ended)
        assert result.returncode == 3 and result.stdout == b"", _text(result)
        assert "deleted by log retention" in result.stderr.decode()
        assert "log_retention_days" in result.stderr.decode()
        assert cli_json(settings, "runs", "show", ended)["attempts"][0]["log_deleted"] is True

        kept = cli(settings, "logs", running)
        assert kept.returncode == 0 and kept.stdout == b"output of " + running.encode() + b"\n"
        assert attempts_of(cluster, running)[0]["log_deleted_at_ms"] is None
    finally:
        worker.close()


def test_skips_lists_a_cluster_run_its_task_skipped_and_runs_no_longer_does(cluster, tmp_path):
    """On the cluster `skips` read only the triggers' misfires: a 'forbid' skip stayed a
    cancelled Run, so `skips` showed 0 while 97 Runs were skipped."""
    settings = write_settings(tmp_path / "cli.toml", cluster)
    trigger = publish(cluster, "f", ["true"], concurrency="forbid")
    first = admit(cluster, trigger, offset_ms=-3000)
    second = admit(cluster, trigger, offset_ms=-1000)
    worker = ProtocolWorker(cluster, "w-skip")
    try:
        (lease,) = worker.claim(4)
        assert lease.run_id == first
    finally:
        worker.close()
    skipped = [s for s in cli_json(settings, "skips") if s.get("kind") == "run"]
    assert [(s["run_id"], s["task_id"], s["reason"]) for s in skipped] == [
        (second, "f", f"skipped: concurrency 'forbid' and run {first} of this task is still running")]
    text = cli(settings, "skips").stdout.decode()
    assert "runs skipped before they started" in text and second in text
    assert second not in {r["run_id"] for r in cli_json(settings, "runs")}
