"""The shell wrapper that starts, logs and outlives one Attempt's job, and the Attempt directory.

An Attempt directory (mode 0700) holds, for a wrapper of this version (receipt ``format=3``):

* the directory itself is the lock: taken (``flock``, exclusive, on a descriptor of the
  directory) by the executor before it spawns the wrapper and held by the wrapper through an
  inherited descriptor for its whole life: the lock is free exactly when no wrapper is alive for
  this Attempt. Nothing else (the job, the log reader) keeps it;
* ``pid`` - the wrapper's pid (= its session and process group) and a newline, written first
  thing, in place (one ``write``, no helper process): a reader takes a first line without its
  newline (empty, or cut short by the wrapper's death) as not written yet, and without a whole
  first line the job was provably never started. The moment the job's own process ended the
  wrapper appends its status as a second line: the file's mtime is then the Attempt's end time;
* ``log`` - the output, appended (O_APPEND, mode 0600), at most the log limit; what comes after is
  read and counted, so the job never sees a closed pipe. The job's stdout and stderr are one
  anonymous pipe the executor creates (no file), read by the wrapper's log reader;
* ``fence`` - only for a fenced Attempt (a cluster worker's), written before the spawn and renewed
  by renaming a new file over it: an instant of ``/proc/uptime`` in centiseconds, only ever moved
  later. A watcher subshell of the wrapper reads it, sleeps (one ``sleep``) until that instant, at
  most ``FENCE_NAP_CS`` at once, reads it again and kills the whole process group (KILL) once the
  instant passed, or when the file is gone or unreadable: the job ends before its lease can
  expire even when the worker that started it was killed, frozen or cut off and cannot stop it.
  The watcher ignores TERM (a TERM to the group stops the job, not the fence); when the job
  ended the wrapper sends it USR1, on which it kills its ``sleep`` and exits, and waits for it, so
  the group is empty when the receipt appears;
* ``receipt`` - when the job ended and its output was drained the wrapper appends one block in
  one write: ``format=3``, ``status=N`` (the shell's ``$?``: an exit code, or 128 + the signal
  that ended it), ``held=`` (empty; or what still held the job's output ``DRAIN_MS`` after it
  ended: ``term`` - processes left in its group, ended by a TERM; ``killed`` - the group was then
  KILLed, right after the receipt, wrapper included; ``left`` - the orphans policy is ``leave``,
  and the log reader goes on), ``pipe=`` (the output pipe's inode, to name what holds it) and a
  last line ``end``: a receipt without it (a wrapper killed while writing it) counts as none, as
  if killed before; lines after it are not read. Before that block the log reader may have
  written ``dropped=N``, the count of bytes beyond the limit, only when the output reached it
  (no line: nothing dropped). When the receipt cannot be written (the log filesystem filled up
  while the job ran) the same block is appended to ``pid`` instead, after the status line: that
  file's first block is already allocated, so a few more bytes need no free space, and the job's
  exit is recorded rather than lost.

A directory of the previous wrapper (``format=2``: a ``lock`` file, the ``out`` FIFO, the
scratch files ``copied`` and ``dropped``, ``exited``; the receipt written whole by the wrapper)
is still read, probed and adopted: a job that runs across an upgrade keeps its outcome.

The wrapper works with any POSIX ``sh`` (dash, busybox ash, bash as sh): no bash-isms, no
``pipefail``. Its own variables are named ``QINGLONG_*``, a prefix a task's env may not use, so it
never changes a variable the job inherits. Its helpers (``dd``, ``wc``, ``sleep``) are named by
absolute path, found on the minimal PATH when the executor is built, so a task's own PATH cannot
replace them.

The log is readable while the job runs: every read of the pipe is written to it at once (``dd``
with ``bs=``, not a tool writing through stdio, which would hold up to a 4 KiB buffer back until
the job ended), and both the log and the dropped count are exact.

What a job costs: the wrapper shell, its log reader (a subshell), one ``dd`` and the job itself,
for every job whose output ends before 1024 reads and the limit (the shell's builtins do the
rest; a fenced job adds the watcher subshell and one ``sleep`` per renewal of its fence); only a
job printing more costs a ``wc -c`` and another ``dd`` per further 1024 reads, and one reaching
the limit a last ``wc -c`` counting what is dropped. Files created: the directory, ``pid``,
``log`` and ``receipt`` (``fence`` for a fenced job). After the job's own exit the wrapper looks
at its log reader with builtins only (``/proc/<pid>/stat``, up to 200 reads); only when the
reader is still busy after that (something the job left still holds its output) does it poll
with ``sleep`` (5 ms doubling to 200 ms) for at most the drain.
"""

from __future__ import annotations

import shlex
import shutil

from qinglong.contracts.execution import minimal_environment

