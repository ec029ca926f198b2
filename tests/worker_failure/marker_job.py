"""The job every worker failure test runs: it records its own start and end on the machine's
monotonic clock, so the test can tell whether two executions of one Run overlapped.

    python marker_job.py MARKERS HOLD_S EXIT_CODE

* ``MARKERS/<run_id>.<attempt_id>.start`` is created with O_EXCL first thing: ``<monotonic> <pid>``.
  A second start of the same Attempt cannot create it again; it writes
  ``<run_id>.<attempt_id>.dup.<pid>`` instead and exits 99, so a double start is always seen.
* it then waits ``HOLD_S`` seconds, or until ``MARKERS/release`` exists (the test's gate);
* ``<run_id>.<attempt_id>.end`` (O_EXCL): ``<monotonic> <pid> done|term``, written when it is done
  or when TERM arrives (the worker's stop: TERM, then KILL to the process group), then it exits
  ``EXIT_CODE`` (143 after TERM). A job ended by KILL has no end marker: the test's pidfd
  watcher bounds its end from above (the moment it saw the process gone).

Standard library only; the worker's job environment names the Run and Attempt.
"""

import os
import signal
import sys
import time


def _mark(directory: str, name: str, text: str) -> None:
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def main() -> int:
    directory, hold_s, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    key = f"{os.environ['QINGLONG_RUN_ID']}.{os.environ['QINGLONG_ATTEMPT_ID']}"
    pid = os.getpid()

    def end(why: str, status: int):
        try:
            _mark(directory, f"{key}.end", f"{time.monotonic():.6f} {pid} {why}\n")
        except FileExistsError:
            pass
        os._exit(status)

    signal.signal(signal.SIGTERM, lambda *_: end("term", 143))
    try:
        _mark(directory, f"{key}.start", f"{time.monotonic():.6f} {pid}\n")
    except FileExistsError:
        _mark(directory, f"{key}.dup.{pid}", f"{time.monotonic():.6f} {pid}\n")
        return 99
    print(f"job {key} started", flush=True)
    until = time.monotonic() + hold_s
    release = os.path.join(directory, "release")
    while time.monotonic() < until and not os.path.exists(release):
        time.sleep(0.02)
    print(f"job {key} ends with {code}", flush=True)
    end("done", code)
    return code


if __name__ == "__main__":
    sys.exit(main())
