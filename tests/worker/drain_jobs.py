"""Jobs the worker tests run (Python, through the interpreter's absolute path)."""

#: Writes its pid to ``MARK`` (its own group leader is the executor's wrapper: the pgid is read),
#: then waits until ``RELEASE`` exists; exits 0. TERM ends it (default action).
GATED_JOB = (
    "import os, sys, time\n"
    "mark, release = sys.argv[1], sys.argv[2]\n"
    "with open(mark + '.tmp', 'w') as f: f.write('%d %d' % (os.getpid(), os.getpgid(0)))\n"
    "os.rename(mark + '.tmp', mark)\n"
    "print('started', flush=True)\n"
    "while not os.path.exists(release): time.sleep(0.02)\n"
    "print('released', flush=True)\n"
)