PID = "pid"
LOG = "log"
RECEIPT = "receipt"
FENCE = "fence"
#: The receipt's format this wrapper writes.
FORMAT = 3
#: Files of a ``format=2`` directory, read to adopt a job started before an upgrade.
LEGACY_LOCK = "lock"
LEGACY_FIFO = "out"
LEGACY_EXITED = "exited"
LEGACY_DROPPED = "dropped"

#: The longest the fence watcher sleeps before it reads the fence again (centiseconds): a bound
#: on how late it notices a fence passed while the machine was suspended (``sleep`` counts the
#: monotonic clock, the fence ``/proc/uptime``).
FENCE_NAP_CS = 1000

#: What the wrapper does with processes that still hold the job's output once the job itself
#: ended and the drain passed: TERM, then KILL, its process group; or leave them running.
ORPHAN_POLICIES = ("kill", "leave")

#: argv[0] of the wrapper shell, as ``ps`` shows it.
WRAPPER_NAME = "qinglong-job"

# $1 = the Attempt directory (absolute), $2 = the log limit in bytes, $3 = the drain in ms,
# $4 = the orphans policy (kill | leave), $5 = the output pipe's inode, $6 = "--", then the argv.
# stdin is the lock (a descriptor of the directory), stdout the output pipe's write end, stderr
# its read end: moved to fds 9, 7 and 8 (each closed for everything that must not hold it),
# then stdin becomes /dev/null for the job and the wrapper's own output goes to /dev/null.
_TEMPLATE = """\
umask 077
exec 9<&0 7>&1 8<&2 </dev/null >/dev/null 2>&1
QINGLONG_D=$1
QINGLONG_L=$2
QINGLONG_G=$3
QINGLONG_O=$4
QINGLONG_J=$5
printf '%s\\n' "$$" >"$QINGLONG_D/pid" || exit 70
trap : TERM INT HUP
QINGLONG_W=
if [ -f "$QINGLONG_D/fence" ]; then
  {
    trap '' TERM INT HUP
    QINGLONG_P=
    trap 'kill -KILL $QINGLONG_P 2>/dev/null; exit 0' USR1
    while :; do
      QINGLONG_F=
      IFS= read -r QINGLONG_F <"$QINGLONG_D/fence"
      IFS=' ' read -r QINGLONG_U QINGLONG_V </proc/uptime
      QINGLONG_U=${QINGLONG_U%.*}${QINGLONG_U#*.}
      QINGLONG_U=${QINGLONG_U#0}
      QINGLONG_U=${QINGLONG_U#0}
      case $QINGLONG_F in '' | 0* | *[!0-9]*) QINGLONG_F=0 ;; esac
      case $QINGLONG_U in '' | *[!0-9]*) QINGLONG_U=$QINGLONG_F ;; esac
      QINGLONG_U=$((QINGLONG_F - QINGLONG_U))
      [ "$QINGLONG_U" -gt 0 ] || kill -KILL 0
      [ "$QINGLONG_U" -le @NAP@ ] || QINGLONG_U=@NAP@
      case $QINGLONG_U in ?) QINGLONG_Z=0.0$QINGLONG_U ;; ??) QINGLONG_Z=0.$QINGLONG_U ;; *) QINGLONG_Z=${QINGLONG_U%??}.${QINGLONG_U#"${QINGLONG_U%??}"} ;; esac
      @SLEEP@ "$QINGLONG_Z" &
      QINGLONG_P=$!
      wait "$QINGLONG_P"
      QINGLONG_P=
    done
  } </dev/null >/dev/null 2>&1 7>&- 8<&- 9<&- &
  QINGLONG_W=$!
fi
{
  trap '' TERM INT HUP
  QINGLONG_K=0
  QINGLONG_E=
  if true >>"$QINGLONG_D/log"; then
    if [ -s "$QINGLONG_D/log" ]; then
      QINGLONG_N=$(@WC@ -c <"$QINGLONG_D/log") && QINGLONG_K=$((QINGLONG_L - $QINGLONG_N))
    else
      QINGLONG_K=$QINGLONG_L
    fi
  fi
  while [ "$QINGLONG_K" -gt 0 ]; do
    QINGLONG_B=$((QINGLONG_K / 1024))
    if [ "$QINGLONG_B" -gt 4096 ]; then QINGLONG_B=4096; elif [ "$QINGLONG_B" -lt 1 ]; then QINGLONG_B=1; fi
    QINGLONG_C=$((QINGLONG_K / QINGLONG_B))
    QINGLONG_X=$(LC_ALL=C @DD@ bs="$QINGLONG_B" count="$QINGLONG_C" 2>&1 >>"$QINGLONG_D/log") || break
    case $QINGLONG_X in
      *" records in"*) QINGLONG_X=${QINGLONG_X%%" records in"*}; QINGLONG_X=${QINGLONG_X##*[!0-9+]} ;;
      *) QINGLONG_X= ;;
    esac
    case $QINGLONG_X in
      *[!0-9+]* | *+*+*) ;;
      [0-9]*+[0-9]*) if [ $((${QINGLONG_X%+*} + ${QINGLONG_X#*+})) -lt "$QINGLONG_C" ]; then QINGLONG_E=1; break; fi ;;
    esac
    QINGLONG_N=$(@WC@ -c <"$QINGLONG_D/log") || break
    QINGLONG_N=$((QINGLONG_L - $QINGLONG_N))
    [ "$QINGLONG_N" -lt "$QINGLONG_K" ] || break
    QINGLONG_K=$QINGLONG_N
  done
  [ -z "$QINGLONG_E" ] || exit 0
  QINGLONG_N=$(@WC@ -c) && printf 'dropped=%s\\n' $QINGLONG_N >>"$QINGLONG_D/receipt"
} <&8 7>&- 8<&- 9<&- &
QINGLONG_R=$!
exec 8<&-
qinglong_reading() {
  QINGLONG_Y=
  { IFS=' ' read -r QINGLONG_N QINGLONG_N QINGLONG_Y QINGLONG_N <"/proc/$QINGLONG_R/stat"; } 2>/dev/null
  [ -n "$QINGLONG_Y" ] && [ "$QINGLONG_Y" != Z ]
}
qinglong_drain() {
  QINGLONG_T=0
  QINGLONG_Q=5
  QINGLONG_I=0
  while [ "$QINGLONG_I" -lt 200 ] && qinglong_reading; do QINGLONG_I=$((QINGLONG_I + 1)); done
  while qinglong_reading; do
    [ "$QINGLONG_T" -lt "$QINGLONG_G" ] || return 1
    case $QINGLONG_Q in ?) QINGLONG_Z=0.00$QINGLONG_Q ;; ??) QINGLONG_Z=0.0$QINGLONG_Q ;; *) QINGLONG_Z=0.$QINGLONG_Q ;; esac
    @SLEEP@ "$QINGLONG_Z"
    QINGLONG_T=$((QINGLONG_T + QINGLONG_Q))
    QINGLONG_Q=$((QINGLONG_Q * 2))
    [ "$QINGLONG_Q" -le 200 ] || QINGLONG_Q=200
  done
}
shift 6
"$@" >&7 2>&7 7>&- 9<&-
QINGLONG_S=$?
exec 7>&-
printf '%s\\n' "$QINGLONG_S" >>"$QINGLONG_D/pid"
QINGLONG_H=
if ! qinglong_drain; then
  if [ "$QINGLONG_O" = kill ]; then
    kill -TERM 0 2>/dev/null
    if qinglong_drain; then QINGLONG_H=term; else QINGLONG_H=killed; fi
  else
    QINGLONG_H=left
  fi
fi
if [ -z "$QINGLONG_H" ] || [ "$QINGLONG_H" = term ]; then
  wait "$QINGLONG_R"
  while [ "$?" -gt 128 ] && kill -0 "$QINGLONG_R" 2>/dev/null; do wait "$QINGLONG_R"; done
fi
if [ -n "$QINGLONG_W" ]; then
  kill -USR1 "$QINGLONG_W" 2>/dev/null
  wait "$QINGLONG_W"
  while [ "$?" -gt 128 ] && kill -0 "$QINGLONG_W" 2>/dev/null; do wait "$QINGLONG_W"; done
fi
printf 'format=3\\nstatus=%s\\nheld=%s\\npipe=%s\\nend\\n' "$QINGLONG_S" "$QINGLONG_H" "$QINGLONG_J" >>"$QINGLONG_D/receipt" ||
  printf 'format=3\\nstatus=%s\\nheld=%s\\npipe=%s\\nend\\n' "$QINGLONG_S" "$QINGLONG_H" "$QINGLONG_J" >>"$QINGLONG_D/pid"
[ "$QINGLONG_H" != killed ] || kill -KILL 0
"""

