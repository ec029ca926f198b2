"""A job tries to read its worker's token every way it can (its environment, its argv, its working
directory, the token file, /proc of every ancestor) through a real gateway, a real worker and real
jobs on real PostgreSQL. With ``[worker] run_as`` every way fails; the test runs as root and makes
the job user with ``useradd``."""

from __future__ import annotations

import json
import pwd
import signal
import subprocess

from tests.gateway.helpers import ApiGateway, plane_settings, register, start_gateway_worker
from tests.worker.helpers import admit, attempts, publish_task, py_job, stored_log, wait_run_state

JOB_USER = "qinglong-job"

#: The job: report, as JSON, every place it found the token and every read that was refused.
PROBE = r"""
import json, os, sys
token_file = sys.argv[1]
marker = ("ql" + "w_").encode()  # not spelt out: this text is in the job's own argv
found, refused = [], []
def look(where, read):
    try:
        data = read()
    except OSError as exc:
        refused.append(where)
        return
    if marker in data:
        found.append(where)
look("environ", lambda: "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode())
look("argv", lambda: "\0".join(sys.argv).encode())
look("cwd", lambda: b"".join(open(os.path.join(os.getcwd(), n), "rb").read() for n in os.listdir(".")
                               if os.path.isfile(n)))
look("token_file", lambda: open(token_file, "rb").read())
pid = os.getppid()
while pid > 1:
    for name in ("environ", "cmdline"):
        look(f"/proc/ancestor/{name}", lambda: open(f"/proc/{pid}/{name}", "rb").read())
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        cmdline = []
    for i, arg in enumerate(cmdline[:-1]):
        if arg == b"--settings":
            look("settings_file", lambda: open(cmdline[i + 1], "rb").read())
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
print(json.dumps({"found": sorted(set(found)), "refused": sorted(set(refused)), "uid": os.getuid()}))
"""


def ensure_job_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(JOB_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER],
                       check=True)
        return pwd.getpwnam(JOB_USER)


def probe_report(cluster, tmp_path, name: str, **worker) -> dict:
    settings = plane_settings(cluster, tmp_path)
    token = register(settings, name)
    api = ApiGateway(settings, tmp_path / "api.stderr")
    process = None
    try:
        token_file = tmp_path / f"{name}.token"
        trigger = publish_task(cluster, f"probe-{name}", {"command": py_job(PROBE, str(token_file)),
                                                          "timeout_ms": 60_000})
        run_id = admit(cluster, trigger)
        process = start_gateway_worker(api.url, token, tmp_path, name, **worker)
        assert wait_run_state(cluster, run_id) == "succeeded", process.text()
        (attempt,) = attempts(cluster, run_id)
        process.signal(signal.SIGTERM)
        assert process.wait() == 0
        return json.loads(stored_log(cluster, attempt["attempt_id"]))
    finally:
        if process is not None:
            process.stop()
        api.stop()


def test_a_job_run_as_another_user_cannot_read_its_workers_token_any_way(cluster, tmp_path):
    """Otherwise any task's author could read the worker's token and act as that worker (claim its
    Runs, read their payloads and env secrets, fence it)."""
    user = ensure_job_user()
    tmp_path.chmod(0o755)  # the job may see the folder; the token file in it stays 0600
    report = probe_report(cluster, tmp_path, "w-iso", run_as=JOB_USER)
    assert report["uid"] == user.pw_uid
    assert report["found"] == []
    assert {"token_file", "/proc/ancestor/environ"} <= set(report["refused"])


def test_without_run_as_a_job_of_the_workers_own_user_can_read_the_token_file(cluster, tmp_path):
    """What the docs say a job running as the worker's own user reaches: the token file (so it can act
    as this one worker, nothing more). This is the case run_as closes; if this ever read nothing, the
    test above would prove nothing."""
    report = probe_report(cluster, tmp_path, "w-same")
    assert "token_file" in report["found"]
    assert "environ" not in report["found"] and "argv" not in report["found"]
