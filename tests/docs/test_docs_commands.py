"""Every shell command shown in README.md and docs/*.md runs, in the order shown, against a real
store in a sandbox: the edge profile on a temporary SQLite file, and the cluster page against the
suite's PostgreSQL. A command that fails with a usage error (exit 2) or a traceback (exit 1), or
with any exit code its page does not lead a reader to expect, fails here, so a page cannot drift
from the code.

Shell commands are fenced blocks marked ``sh``/``bash``/``shell``/``console`` and indented
blocks whose first word is a program (``qinglong``, ``pip``, ...). ``RUN`` in a command stands for
a Run id: the newest Run of the store at that moment. ``qinglong run`` and ``qinglong worker``
without ``--for-seconds`` run until stopped: they are started in the background, as a reader
starts them in another terminal, and stopped with SIGTERM (exit 0) after the page's last command.
What cannot run in a sandbox is in :data:`NOT_RUN`, each with its reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE_SHELLS = {"sh", "bash", "shell", "console"}
#: The first word of an indented block that makes it a block of shell commands.
PROGRAMS = {"qinglong", "pip", "python", "python3", "docker", "podman", "kubectl", "systemctl", "curl",
            "openssl", "deploy/systemd/install.sh", "printf", "cd", "env"}

#: Commands that are not run here, by a pattern of the command, with the reason. Short on purpose.
NOT_RUN: dict[str, str] = {
    r"^pip install ": "installs into an environment; tests/deploy/test_containerfile.py and "
                      "test_systemd_install.py run the install steps in fresh ones",
    r"^python -m pytest": "the test suite itself",
    r"^docker build ": "no container engine here; tests/deploy/test_containerfile.py runs the "
                       "Containerfile's steps",
    r"^deploy/systemd/install\.sh": "changes the host (a user, /etc, /opt); "
                                    "tests/deploy/test_systemd_install.py runs it in a mount namespace",
    r"^systemctl ": "needs a running systemd",
    r"^python -m venv /tmp/v ": "installs a third-party plugin (./your-plugin); "
                                "tests/host/test_host_profile_installs.py does it in a fresh venv",
    r"^printf '\[plugins\]": "the settings of that plugin test (above)",
    r"^/tmp/v/bin/qinglong ": "the venv of that plugin test (above)",
    r"^qinglong --settings /tmp/s\.toml ": "needs the interval plugin of that test installed "
                                           "(examples/interval-trigger/tests run it)",
}
#: Pages whose commands run against the cluster profile (the suite's PostgreSQL).
CLUSTER_PAGES = {"cluster.md"}
#: A command that runs until it is stopped.
LONG_RUNNING = re.compile(r"^qinglong (run|worker)\s*(#.*)?$")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _block_commands(page: str, start: int, lines: list[str]) -> list[Command]:
    """Commands of one block: continuation lines joined, blank lines and comments dropped."""
    found, pending, first = [], "", start
    for offset, line in enumerate(lines):
        text = line.strip()
        if not pending:
            first = start + offset
            if not text or text.startswith("#"):
                continue
        pending += text
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        found.append(Command(page, first, pending))
        pending = ""
    return found


def shell_commands(path: Path) -> list[Command]:
    """Every shell command of a page, in order."""
    page = path.name
    lines = path.read_text().splitlines()
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if fence:
            indent, info = fence.groups()
            j = i + 1
            while not re.match(rf"^{re.escape(indent)}```\s*$", lines[j]):
                j += 1
            if info in FENCE_SHELLS:
                body = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:j]]
                commands += _block_commands(page, i + 2, body)
            i = j + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            block = lines[i:j]
            words = block[0].split()
            if words and words[0] in PROGRAMS:
                commands += _block_commands(page, i + 1, [line[4:] for line in block])
            i = j
            continue
        i += 1
    return commands


def _not_run(command: Command) -> str | None:
    for pattern, reason in NOT_RUN.items():
        if re.search(pattern, command.text):
            return reason
    return None


def _split_install(command: Command) -> Command:
    """``pip install ... && qinglong demo``: the installation is the environment this test runs
    in; what follows the ``&&`` runs."""
    if command.text.startswith("pip install ") and " && " in command.text:
        return Command(command.page, command.line, command.text.split(" && ", 1)[1])
    return command


class Sandbox:
    """A page's sandbox: its own directory (the working directory and HOME), the profile's
    settings, the `qinglong` of this checkout first on PATH, and the background processes."""

    def __init__(self, root: Path, settings: Path | None) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        self.env.update(HOME=str(root), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                        PYTHONPATH=str(REPO))
        if settings is not None:
            self.env["QINGLONG_SETTINGS"] = str(settings)
        self.background: list[tuple[Command, subprocess.Popen, Path]] = []

    def newest_run(self) -> str:
        result = subprocess.run(["qinglong", "runs", "--json", "--limit", "1"], env=self.env, cwd=self.root,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        runs = json.loads(result.stdout)
        assert runs, "a command names RUN, but the store has no Run yet"
        return runs[0]["run_id"]

    def run(self, command: Command) -> subprocess.CompletedProcess:
        text = command.text
        if re.search(r"\bRUN\b", text):
            text = re.sub(r"\bRUN\b", self.newest_run(), text)
        return subprocess.run(["bash", "-c", text], env=self.env, cwd=self.root, capture_output=True, text=True,
                              timeout=180)

    def start(self, command: Command, ready: str) -> None:
        log = self.root / f"background-{len(self.background)}.stderr"
        with open(log, "w") as err:
            process = subprocess.Popen(["bash", "-c", f"exec {command.text}"], env=self.env, cwd=self.root,
                                       stdout=subprocess.DEVNULL, stderr=err)
        self.background.append((command, process, log))
        deadline = time.monotonic() + 120
        while ready not in log.read_text():
            assert process.poll() is None, f"{command} exited {process.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"{command}: no {ready!r} within 120 s: {log.read_text()}"
            time.sleep(0.1)

    def stop(self) -> list[str]:
        problems = []
        for command, process, log in reversed(self.background):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            logged = log.read_text()
            if code != 0 or "Traceback" in logged:
                problems.append(f"{command}: exit {code} after SIGTERM\n{logged[-2000:]}")
        self.background.clear()
        return problems


#: What a long-running command writes once it is up.
READY_LINE = {"run": "scheduler_started", "worker": "worker.session_opened"}


def run_page(commands: list[Command], sandbox: Sandbox) -> list[str]:
    """Run a page's commands in order; the problems found, one paragraph each."""
    problems = []
    try:
        for command in commands:
            command = _split_install(command)
            if _not_run(command) is not None:
                continue
            long_running = LONG_RUNNING.match(command.text)
            if long_running:
                sandbox.start(command, READY_LINE[long_running.group(1)])
                continue
            result = sandbox.run(command)
            if result.returncode != 0 or "Traceback" in result.stderr:
                hint = ("\n(a synopsis, with [optional] parts or A|B choices, in a block of commands: write it "
                        "as a command a reader can run, or put it in a table)"
                        if re.search(r"\[-|\w\|\w", command.text) else "")
                problems.append(f"{command}: exit {result.returncode}\n{result.stderr[-2000:]}{hint}")
    finally:
        problems += sandbox.stop()
    return problems


