"""CPU the local_process wrapper spends logging a job's output, for the wrapper and alternatives.

    python tests/local_process/measure_log_cpu.py [--repeat N] [--only VARIANT]

Runs the real wrapper text (``wrapper_script``) with its log reader replaced by each variant,
under dash + GNU tools and, when installed, busybox sh + tools, for three jobs (log limit 4 MiB):

* ``fast 100 MiB``: ``head -c 104857600 /dev/zero`` (96 MiB beyond the limit are drained);
* ``10,000 lines``: a dash loop echoing 10,000 short lines as fast as it can (one write each);
* ``30 x 100 ms``: a line, then ``sleep 0.1``, 30 times.

The wrapper's CPU is wait4()'s rusage of the wrapper (it and every process it waited for: the
log reader, its dd/wc/head, the job) minus the job's own (``times`` in the job's shell, 10 ms
resolution). The median of the repeats is shown, with the wall time of the whole Attempt.
Variants:

* ``head`` - ``head -c LIMIT >> log`` (writes through stdio: nothing shows before 4 KiB or the end);
* ``dd count=1`` - a loop of ``dd bs=min(64 KiB, room) count=1`` and ``wc -c`` of the log: one
  read per spawn;
* ``dd bs=1`` - one ``dd bs=1 count=LIMIT``: one read and one write per byte;
* ``wrapper`` - the wrapper as it is: a loop of ``dd bs=B count=C`` (B = room / 1024, 1 to
  4 KiB, B * C <= room) and ``wc -c`` of the log.

Medians of 3 on a loaded 2-core machine (CPU seconds of the wrapper; 100 MiB / 10,000 lines /
30 x 100 ms):

    dash + GNU  head        0.026  0.019  0.019
    dash + GNU  dd count=1  0.149  0.022  0.091
    dash + GNU  dd bs=1     1.644  0.050  0.022   (the 100 MiB job took 2.1 s instead of 0.04)
    dash + GNU  wrapper     0.032  0.022  0.026
    busybox     head        0.198  0.016  0.019   (busybox wc drains 96 MiB in 4 KiB stdio reads)
    busybox     dd count=1  0.564  0.024  0.087
    busybox     dd bs=1     1.850  0.052  0.021
    busybox     wrapper     0.182  0.017  0.028
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from qinglong.plugins.local_process.wrapper import find_tools, wrapper_argv, wrapper_script

LIMIT = 4 * 1024 * 1024
JOBS = {
    "fast 100 MiB": "head -c 104857600 /dev/zero",
    "10,000 lines": 'i=0; while [ $i -lt 10000 ]; do echo "line $i"; i=$((i+1)); done',
    "30 x 100 ms": 'i=0; while [ $i -lt 30 ]; do echo "tick $i"; sleep 0.1; i=$((i+1)); done',
}
READER = re.compile(r"^\{\n  trap '' TERM INT HUP\n.*?^\} <&8 7>&- 8<&- 9<&- &\n", re.S | re.M)
VARIANTS = {
    "head": """{ trap '' TERM INT HUP; @HEAD@ -c "$QINGLONG_L" >>"$QINGLONG_D/log"; \
QINGLONG_N=$(@WC@ -c) && printf 'dropped=%s\\n' $QINGLONG_N >>"$QINGLONG_D/receipt"; } <&8 7>&- 8<&- 9<&- &
""",
    "dd count=1": """{
  trap '' TERM INT HUP
  : >>"$QINGLONG_D/log"
  QINGLONG_K=$QINGLONG_L
  while [ "$QINGLONG_K" -gt 0 ]; do
    QINGLONG_B=65536; [ "$QINGLONG_K" -lt 65536 ] && QINGLONG_B=$QINGLONG_K
    @DD@ bs="$QINGLONG_B" count=1 >>"$QINGLONG_D/log" 2>/dev/null || break
    QINGLONG_N=$((QINGLONG_L - $(@WC@ -c <"$QINGLONG_D/log")))
    [ "$QINGLONG_N" -lt "$QINGLONG_K" ] || break
    QINGLONG_K=$QINGLONG_N
  done
  QINGLONG_N=$(@WC@ -c) && printf 'dropped=%s\\n' $QINGLONG_N >>"$QINGLONG_D/receipt"
} <&8 7>&- 8<&- 9<&- &
""",
    "dd bs=1": """{ trap '' TERM INT HUP; @DD@ bs=1 count="$QINGLONG_L" >>"$QINGLONG_D/log" 2>/dev/null; \
QINGLONG_N=$(@WC@ -c) && printf 'dropped=%s\\n' $QINGLONG_N >>"$QINGLONG_D/receipt"; } <&8 7>&- 8<&- 9<&- &
""",
    "wrapper": None,
}


def script_for(variant: str, tools: dict[str, str]) -> str:
    script = wrapper_script(tools)
    if VARIANTS[variant] is None:
        return script
    assert READER.search(script), "the wrapper's log reader was not found"
    reader = VARIANTS[variant]
    for name in ("head", "dd", "wc"):
        reader = reader.replace(f"@{name.upper()}@", tools[name])
    return READER.sub(lambda _: reader, script, count=1)


def job_cpu(times_output: str) -> float:
    return sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", times_output))


def one_run(tools: dict[str, str], script: str, job: str, tmp: Path, n: int) -> tuple[float, float]:
    attempt = tmp / f"a{n}"
    attempt.mkdir(mode=0o700)
    side = tmp / f"times{n}"
    read_end, write_end = os.pipe()
    argv = wrapper_argv(tools, script, str(attempt), LIMIT, ["/bin/sh", "-c", f"{job}; times > {side}"],
                        pipe_inode=os.fstat(read_end).st_ino)
    lock = os.open(attempt, os.O_RDONLY | os.O_DIRECTORY)
    began = time.monotonic()
    pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=[
        (os.POSIX_SPAWN_DUP2, lock, 0), (os.POSIX_SPAWN_DUP2, write_end, 1),
        (os.POSIX_SPAWN_DUP2, read_end, 2)])
    for fd in (lock, read_end, write_end):
        os.close(fd)
    _, status, usage = os.wait4(pid, 0)
    wall = time.monotonic() - began
    receipt = (attempt / "receipt").read_text()
    assert os.waitstatus_to_exitcode(status) == 0 and "status=0" in receipt, receipt
    log = (attempt / "log").stat().st_size
    dropped = int(receipt.split("dropped=")[1].split()[0]) if "dropped=" in receipt else 0
    assert log <= LIMIT, log
    if "104857600" in job:
        assert log == LIMIT and dropped == 104857600 - LIMIT, (log, dropped)
    shutil.rmtree(attempt)
    return usage.ru_utime + usage.ru_stime - job_cpu(side.read_text()), wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=list(VARIANTS))
    args = parser.parse_args()
    toolsets = {"dash + GNU": find_tools()}
    toolsets["dash + GNU"]["head"] = shutil.which("head")
    tmp = Path(tempfile.mkdtemp())
    if shutil.which("busybox"):
        bb = tmp / "busybox"
        bb.mkdir()
        for tool in ("sh", "head", "dd", "wc", "sleep"):
            (bb / tool).symlink_to(shutil.which("busybox"))
        toolsets["busybox"] = {tool: str(bb / tool) for tool in ("sh", "head", "dd", "wc", "sleep")}
    n = 0
    for label, tools in toolsets.items():
        for variant in ([args.only] if args.only else VARIANTS):
            script = script_for(variant, tools)
            cells = []
            for job_name, job in JOBS.items():
                cpu, wall = [], []
                for _ in range(args.repeat):
                    n += 1
                    c, w = one_run(tools, script, job, tmp, n)
                    cpu.append(c)
                    wall.append(w)
                cells.append(f"{job_name}: {statistics.median(cpu):6.3f} s CPU "
                             f"({statistics.median(wall):5.2f} s wall)")
            print(f"{label:10} {variant:10} | " + " | ".join(cells), flush=True)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
