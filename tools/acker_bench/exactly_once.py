"""acker-bench --mode exactly-once: kill -9 ackers, drivers and executors under a SourcePipeline; count the output.

N keyed records (``id``, ``text`` of 1-5 words, in Parquet files) go through
the driver of :mod:`acker_bench.exactly_once_driver`, in a process of its own
on local Spark, against ackers that are real processes
(:class:`~acker_service.process_cluster.ProcessCluster`): one word row per word,
committed exactly once into a partitioned Parquet folder and into a catalog
table. While the pipelines run, the bench injects faults, each once the run
has staged at least ``first_at`` (20%) of its output rows (the rows of the
staging sidecars, counted by :class:`~acker_bench.faults.StagedProgress`),
and later ones only after more rows were staged since the previous fault:

- ``acker``: ``kill -9`` of an acker process (each in turn), restarted on its
  port a moment later; with one copy per tree its pending trees are lost and
  replayed at the pipeline's backstop;
- ``driver``: ``kill -9`` of the driver's process group (its Python process,
  its JVM and Python workers), 1 s after its share of the rows was staged (the
  rows move as a task ends: a moment later the next tasks' records are in
  flight), then a new driver on the same checkpoints;
- ``executor``: ``kill -9`` of a Spark Python worker that is running a task
  (a child of the JVM's ``pyspark.daemon`` whose reading step holds its task's
  emission file open): the task, and with ``local[2]`` its job, fails and the
  pipeline replays the round's unfinished records;
- ``rewrite``: the driver kills itself (``kill -9`` of its process group)
  when its Parquet commit starts rewriting a file that holds rows of a failed
  delivery (the run fails some records on their first delivery, whose words
  share their partition folders with other records'), then a new driver;
- ``publish``: the driver kills itself after its Parquet commit has moved one
  file into place (a plain reader sees part of the commit), then a new driver.

One run per fault kind and one mixed run (each kind ``kills`` times, in turn:
executor, acker, driver). A run's last driver kill waits for the table's first
commit instead of a share of the rows: the next driver must find the table the
killed one created (in the catalog) and finish that commit. An executor kill counts once Spark reports the
task's worker dead; a worker killed between tasks is counted apart
(``executor_kills_missed``) and another is killed later. After a
run each destination is read back with Spark and compared with the expected
rows (every word of every record that was not dead-lettered): ``duplicates``
(copies beyond the first), ``missing``, ``unexpected`` rows and
``mixed_attempts`` (records whose rows carry more than one ``attempt``, the
``_attempt`` of the delivery that produced them) must all be 0, and every
planned fault must have been injected.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exactly_once_driver import TABLE, DriverConfig, catalog_path, sink_paths, source_path
from .faults import StagedProgress, reading_worker

__all__ = ["FAULT_KINDS", "ExactlyOnceConfig", "expected_rows", "plan_runs", "run_exactly_once"]

FAULT_KINDS = ("acker", "driver", "executor", "rewrite", "publish")
COMMIT_KINDS = ("rewrite", "publish")  # the driver kills itself at a point of its Parquet commit
_MIXED_ORDER = ("executor", "acker", "driver")
_POLL = 0.05
_IN_FLIGHT_DELAY = 1.0  # seconds between reaching a driver kill's progress and the kill
_CRASH_REPORTED = 5.0  # seconds for Spark to report a killed worker's task as failed
_CRASH_LINE = "Python worker exited unexpectedly"  # Spark's error for a task whose Python worker died
_LAST_AT = 0.8  # the last planned fault's progress: late enough to spread them, early enough to land


@dataclass(frozen=True)
class ExactlyOnceConfig:
    """Records, faults per kind and run, the cluster, and the Spark driver's settings."""

    records: int = 100_000
    faults: tuple[str, ...] = ("acker", "driver", "executor")
    kills: int = 3  # of each kind, per run
    mixed: bool = True  # a mixed run after the per-kind runs (when more than one kind)
    per_kind: bool = True  # one run per fault kind
    ackers: int = 1
    replicas: int = 1
    message_timeout: float = 10.0
    master: str = "local[2]"
    files: int = 8
    tasks: int = 32  # per Spark job: progress, and so the faults, move task by task
    batch_rows: int = 1000
    sinks: tuple[str, ...] = ("parquet", "table")
    first_at: float = 0.2
    acker_down_seconds: float = 1.0
    run_timeout: float = 1800.0  # a hang guard for one run, not a speed check
    keep: str | None = None  # a folder to keep the runs' files in (default: a temporary one, removed)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}: choose from {', '.join(FAULT_KINDS)}")
        if self.records < 10 or self.kills < 0 or not 0 < self.first_at < _LAST_AT:
            raise ValueError(f"records must be >= 10, kills >= 0 and first_at in (0, {_LAST_AT})")
        if not set(self.sinks) <= {"parquet", "table"} or not self.sinks:
            raise ValueError(f"sinks must be parquet and/or table, got {self.sinks}")