# What the wrapper does, step by step:
# - `trap : TERM INT HUP`: a TERM sent to the group ends the job but not the wrapper, which
#   then records the job's status (a handler, not an ignore: the job gets default dispositions);
# - the job runs in the foreground (an asynchronous list would ignore INT and QUIT); the wrapper
#   keeps the pipe's write end while it runs and closes it when the job ended, so the reader's
#   end of output is the job's and its leftovers' last close, as with a FIFO; the wrapper closes
#   the read end once the reader has it, so a job whose reader died gets EPIPE, not a full pipe;
# - the log reader ignores TERM for the same reason (a KILL still ends it), and whatever fails
#   in it (the log cannot be created or read: `true`, not `:`, whose failed redirection would
#   end the reader) it still drains the pipe to its end;
# - the room left K starts at the limit: the log is new (`[ -s ]`, a builtin, says it is empty;
#   a log already holding bytes is measured with `wc -c`);
# - the log reader copies with `dd bs=B count=C`: one read() of at most B bytes per record,
#   each written to the log at once (so a running job's log shows what it printed), and at most C
#   records, B * C <= K (the room left), so the log never exceeds the limit. B = K / 1024, at
#   least 1 and at most 4 KiB: one dd lasts min(1024, K) reads at least, so a slow job costs two
#   spawns (dd, wc) per 1024 of its writes, not per write, and a fast job's output goes through
#   in reads of up to 4 KiB;
# - dd stops after C records or at the end of the output (EOF: every writer closed the pipe),
#   and its report says which: its stderr is taken by the command substitution (a pipe, no
#   file; LC_ALL=C for dd alone, so the line reads "F+P records in" in any locale) and counts F
#   full and P partial records; F + P < C only at EOF. Then the whole output is in the log and
#   nothing was dropped: no line, no `wc`. A dd that made all C reads, or a report that does not
#   read as that, leads to measuring: the room left is the limit minus the log's size (`wc -c`:
#   GNU's stats the file, busybox's reads it, so fewer rounds matter); no growth means EOF too; a
#   failing dd (a full disk) ends the copy. Unless EOF was seen, `wc -c` then reads the rest to
#   its end and counts it (the job's writes never fail, however much it prints), and the count
#   goes to the receipt in one write, before the wrapper's block (the wrapper waits for the
#   reader first, unless something still holds the output);
# - the pid file and the receipt are written in place by the shell's printf (one write each; a
#   reader tells a line cut short by its missing newline, a block by its missing `end`), not
#   aside and renamed, which cost a `mv` process each; the status appended to the pid file makes
#   its mtime the job's end, without a file of its own;
# - a receipt that cannot be written (printf fails: no space, no inode) goes to the end of the
#   pid file, whose allocated block has room for it; a full filesystem cannot turn an ended job
#   into one without a receipt (`lost`);
# - the fence watcher computes in integers: /proc/uptime's "12345.67" without its dot is
#   centiseconds (its fraction always has two digits; leading zeros, only in the first second
#   of a boot, are cut so the shell does not read octal); a fence it cannot read is 0, i.e.
#   passed. It sleeps the centiseconds left as "S.CC" seconds; a renewal moves the fence later,
#   so waking at the old instant and reading again is never late; no signal is needed;
# - `wait` returns early (> 128) when a trapped signal arrives: wait again while the process is
#   still there (`kill -0`). A status > 128 can also be the process's own death by a signal (the
#   watcher killed by the USR1 that came before its trap was set, a reader killed by a signal a
#   job sent its group), and shells differ on what a second wait then returns (dash repeats the
#   status), so the process's absence, not the status, ends the loop.


