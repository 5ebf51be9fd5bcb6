"""Exec a command that dies with its parent:
``python -m serving._exec_child --parent PPID -- ARGV``.

Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) survives ``execve``, so setting it
here and then exec'ing the real command (the vLLM server) means a supervisor killed with
SIGKILL leaves no server behind. Doing it in a ``preexec_fn`` instead would be unsafe: the
supervisor forks from threads. Elsewhere than Linux this simply execs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[0] != "--parent" or not argv[1].isdigit() or argv[2] != "--":
        sys.stderr.write("usage: python -m serving._exec_child --parent PID -- PROGRAM [ARGS...]\n")
        raise SystemExit(2)
    parent, command = int(argv[1]), argv[3:]
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        # The parent may have died between fork and prctl: then nobody would signal us.
        if os.getppid() != parent:
            raise SystemExit(1)
    os.execvpe(command[0], command, os.environ)


if __name__ == "__main__":
    main(sys.argv[1:])
