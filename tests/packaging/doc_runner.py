"""Runs the documentation's Spark scripts one after another in ONE Python process, so they share one JVM.

Started by tests/packaging/test_doc_snippets.py, in an empty working directory of
its own. Each line on stdin is the JSON ``{"dir": ...}`` of a directory holding
``snippet.py`` and its input files. The working directory is emptied and given a
copy of them, and the script runs there as ``python snippet.py`` would run it
(``__main__``, its directory first on ``sys.path``), with its stdout and stderr
(file descriptors 1 and 2, so child processes' output too) in ``stdout.txt`` and
``stderr.txt`` in the given directory. The working directory is the same for
every script, and is never removed, because the JVM and Spark's Python workers
keep the one this process had when it started the JVM: relative paths mean the
same directory on the driver, in the JVM and on the executors. Afterwards the script's
SparkSession is stopped (the JVM stays up for the next one), the shared acker
clients are closed and the environment, working directory and ``sys.path`` are
restored. The result goes to the file descriptor named by ``argv[1]`` as one
JSON line: ``{"exit": 0}`` for success, the exit status otherwise. The JVM's own
output goes to this process's stdout and stderr, which the test sends to a log.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sys
import traceback
from pathlib import Path


def _fresh_workdir(workdir: Path, source: Path) -> None:
    """Empty ``workdir`` (it stays: it is the JVM's working directory) and copy ``source``'s files into it."""
    for entry in workdir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in source.iterdir():
        if entry.name in ("stdout.txt", "stderr.txt"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, workdir / entry.name)
        else:
            shutil.copy2(entry, workdir / entry.name)


def run_script(directory: Path, workdir: Path) -> int:
    """Run ``directory/snippet.py`` as ``__main__`` in ``workdir``; its exit status (0, 1 for an exception)."""
    _fresh_workdir(workdir, directory)
    saved_env, saved_cwd, saved_path = dict(os.environ), os.getcwd(), list(sys.path)
    saved_fds = os.dup(1), os.dup(2)
    status = 0
    with open(directory / "stdout.txt", "wb") as out, open(directory / "stderr.txt", "wb") as err:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            os.chdir(workdir)
            sys.path.insert(0, str(workdir))
            runpy.run_path(str(workdir / "snippet.py"), run_name="__main__")
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if done.code is not None and not isinstance(done.code, int):
                print(done.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the script's failure is reported, the runner goes on
            traceback.print_exc()
            status = 1
        finally:
            _stop_spark()
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(saved_cwd)
            sys.path[:] = saved_path
            os.environ.clear()
            os.environ.update(saved_env)
    return status


def _stop_spark() -> None:
    """Stop the script's SparkSession (not the JVM) and close the shared acker clients, as its exit would."""
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession() or SparkSession._instantiatedSession  # noqa: SLF001
        if session is not None:
            session.stop()
    if "acker_spark" in sys.modules:
        from acker_spark import close_clients

        close_clients()


def main() -> None:
    """Serve run requests from stdin until it closes."""
    results = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    workdir = Path.cwd()
    for line in sys.stdin:
        status = run_script(Path(json.loads(line)["dir"]), workdir)
        results.write(json.dumps({"exit": status}) + "\n")


if __name__ == "__main__":
    main()
