"""Progress in sight (issue 28, item 4): the figures, the reporter's file, bar and log lines, and acker-ctl progress.

Pure parts on injected clocks (no thread, no sleep); the pipeline on local
Spark is in test_source_progress.py.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from acker_client.testing import ManualClock
from acker_ctl.cli import main as ctl_main
from acker_spark.progress.display import ProgressReporter, resolve_mode
from acker_spark.progress.driver_progress import waiting_on
from acker_spark.progress.figures import PROGRESS_FILE, Baseline, Live, ProgressMeter


def test_a_running_jobs_rows_and_outcomes_move_the_figures():
    """A first read: rows the job started count as read and pending; outcomes since the baseline move them on."""
    clock = ManualClock()
    meter = ProgressMeter("orders", clock)
    base = Baseline(read=100, acked=90, pending=0, replaying=10, dead=0, records=None, round=1, in_job=True,
                    first_read=True, acked_taken=90, failed_taken=10)  # fmt: skip
    figures = meter.figures(base, Live(started=50, acked_arrived=120, failed_arrived=12), wall=5.0)
    assert (figures.read, figures.acked, figures.pending, figures.replaying, figures.dead) == (150, 120, 18, 12, 0)
    assert (figures.in_job, figures.round, figures.state, figures.updated_at) == (True, 1, "running", 5.0)


def test_a_replay_round_moves_records_from_replaying_to_pending_without_reading_new_ones():
    meter = ProgressMeter("orders", ManualClock())
    base = Baseline(read=100, acked=90, replaying=10, round=2, in_job=True, first_read=False, acked_taken=90)
    figures = meter.figures(base, Live(started=10, acked_arrived=95), wall=0.0)
    assert (figures.read, figures.acked, figures.pending, figures.replaying) == (100, 95, 5, 0)


def test_rate_and_eta_over_the_window():
    """Records ended per second between samples; the ETA is what remains of the known total at that rate."""
    clock = ManualClock()
    meter = ProgressMeter("orders", clock, window=30.0, eta_after=2.0)
    base = Baseline(records=1000, in_job=True)
    first = meter.figures(base, Live(started=100, acked_arrived=0), wall=0.0)
    assert (first.rate, first.eta_seconds) == (0.0, None)
    clock.advance(2.0)
    later = meter.figures(base, Live(started=400, acked_arrived=200), wall=2.0)
    assert later.rate == 100.0
    assert later.eta_seconds == 8.0  # 800 left at 100/s
    assert later.elapsed_seconds == 2.0


def test_no_eta_from_a_resumed_runs_first_burst():
    """A resumed run: 58,000 of 60,000 already ended; a burst of 100 in the first second gives no ETA (it would say
    hours one tick and seconds the next); once the rate spans eta_after seconds the ETA is what remains at it."""
    clock = ManualClock()
    meter = ProgressMeter("orders", clock)
    base = Baseline(read=60_000, acked=58_000, replaying=2_000, records=60_000, in_job=True, first_read=False)
    meter.figures(base, Live(), wall=0.0)
    clock.advance(1.0)
    assert meter.figures(base, Live(started=100, acked_arrived=100), wall=1.0).eta_seconds is None
    clock.advance(4.0)
    steady = meter.figures(base, Live(started=1_000, acked_arrived=1_000), wall=5.0)
    assert steady.rate == 200.0 and steady.eta_seconds == 5.0  # 1,000 left at 200/s


def test_the_bar_fits_80_columns(tmp_path):
    """The bar and its figures on one line of an 80-column terminal, nothing cut."""
    from rich.console import Console

    clock = ManualClock()
    base = [Baseline(read=123_456, acked=120_000, pending=3_000, replaying=456, dead=1_234, records=1_000_000,
                     in_job=True, first_read=True)]  # fmt: skip
    live = [Live()]
    out = io.StringIO()
    reporter, _ = _reporter(tmp_path, clock, "bar", base, live, Console(file=out, width=80, force_terminal=False))
    reporter.start()
    reporter.stop("finished")
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert lines and all(len(line) <= 80 for line in lines)
    assert "read 123k/1.0M ok 120k pend 3.0k retry 456 dead 1.2k" in lines[-1]


def test_no_eta_without_a_total():
    clock = ManualClock()
    meter = ProgressMeter("orders", clock)
    meter.figures(Baseline(in_job=True), Live(), wall=0.0)
    clock.advance(1.0)
    assert meter.figures(Baseline(in_job=True), Live(acked_arrived=10), wall=1.0).eta_seconds is None


def test_resolve_mode_picks_a_bar_on_a_terminal_only():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_mode("auto", Tty()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "log"
    assert resolve_mode(None) is None and resolve_mode("log") == "log"
    with pytest.raises(ValueError, match='progress must be "auto", "bar", "log" or None'):
        resolve_mode("tqdm")  # type: ignore[arg-type]


def _reporter(
    tmp_path: Path,
    clock: ManualClock,
    mode: str | None,
    base: list[Baseline],
    live: list[Live],
    console=None,
    waiting=None,
):
    wall = ManualClock(start=1_700_000_000.0)
    reporter = ProgressReporter(
        ProgressMeter("orders", clock, stale_after=10.0),
        lambda: base[0],
        lambda _b: live[0],
        checkpoint=tmp_path,
        mode=mode,  # type: ignore[arg-type]
        logger=logging.getLogger("test.progress"),
        file_interval=2.0,
        log_interval=10.0,
        clock=clock,
        wall=wall,
        console=console,
        waiting=waiting,
    )
    return reporter, wall


def test_a_line_during_a_job_names_the_shard_the_job_waits_on(tmp_path, caplog):
    """A shard down mid-job: the job's log line says which one and for how long, not only that it is slow."""
    clock = ManualClock()
    down = [SimpleNamespace(shard=1, address="127.0.0.1:7001", since=clock(), cause="UNAVAILABLE: refused")]
    watch = SimpleNamespace(down=lambda: list(down))
    base, live = [Baseline(in_job=True, round=0)], [Live(started=10)]
    reporter, _ = _reporter(tmp_path, clock, "log", base, live, waiting=lambda now: waiting_on(watch, now))
    caplog.set_level(logging.INFO, logger="test.progress")
    reporter.tick()
    clock.advance(12.0)
    reporter.tick()
    down.clear()  # the shard answers again: the next line no longer names it
    clock.advance(10.0)
    reporter.tick()
    first, second = [r.getMessage() for r in caplog.records if r.name == "test.progress"]
    assert first.endswith("; waiting on shard 1 at 127.0.0.1:7001, unreachable for 12 s: UNAVAILABLE: refused")
    assert "waiting on" not in second and second.startswith("run progress: ")