def test_every_page_with_commands_is_found_and_every_skipped_command_has_a_reason():
    """A page whose blocks the extraction missed (a new fence language, an indented block under
    another first word) would be left untested without a sign; a pattern of the list that no
    longer matches a command hides nothing but is dead weight, so the list stays short."""
    commands = [c for path in PAGES for c in shell_commands(path)]
    pages = {c.page for c in commands}
    assert {"README.md", "cluster.md", "execution.md", "operations.md", "plugins.md"} <= pages, pages
    used = {pattern for pattern in NOT_RUN for c in commands if re.search(pattern, _split_install(c).text)
            or re.search(pattern, c.text)}
    assert used == set(NOT_RUN), f"patterns matching no command: {sorted(set(NOT_RUN) - used)}"
    for command in commands:
        assert command.text.split()[0] in PROGRAMS | {"/tmp/v/bin/qinglong"} or _not_run(command), command


def _runnable(path: Path) -> bool:
    return any(_not_run(_split_install(c)) is None for c in shell_commands(path))


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in CLUSTER_PAGES and _runnable(p)],
                         ids=lambda p: p.name)
def test_every_command_of_the_page_runs_on_the_edge_profile(page, tmp_path):
    """A documented command that no longer parses (a renamed option), that fails on the state
    the page itself built, or that prints a traceback is what a new user meets first."""
    problems = run_page(shell_commands(page), Sandbox(tmp_path, None))
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("page", sorted(CLUSTER_PAGES))
def test_every_command_of_the_cluster_page_runs_against_postgresql(page, tmp_path):
    """The cluster page's commands (migrate, wait, a replica, a worker) with a settings file as
    the page shows it, on a fresh database of the suite's PostgreSQL with its four roles."""
    from tests.support.pg import ROLE_PASSWORDS, create_database, create_roles, start_server

    server = start_server("pg18")
    try:
        create_roles(server)
        create_database(server, "qinglong")

        def dsn(role: str) -> str:
            return server.dsn(role, ROLE_PASSWORDS[role], "qinglong")

        settings = tmp_path / "qinglong.toml"
        settings.write_text(
            'profile = "cluster"\n[http]\nlisten = "127.0.0.1:0"\n[backend]\n'
            f'runtime_dsn = "{dsn("qinglong_runtime")}"\nadmin_dsn = "{dsn("qinglong_admin")}"\n'
            f'owner_dsn = "{dsn("qinglong_owner")}"\n'
            f'[worker]\ndsn = "{dsn("qinglong_gateway")}"\nworker_id = "docs-worker"\n')
        problems = run_page(shell_commands(REPO / "docs" / page), Sandbox(tmp_path, settings))
    finally:
        server.destroy()
    assert not problems, "\n\n".join(problems)
