"""acker-ctl dead-letters list and abandon against a real dead-letter store; its usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acker_ctl.cli import main
from acker_protocol.wire import Outcome
from acker_spark.dead_letter import DeadLetterStore, Select
from acker_spark.redrive import Redrive


@pytest.fixture
def store(tmp_path: Path) -> DeadLetterStore:
    """5 ValueError letters, 2 KeyError, 1 without a cause."""
    letters = DeadLetterStore(tmp_path / "dead.sqlite")
    rows: list[tuple[object, ...]] = [
        (f"v{i}", {"id": f"v{i}"}, Outcome.FAILED, 1, f"ValueError: amount of v{i} is not a number (at job.py:3)")
        for i in range(5)
    ]
    rows += [(f"k{i}", {"id": f"k{i}"}, Outcome.FAILED, 1, "KeyError: 'price' (at job.py:9)") for i in range(2)]
    rows.append(("t0", {"id": "t0"}, Outcome.TIMED_OUT, 4, None))
    letters.add_many(rows)
    return letters


def ctl(*args: str) -> tuple[int, str]:
    printed: list[str] = []
    code = main(list(args), out=printed.append)
    return code, "\n".join(printed)


def test_list_groups_by_cause_with_counts_and_examples(store: DeadLetterStore) -> None:
    code, text = ctl("dead-letters", "list", "--store", str(store.path), "--examples", "2")
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "8 dead letters"
    assert lines[1].split() == ["5", "ValueError", "(5", "new)"]
    assert lines[2].strip() == "v0: ValueError: amount of v0 is not a number (at job.py:3)"
    assert "KeyError" in lines[4] and "(no cause)" in text


def test_list_as_json_shows_redrive_statuses(store: DeadLetterStore, tmp_path: Path) -> None:
    def runner(chunk: object, folder: Path) -> dict[str, str | None]:
        return {"v1": "TypeError: still wrong"}

    Redrive(store, runner, tmp_path / "r", select=Select(cause="ValueError")).run()
    code, text = ctl("--json", "dead-letters", "list", "--store", str(store.path))
    assert code == 0
    result = json.loads(text)
    assert result["total"] == 8 and result["unfinished_redrive"] is None
    causes = {c["cause"]: c for c in result["causes"]}
    assert causes["ValueError"]["statuses"] == {"acked": 4}
    assert causes["TypeError"]["examples"] == [{"key": "v1", "cause": "TypeError: still wrong"}]


def test_list_names_an_unfinished_redrive_and_abandon_releases_it(store: DeadLetterStore, tmp_path: Path) -> None:
    def dies(chunk: object, folder: Path) -> dict[str, str | None]:
        raise RuntimeError("driver died")

    with pytest.raises(RuntimeError):
        Redrive(store, dies, tmp_path / "r", select=Select(cause="KeyError"), redrive_id="fix-1").run()
    code, text = ctl("dead-letters", "list", "--store", str(store.path))
    assert "unfinished redrive fix-1" in text
    code, text = ctl("dead-letters", "abandon", "--store", str(store.path), "fix-1")
    assert (code, text) == (0, "redrive fix-1 abandoned: 2 letters may be taken again")
    assert store.unfinished_redrive() is None


def test_usage_errors(store: DeadLetterStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl("dead-letters", "list", "--store", str(tmp_path / "none.sqlite"))[0] == 2
    assert "no dead-letter store" in capsys.readouterr().err
    base = ["--ackers", "127.0.0.1:1", "dead-letters", "redrive", "--store", str(store.path)]
    code, _ = ctl(*base, "--job", "x:y", "--checkpoint", str(tmp_path / "cp"))
    assert code == 2 and "--cause KIND and/or --key KEY, or --all" in capsys.readouterr().err
    code, _ = ctl(*base, "--job", "no_such_module_here:make", "--checkpoint", str(tmp_path / "cp"), "--all")
    assert code == 2 and "no_such_module_here" in capsys.readouterr().err
    code, _ = ctl(*base, "--job", "json:nothing", "--checkpoint", str(tmp_path / "cp"), "--all", "--rate", "0")
    assert code == 2 and "--rate must be > 0" in capsys.readouterr().err


def test_shared_flags_are_taken_after_the_subcommand_too(store: DeadLetterStore) -> None:
    """`dead-letters list --json` is the same as `--json dead-letters list` (the flag used to be refused there)."""
    code, after = ctl("dead-letters", "list", "--store", str(store.path), "--json")
    assert code == 0
    assert json.loads(after) == json.loads(ctl("--json", "dead-letters", "list", "--store", str(store.path))[1])
    code, text = ctl("dead-letters", "list", "--store", str(store.path))
    assert code == 0 and text.startswith("8 dead letters")  # the subcommand's parser does not reset --json


def test_redrive_refuses_a_malformed_output(
    store: DeadLetterStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--output takes FORMAT:PATH; a wrong one is a usage error and claims nothing."""
    code, _ = ctl(
        "--ackers", "127.0.0.1:1", "dead-letters", "redrive", "--store", str(store.path), "--job", "json:dumps",
        "--checkpoint", str(tmp_path / "cp"), "--all", "--output", "/data/orders",
    )  # fmt: skip
    assert code == 2
    assert "--output takes FORMAT:PATH" in capsys.readouterr().err
    assert {letter.redrive_status for letter in store.all()} == {None}