def test_reporter_writes_the_file_every_file_interval_and_logs_during_a_job(tmp_path, caplog):
    clock = ManualClock()
    base, live = [Baseline(in_job=True, round=0)], [Live(started=10)]
    reporter, wall = _reporter(tmp_path, clock, "log", base, live)
    caplog.set_level(logging.INFO, logger="test.progress")
    reporter.tick()
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["read"] == 10
    live[0] = Live(started=20)
    clock.advance(1.0)
    reporter.tick()
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["read"] == 10, "not due yet: the file waits 2 s"
    clock.advance(1.0)
    wall.advance(2.0)
    reporter.tick()
    written = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert (written["read"], written["updated_at"], written["state"]) == (20, 1_700_000_002.0, "running")
    assert not [r for r in caplog.records if r.name == "test.progress"], "the first 10 s of a job log nothing"
    clock.advance(10.0)
    reporter.tick()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "test.progress"]
    assert line.startswith("run progress: 20 read, 0 acked, 20 pending, 0 replaying, 0 dead;")
    assert line.endswith("(round 0 running)")
    base[0] = Baseline(read=20, acked=20, in_job=False)
    assert reporter.stop("finished").state == "finished"  # type: ignore[union-attr]
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["state"] == "finished"


def test_the_bar_shows_the_figures(tmp_path):
    from rich.console import Console

    clock = ManualClock()
    base, live = [Baseline(records=100, in_job=True)], [Live(started=40, acked_arrived=30)]
    out = io.StringIO()
    reporter, _ = _reporter(tmp_path, clock, "bar", base, live, Console(file=out, width=200, force_terminal=False))
    reporter.start()
    reporter.stop("finished")
    assert "read 40/100 ok 30 pend 10 retry 0 dead 0" in out.getvalue()


def _ctl(*args: str) -> tuple[int, str]:
    printed: list[str] = []
    return ctl_main(list(args), out=printed.append), "\n".join(printed)


def test_acker_ctl_progress_shows_a_running_run_and_says_when_it_is_stale(tmp_path):
    clock = ManualClock()
    base = [Baseline(read=500, acked=400, pending=90, replaying=5, dead=5, records=1000, round=0, in_job=True)]
    reporter, _ = _reporter(tmp_path, clock, None, base, [Live()])
    reporter.wall = time.time  # the command compares the file's time with the real time
    reporter.tick()
    code, text = _ctl("progress", "--checkpoint", str(tmp_path))
    assert code == 0
    head, counts, _rate = text.splitlines()
    assert head.startswith("run orders: running, round 0's Spark job running")
    assert counts == "read 500 of 1,000   acked 400   pending 90   replaying 5   dead 5"
    code, text = _ctl("--json", "progress", "--checkpoint", str(tmp_path))
    assert (code, json.loads(text)["stale"]) == (0, False)
    # A driver killed mid-run leaves a "running" file that stops being rewritten.
    figures = json.loads((tmp_path / PROGRESS_FILE).read_text())
    figures["updated_at"] -= 600
    (tmp_path / PROGRESS_FILE).write_text(json.dumps(figures))
    code, text = _ctl("progress", "--checkpoint", str(tmp_path))
    assert code == 0 and "NOT RUNNING (stale)" in text and "10 min 0 s old" in text


def test_acker_ctl_progress_without_a_progress_file_says_so(tmp_path, capsys):
    code, _ = _ctl("progress", "--checkpoint", str(tmp_path))
    assert code == 1
    assert "no progress.json in" in capsys.readouterr().err