class WrapperToolMissing(RuntimeError):
    """A tool the wrapper needs is not installed."""


def find_tools() -> dict[str, str]:
    """Absolute paths of ``sh`` and the wrapper's helpers, from the minimal PATH."""
    path = minimal_environment(None)["PATH"]
    tools = {}
    for name in ("sh", "dd", "wc", "sleep"):
        found = shutil.which(name, path=path)
        if found is None:
            raise WrapperToolMissing(f"local_process needs {name!r} (coreutils or busybox) on {path}")
        tools[name] = found
    return tools


def wrapper_script(tools: dict[str, str]) -> str:
    """The wrapper's text (the ``sh -c`` argument), with the helpers' absolute paths."""
    script = _TEMPLATE.replace("@NAP@", str(FENCE_NAP_CS))
    for name in ("dd", "wc", "sleep"):
        script = script.replace(f"@{name.upper()}@", shlex.quote(tools[name]))
    return script


def wrapper_argv(tools: dict[str, str], script: str, attempt_dir: str, log_limit: int,
                 argv: list[str], *, pipe_inode: int, drain_ms: int = 2_000, orphans: str = "kill") -> list[str]:
    """``sh -c WRAPPER qinglong-job ATTEMPT_DIR LOG_LIMIT DRAIN_MS ORPHANS PIPE_INODE -- ARGV...``.

    Spawn it with stdin the Attempt directory's lock descriptor, stdout the output pipe's write
    end and stderr its read end (``pipe_inode``: that pipe's inode)."""
    if orphans not in ORPHAN_POLICIES:
        raise ValueError(f"orphans must be one of {', '.join(ORPHAN_POLICIES)}, not {orphans!r}")
    return [tools["sh"], "-c", script, WRAPPER_NAME, attempt_dir, str(log_limit), str(int(drain_ms)),
            orphans, str(int(pipe_inode)), "--", *argv]
