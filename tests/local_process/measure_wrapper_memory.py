"""Memory the local_process wrapper adds per running job: its process group minus the job.

    python tests/local_process/measure_wrapper_memory.py

Starts ``sh -c 'echo $$ > F; exec sleep 600'`` (the job is then ``sleep``), waits until the
group holds the wrapper, its log reader and the job, and sums VmRSS (/proc/PID/status) and Pss
and private pages (/proc/PID/smaps_rollup) of every member but the job. VmRSS counts the pages a
shell shares with every other shell of the machine once per process; Pss splits them.
Under busybox too when it is installed.
"""
import asyncio, shutil, signal, tempfile
from pathlib import Path
from qinglong.contracts.execution import ExecutionSpec, ExecutorContext, StartRequest, minimal_environment
from qinglong.plugins.local_process.executor import LocalProcessExecutor
from qinglong.plugins.local_process.procfs import group_members

def field(pid, name, path="status"):
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0

async def measure(tools, label, tmp):
    ex = LocalProcessExecutor(ExecutorContext(tmp, minimal_environment(None), 1000), tools)
    jobpid = Path(tmp) / f"{label}.jobpid"
    req = StartRequest("r", label, 1, 0, ExecutionSpec(("sh", "-c", f"echo $$ > {jobpid}; exec sleep 600")), f"{tmp}/{label}")
    h = await ex.start(req)
    while not (jobpid.exists() and jobpid.read_text().strip()):
        await asyncio.sleep(0.01)
    job = int(jobpid.read_text())
    while len(group_members(h.pgid)) < 4:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    wrapper = [p for p in group_members(h.pgid) if p != job]
    rss = sum(field(p, "VmRSS") for p in wrapper)
    pss = sum(field(p, "Pss", "smaps_rollup") for p in wrapper)
    priv = sum(field(p, "Private_Dirty", "smaps_rollup") + field(p, "Private_Clean", "smaps_rollup") for p in wrapper)
    names = [Path(f"/proc/{p}/comm").read_text().strip() for p in wrapper]
    print(f"{label}: {len(wrapper)} processes {names}: VmRSS {rss} KiB, Pss {pss} KiB, private {priv} KiB; the job (sleep) VmRSS {field(job, 'VmRSS')} KiB")
    ex.signal(h, signal.SIGKILL)
    await ex.wait(req.attempt_dir, h)

async def main():
    tmp = tempfile.mkdtemp()
    await measure(None, "dash+coreutils", tmp)
    if shutil.which("busybox"):
        bb = Path(tmp) / "bb"; bb.mkdir()
        for t in ("sh", "dd", "wc", "mv"):
            (bb / t).symlink_to(shutil.which("busybox"))
        await measure({t: str(bb / t) for t in ("sh", "dd", "wc", "mv")}, "busybox", tmp)
asyncio.run(main())