def plan_runs(config: ExactlyOnceConfig) -> list[list[str]]:
    """Each run's faults in order: one run per kind, then the kinds interleaved in a mixed run."""
    runs = [[kind] * config.kills for kind in config.faults] if config.per_kind else []
    timed = [k for k in config.faults if k not in COMMIT_KINDS]
    if config.mixed and timed and (len(timed) > 1 or not config.per_kind):
        # An executor kill needs a task running: first, while the first pipeline's first job runs;
        # a driver kill last, as the last one may wait for the table's commit (_table_commit_started).
        kinds = sorted((k for k in config.faults if k not in COMMIT_KINDS), key=_MIXED_ORDER.index)
        runs.append([kind for _ in range(config.kills) for kind in kinds])
    return runs


def thresholds(count: int, first_at: float) -> list[float]:
    """The progress (fraction of the expected rows staged) at which each of ``count`` faults is due."""
    if count <= 1:
        return [first_at] * count
    step = (_LAST_AT - first_at) / (count - 1)
    return [first_at + i * step for i in range(count)]


def _words(i: int) -> list[str]:
    return [f"w{i}_{j}" for j in range(i % 5 + 1)]


def _record_id(i: int) -> str:
    return f"r{i:07d}"


def write_source(folder: Path, records: int, files: int) -> None:
    """``records`` records ``(id, text)`` in ``files`` Parquet files: record i has i % 5 + 1 words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    per_file = -(-records // files)
    for f in range(files):
        span = range(f * per_file, min(records, (f + 1) * per_file))
        table = pa.table({"id": [_record_id(i) for i in span], "text": [" ".join(_words(i)) for i in span]})
        pq.write_table(table, folder / f"part-{f:03d}.parquet")


def expected_rows(records: int, dead: Collection[str] = ()) -> set[tuple[str, str, str]]:
    """Every ``(id, word, bucket)`` row the job makes for the records not in ``dead``."""
    return {(rid, word, rid[-1]) for i in range(records) if (rid := _record_id(i)) not in dead for word in _words(i)}


def compare(dump: Path, expected: set[tuple[str, str, str]]) -> dict[str, int]:
    """The destination's rows (read back into ``dump``) against ``expected``: counts of what is wrong."""
    import pyarrow.parquet as pq

    table = pq.read_table(dump, columns=["id", "word", "bucket", "attempt"])
    columns = table.to_pydict()
    rows = Counter(zip(columns["id"], columns["word"], columns["bucket"]))
    attempts: dict[str, set[int]] = {}
    for rid, attempt in zip(columns["id"], columns["attempt"]):
        attempts.setdefault(rid, set()).add(attempt)
    return {
        "expected_rows": len(expected),
        "output_rows": table.num_rows,
        "duplicates": sum(n - 1 for n in rows.values() if n > 1),
        "missing": len(expected - rows.keys()),
        "unexpected": sum(n for row, n in rows.items() if row not in expected),
        "mixed_attempts": sum(1 for seen in attempts.values() if len(seen) > 1),
        "rows_from_replays": sum(1 for a in columns["attempt"] if a > 1),
    }


