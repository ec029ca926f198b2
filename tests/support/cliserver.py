"""``python -m qinglong ARGS`` for tests, started by fork from an interpreter that has already
imported the libraries every command imports.

The suite starts ``qinglong`` about a thousand times; each start spent about 0.3 s of CPU importing
pydantic, pydantic-settings and dependency-injector before reading its first argument, which on a
2-core machine was minutes of the suite's time. Each command still runs in a process of its own,
with its own working directory, environment, ``sys.path`` and standard streams (the caller's pipes,
passed over a Unix socket) and exits with its own code; only the interpreter's start-up is shared.
Qinglong's own modules are not imported before the fork, so each command imports them as a fresh
``python -m qinglong`` does and reads its environment the same way.

What the fork cannot reproduce runs the plain way: another interpreter, or an environment whose
interpreter settings (``PYTHON*`` other than ``PYTHONPATH``, the locale) differ from the server's.
The tests of starting itself (closure checks, installs, the README's commands) exec a fresh
interpreter as before.
"""

from __future__ import annotations

import array
import atexit
import json
import locale
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Imported before any fork: the libraries every ``qinglong`` command imports, none of Qinglong's.
PRELOAD = ("argparse", "asyncio", "json", "logging", "sqlite3", "zoneinfo", "importlib.metadata",
           "pluggy", "pydantic", "pydantic_settings", "dependency_injector.containers",
           "dependency_injector.providers", "aiosqlite")
#: Environment keys that shape the interpreter itself, fixed when it started.
_INTERPRETER_KEYS = ("LANG", "LC_ALL", "LC_CTYPE")
#: ``PYTHON*`` keys a forked command may differ in: the path is set per command, and unbuffered
#: streams change nothing in output captured whole (the key still reaches the command's children).
_PER_COMMAND_KEYS = ("PYTHONPATH", "PYTHONUNBUFFERED")
_REPO = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct("!I")


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# -- the server ------------------------------------------------------------------------------------

def _run_command(request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python -m qinglong ARGS`` and never return."""
    code = 1
    try:
        os.setpgid(0, 0) if request.get("new_group") else None
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *request["base_path"]]
        import importlib

        importlib.invalidate_caches()
        sys.argv = [str(_REPO / "qinglong" / "__main__.py"), *request["args"]]
        import runpy

        try:
            runpy.run_module("qinglong", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                sys.stderr.write(f"{exc.code}\n")
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        # what the interpreter does at exit: wait for threads, run atexit, flush the streams
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def _serve_one(conn: socket.socket) -> None:
    """In a forked waiter: fork the command, send its pid, wait for it, send its exit status."""
    size = _HEADER.unpack(_recv_exact(conn, _HEADER.size))[0]
    fds_array = array.array("i")
    msg, ancdata, _flags, _addr = conn.recvmsg(size, socket.CMSG_SPACE(3 * fds_array.itemsize))
    while len(msg) < size:
        msg += _recv_exact(conn, size - len(msg))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds_array.frombytes(data[: len(data) - (len(data) % fds_array.itemsize)])
    fds = list(fds_array)
    request = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(_HEADER.pack(pid))
    _, status = os.waitpid(pid, 0)
    conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))


def serve(path: str) -> None:
    """Accept requests on the Unix socket ``path`` until stdin closes (the suite's process ended)."""
    for name in PRELOAD:
        __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is not listener:
                return  # the suite's process is gone
            conn, _ = listener.accept()
            if os.fork() == 0:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                listener.close()
                try:
                    _serve_one(conn)
                finally:
                    os._exit(0)
            conn.close()


# -- the client ------------------------------------------------------------------------------------

class _Server:
    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="qinglong-cli-")
        self.path = os.path.join(self._dir, "s")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        self.env["PYTHONPATH"] = str(_REPO)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.cliserver", self.path],
                                     cwd=_REPO, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.ready = self.proc.stdout.readline() == b"ready\n"
        probe = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                               env={k: v for k, v in self.env.items() if k != "PYTHONPATH"},
                               capture_output=True, text=True, cwd="/")
        # the interpreter's own path (stdlib, site-packages), without its script directory
        self.base_path = [p for p in json.loads(probe.stdout)[1:]]
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:
            os.unlink(self.path)
            os.rmdir(self._dir)
        except OSError:
            pass

    def can_serve(self, python: str, env: dict[str, str]) -> bool:
        if not self.ready or self.proc.poll() is not None or python != sys.executable:
            return False
        keys = {k for k in (*env, *self.env) if k.startswith("PYTHON") and k not in _PER_COMMAND_KEYS}
        return all(env.get(k) == self.env.get(k) for k in (*keys, *_INTERPRETER_KEYS))


_server: _Server | None = None
_server_lock = threading.Lock()


def _get_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        return _server


def _text(data: bytes) -> str:
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def run_qinglong(args: list[str], *, cwd: str | os.PathLike, env: dict[str, str],
                 timeout: float | None = None, input: str | bytes | None = None, text: bool = True,
                 python: str = sys.executable) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-m", "qinglong", *args], capture_output=True, ...)`` with stdin
    empty unless ``input`` is given, and the interpreter's start-up shared (see the module's text)."""
    argv = [python, "-m", "qinglong", *args]
    server = _get_server()
    if not server.can_serve(python, env):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=text, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    request = json.dumps({"args": list(args), "cwd": os.fspath(cwd), "env": env,
                          "base_path": server.base_path}).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(server.path)
        sock.sendall(_HEADER.pack(len(request)))
        sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [stdin_r, out_w, err_w]))])
    except OSError:
        sock.close()
        for fd in (stdin_r, stdin_w, out_r, out_w, err_r, err_w):
            os.close(fd)
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=text, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
    for fd in (stdin_r, out_w, err_w):
        os.close(fd)
    owned = {stdin_w, out_r, err_r}  # closed exactly once each, below

    def close(fd: int) -> None:
        if fd in owned:
            owned.discard(fd)
            os.close(fd)

    selector = selectors.DefaultSelector()
    code: int | None = None
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    try:
        pid = struct.unpack("!I", _recv_exact(sock, 4))[0]
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = input if isinstance(input, bytes) else (input or "").encode(locale.getpreferredencoding(False))
        selector.register(out_r, selectors.EVENT_READ)
        selector.register(err_r, selectors.EVENT_READ)
        selector.register(sock, selectors.EVENT_READ)
        if pending:
            os.set_blocking(stdin_w, False)
            selector.register(stdin_w, selectors.EVENT_WRITE)
        else:
            close(stdin_w)
        while selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout, output=b"".join(chunks[out_r]),
                                                stderr=b"".join(chunks[err_r]))
            for key, _ in selector.select(left):
                if key.fd == stdin_w:
                    try:
                        pending = pending[os.write(stdin_w, pending[:65536]):]
                    except BrokenPipeError:
                        pending = b""
                    if not pending:
                        selector.unregister(stdin_w)
                        close(stdin_w)
                elif key.fileobj is sock:
                    code = struct.unpack("!i", _recv_exact(sock, 4))[0]
                    selector.unregister(sock)
                elif data := os.read(key.fd, 65536):
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    finally:
        selector.close()
        for fd in list(owned):
            close(fd)
        sock.close()
    assert code is not None
    out, err = b"".join(chunks[out_r]), b"".join(chunks[err_r])
    if text:  # as subprocess's text mode reads: the locale's encoding, universal newlines
        return subprocess.CompletedProcess(argv, code, _text(out), _text(err))
    return subprocess.CompletedProcess(argv, code, out, err)


if __name__ == "__main__":
    serve(sys.argv[1])
