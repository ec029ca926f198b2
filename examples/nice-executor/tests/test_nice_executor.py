"""Tests of the ``nice`` executor: the hook wrapper, a real job started and read back, and a task
run by the real ``qinglong`` with the plugin registered through its own entry point.

Run from the repository root with ``python -m pytest examples/nice-executor/tests`` (Qinglong
importable), or from this folder after ``pip install -e '.[test]'``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pluggy

import qinglong.plugins.local_process as local_process
import qinglong_nice
from qinglong.contracts.execution import (
    ExecutionSpec,
    Executor,
    ExecutorContext,
    FencedExecutor,
    ProcessState,
    StartRequest,
    minimal_environment,
)
from qinglong.contracts.hookspecs import PROJECT_NAME, QinglongHookSpecs

HERE = Path(__file__).resolve().parents[1]


def offered(*plugins) -> dict:
    """The executors pluggy's ``qinglong_executors`` gives with these plugins registered."""
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(QinglongHookSpecs)
    for plugin in plugins:
        manager.register(plugin)
    return {spec.name: spec for items in manager.hook.qinglong_executors() for spec in items}


def context(tmp_path: Path) -> ExecutorContext:
    return ExecutorContext(log_dir=str(tmp_path / "logs"), base_env=minimal_environment(None), kill_grace_ms=2000)


def test_nice_is_offered_beside_local_process_and_only_when_it_can_build_on_it(tmp_path):
    """Without the wrapper, tasks naming ``nice`` would fail to start; offered without a
    ``local_process`` to build on, it would fail on its first job instead of being absent."""
    specs = offered(local_process, qinglong_nice)
    assert sorted(specs) == ["local_process", "nice"]
    assert offered(qinglong_nice) == {}
    executor = specs["nice"].create(context(tmp_path))
    inner = specs["local_process"].create(context(tmp_path))
    assert isinstance(executor, Executor) and executor.name == "nice"
    assert isinstance(executor, FencedExecutor) == isinstance(inner, FencedExecutor)


def _run_job(executor, tmp_path: Path, command: tuple[str, ...], env: dict[str, str]):
    attempt_dir = tmp_path / "logs" / "attempt-1"
    request = StartRequest(run_id="r1", attempt_id="attempt-1", attempt_no=1, scheduled_for_ms=0,
                           spec=ExecutionSpec(command=command, env=env, executor="nice"),
                           attempt_dir=str(attempt_dir))

    async def go():
        handle = await executor.start(request)
        await executor.wait(str(attempt_dir), handle)
        return executor.read_receipt(str(attempt_dir)), executor.probe(str(attempt_dir), handle)

    return asyncio.run(asyncio.wait_for(go(), 120))


def test_a_job_runs_at_a_lower_priority_and_its_receipt_is_read_back(tmp_path):
    """The whole point of the plugin: a job that ran at the control plane's own priority would
    compete with it for the CPU; one whose receipt were lost would end ``lost``."""
    executor = offered(local_process, qinglong_nice)["nice"].create(context(tmp_path))
    out = tmp_path / "niceness"
    receipt, state = _run_job(executor, tmp_path, ("sh", "-c", 'nice > "$OUT"'), {"OUT": str(out)})
    assert (receipt.exit_code, receipt.signal, state) == (0, None, ProcessState.ENDED)
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + qinglong_nice.NICENESS, 19)
    assert out.read_text().strip() == str(expected)


def test_a_missing_program_ends_with_nices_exit_code(tmp_path):
    """Documented: under ``nice`` a missing program is exit code 127, not a start refusal; a
    receipt claiming success would hide that nothing ran."""
    executor = offered(local_process, qinglong_nice)["nice"].create(context(tmp_path))
    receipt, _ = _run_job(executor, tmp_path, ("no-such-program-for-nice",), {})
    assert receipt.exit_code == 127


def _register_entry_point(site: Path) -> None:
    """A dist-info built from this distribution's own pyproject.toml (name, version, entry points),
    so ``importlib.metadata`` finds the plugin exactly as after ``pip install``."""
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    entry_points = project["entry-points"]["qinglong.plugins"]
    (info / "entry_points.txt").write_text(
        "[qinglong.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))


def test_qinglong_runs_a_task_with_executor_nice(tmp_path):
    """End to end through the host: enabled by entry point, accepted by ``task put --executor``,
    dispatched by ``qinglong run``, its output read back with ``qinglong logs``."""
    site = tmp_path / "site"
    _register_entry_point(site)
    work = tmp_path / "work"
    work.mkdir()
    (work / "settings.toml").write_text('[plugins]\nenable = ["nice"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["QINGLONG_SETTINGS"] = str(work / "settings.toml")

    def qinglong(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "qinglong", *args], cwd=work, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    listed = {p["name"]: p for p in json.loads(qinglong("plugins", "--json"))["plugins"]}
    assert listed["nice"]["loaded"] and listed["nice"]["hooks"] == ["qinglong_executors"]
    qinglong("project", "create", "demo")
    qinglong("task", "put", "demo", "hello", "--executor", "nice", "--", "sh", "-c", 'echo "niceness $(nice)"')
    run_id = json.loads(qinglong("task", "run", "demo", "hello", "--json"))["run_id"]
    server = subprocess.Popen([sys.executable, "-m", "qinglong", "run"], cwd=work, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # until the Run ended (a condition, bounded), not for a fixed time
            [run] = [r for r in json.loads(qinglong("runs", "--json")) if r["run_id"] == run_id]
            if run["state"] not in ("queued", "dispatching", "running"):
                break
            assert server.poll() is None and time.monotonic() < deadline, run
            time.sleep(0.2)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=120)
    assert server.returncode == 0, stderr
    assert (run["state"], run["exit_code"]) == ("succeeded", 0), run
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + qinglong_nice.NICENESS, 19)
    assert qinglong("logs", run_id).strip() == f"niceness {expected}"
    [attempt] = json.loads(qinglong("runs", "show", run_id, "--json"))["attempts"]
    assert attempt["executor"] == "nice"