class _Driver:
    """The driver subprocess of one run: started, killed (its whole process group) and started again."""

    def __init__(self, config: DriverConfig, work: Path) -> None:
        self.config, self.work = config, work
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    def start(self, die_at: str = "") -> None:
        """Start a driver on the run's checkpoints (its output in driver-<n>.log); ``die_at``: see DriverConfig."""
        self.config = dataclasses.replace(self.config, die_at=die_at)
        self.starts += 1
        self.log = self.work / f"driver-{self.starts}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "acker_bench.exactly_once_driver", self.config.to_json()],
                cwd=self.work,  # Derby's derby.log lands here
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill -9 reaches the JVM and workers too
            )

    def kill(self) -> None:
        """``kill -9`` of the driver, its JVM and its Python workers; reaped."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def worker_crashes(self) -> int:
        """How often the current driver's log reports a task's Python worker dead."""
        if self.log is None or not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count(_CRASH_LINE)

    def tail(self, lines: int = 30) -> str:
        """The last lines of the current driver's output."""
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _inject(kind: str, driver: _Driver, cluster: Any, injected: Counter[str], down: float) -> bool:
    """Inject one fault of ``kind``; False if it did not land (no Python worker was in a task)."""
    assert driver.proc is not None
    if kind == "acker":
        shard = injected["acker"] % cluster.count
        cluster.kill(shard)
        time.sleep(down)
        cluster.restart(shard)
    elif kind == "driver":
        driver.kill()
        driver.start()
    else:
        landed = _kill_worker(driver)
        if landed is None:  # no worker in a task just now: try at the next poll
            return False
        if not landed:
            injected["executor_missed"] += 1
            return False
    injected[kind] += 1
    return True


def _kill_worker(driver: _Driver) -> bool | None:
    """``kill -9`` of a Python worker in a task: True once Spark reports the crash, False if it does not (the task
    had ended: no fault), None if no worker was in a task."""
    assert driver.proc is not None
    worker = reading_worker(driver.proc.pid)
    if worker is None:
        return None
    before = driver.worker_crashes()
    try:
        os.kill(worker, signal.SIGKILL)
    except ProcessLookupError:  # it ended in between
        return None
    deadline = time.monotonic() + _CRASH_REPORTED
    while time.monotonic() < deadline:
        if driver.worker_crashes() > before:
            return True
        time.sleep(_POLL)
    return False


def run_one(config: ExactlyOnceConfig, cluster: Any, work: Path, faults: Sequence[str]) -> dict[str, Any]:
    """One run (fresh checkpoints and destinations under ``work``) with ``faults`` injected in order."""
    work.mkdir(parents=True)
    shutil.copytree(source_path(work.parent), source_path(work))
    driver_config = DriverConfig(
        tuple(cluster.addresses), str(work), config.sinks, config.master, config.batch_rows, tasks=config.tasks
    )
    total = len(expected_rows(config.records)) * len(config.sinks)
    progress = StagedProgress(
        [sink_paths(work, s).checkpoint for s in config.sinks],
        [sink_paths(work, s).destination for s in config.sinks if s == "parquet"],
    )
    plan = list(zip(thresholds(len(faults), config.first_at), faults))
    injected: Counter[str] = Counter()
    at: list[float] = []
    seconds: list[float] = []  # when each fault was injected, from the run's start
    driver = _Driver(driver_config, work)
    started = time.perf_counter()
    result: dict[str, Any] = {"faults_planned": list(faults)}
    driver.start(plan[0][1] if plan and plan[0][1] in COMMIT_KINDS else "")
    try:
        last = -1  # staged rows at the last fault: the next one waits for progress after it
        while True:
            assert driver.proc is not None
            code = driver.proc.poll()
            if code == -signal.SIGKILL and plan and plan[0][1] in COMMIT_KINDS:
                # The driver killed itself where its commit was to be cut: start the next one.
                injected[plan[0][1]] += 1
                at.append(round(progress.rows() / total, 3))
                seconds.append(round(time.perf_counter() - started, 1))
                plan.pop(0)
                driver.start(plan[0][1] if plan and plan[0][1] in COMMIT_KINDS else "")
                continue
            if code is not None:
                break
            if time.perf_counter() - started > config.run_timeout:
                raise TimeoutError(f"the run did not finish in {config.run_timeout:.0f} s")
            if plan and plan[0][1] not in COMMIT_KINDS:
                rows = progress.rows()
                due, kind = plan[0]
                if kind == "driver" and len(plan) == 1 and "table" in config.sinks:
                    # The run's last fault: kill the driver during the table's first commit, so that the
                    # next one must find the table a killed driver created, and finish the commit.
                    ready = _table_commit_started(work)
                else:
                    ready = rows >= due * total and rows > last
                    if ready and kind == "driver":
                        # The rows move when a task finishes staging, when the next tasks have read
                        # nothing yet: a moment later their records are in flight.
                        time.sleep(_IN_FLIGHT_DELAY)
                if ready:
                    if _inject(kind, driver, cluster, injected, config.acker_down_seconds):
                        last = rows
                        at.append(round(rows / total, 3))
                        seconds.append(round(time.perf_counter() - started, 1))
                        plan.pop(0)
                    # else: no worker was in a task (or the task ended first): another at the next poll
            time.sleep(_POLL)
    except BaseException:
        driver.kill()
        raise
    result["wall_seconds"] = round(time.perf_counter() - started, 3)
    result["faults"] = {kind: injected[kind] for kind in FAULT_KINDS if kind in faults or injected[kind]}
    result["executor_kills_missed"] = injected["executor_missed"]  # workers killed between tasks: not counted
    result["fault_progress"] = at
    result["fault_seconds"] = seconds
    result["driver_starts"] = driver.starts
    if code != 0:
        result.update({"ok": False, "error": f"the driver exited with {code}: {driver.tail()}"})
        return result
    stats = _last_json(driver.tail())
    sinks: dict[str, Any] = {}
    for sink in config.sinks:
        from acker_spark.dead_letter import DeadLetterStore

        paths = sink_paths(work, sink)
        dead = DeadLetterStore(paths.dead_letters).keys()
        figures = compare(paths.dump, expected_rows(config.records, dead))
        run_stats = stats.get(sink, {})
        figures.update(
            {
                "dead_lettered": len(dead),
                "replayed": run_stats.get("replayed"),
                "lost": run_stats.get("lost"),
                "timed_out": run_stats.get("timed_out"),
            }
        )
        sinks[sink] = figures
    for key in ("expected_rows", "output_rows", "duplicates", "missing", "unexpected", "mixed_attempts"):
        result[key] = sum(s[key] for s in sinks.values())
    result["dead_lettered"] = sum(s["dead_lettered"] for s in sinks.values())
    result["sinks"] = sinks
    # Whether the last driver found the table in the catalog when it started (one killed during the table's commit).
    result["table_found_by_last_driver"] = stats.get("table_found_at_start")
    result["ok"] = (
        result["duplicates"] == result["missing"] == result["unexpected"] == result["mixed_attempts"] == 0
        and result["output_rows"] == result["expected_rows"]
        and not plan  # every planned fault was injected
    )
    return result


def _table_commit_started(work: Path) -> bool:
    """True once the table's first commit is being written: the table is in the catalog, its rows not yet published.

    The commit writes into ``.acker-staging`` under the table's location after
    ``saveAsTable`` registered the (empty) table, and removes it when it publishes.
    """
    return (catalog_path(work) / "warehouse" / TABLE / ".acker-staging").is_dir()


def _last_json(text: str) -> dict[str, Any]:
    """The last line of a driver's output that is a JSON object (its stats), or {}."""
    import json

    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except ValueError:
                continue
    return {}


def run_exactly_once(config: ExactlyOnceConfig) -> dict[str, Any]:
    """Every planned run against one acker cluster; the figures as a dict (``ok``: every run exact)."""
    from acker_service.process_cluster import ProcessCluster

    started = time.perf_counter()
    work = Path(config.keep) if config.keep else Path(tempfile.mkdtemp(prefix="acker-bench-exactly-once-"))
    try:
        write_source(source_path(work), config.records, config.files)
        runs = []
        extra = ("--replicas", str(config.replicas))
        with ProcessCluster(count=config.ackers, message_timeout=config.message_timeout, extra_args=extra) as cluster:
            for number, faults in enumerate(plan_runs(config)):
                runs.append(run_one(config, cluster, work / f"run-{number}", faults))
        return {
            "mode": "exactly-once",
            "records": config.records,
            "sinks": list(config.sinks),
            "ackers": config.ackers,
            "replicas": config.replicas,
            "message_timeout": config.message_timeout,
            "master": config.master,
            "runs": runs,
            "ok": all(r["ok"] for r in runs),
            "wall_seconds": round(time.perf_counter() - started, 3),
        }
    finally:
        if not config.keep:
            shutil.rmtree(work, ignore_errors=True)
