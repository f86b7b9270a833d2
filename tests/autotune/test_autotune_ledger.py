"""The append-only ledger: keyed runs, resume, torn lines."""

from __future__ import annotations

from pathlib import Path

from zerorun.autotune.classify import Outcome, TrialOutcome
from zerorun.autotune.ledger import Ledger, TrialRecord, knob_key, run_key


def test_run_key_follows_config_script_and_args(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    base = run_key({"a": 1, "b": 2}, script, ["--lr", "1"])
    assert base == run_key({"b": 2, "a": 1}, script, ["--lr", "1"])  # key order is not identity
    assert base != run_key({"a": 1, "b": 3}, script, ["--lr", "1"])
    assert base != run_key({"a": 1, "b": 2}, script, ["--lr", "2"])
    script.write_text("print(2)\n")
    assert base != run_key({"a": 1, "b": 2}, script, ["--lr", "1"])


def test_append_resume_and_latest_wins(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "out" / "ledger.jsonl")
    assert ledger.records("k") == [] and ledger.done("k") == {}
    a = TrialRecord.from_outcome("k", {"x": 1}, TrialOutcome(Outcome.FINISHED, 0.5, 2.0, 100), duration_s=3.0)
    ledger.append(a)
    ledger.append(TrialRecord.from_outcome("other", {"x": 1}, TrialOutcome(Outcome.OOM, reason="oom")))
    ledger.append(TrialRecord.from_outcome("k", {"x": 2}, TrialOutcome(Outcome.PRUNED, reason="too big")))
    again = Ledger(tmp_path / "out" / "ledger.jsonl")  # a rerun reads the same file
    done = again.done("k")
    assert set(done) == {knob_key({"x": 1}), knob_key({"x": 2})}
    assert done[knob_key({"x": 1})] == a
    assert done[knob_key({"x": 2})].outcome().status is Outcome.PRUNED
    lines = (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 3  # append-only: nothing rewritten


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(TrialRecord.from_outcome("k", {"x": 1}, TrialOutcome(Outcome.FINISHED, 1.0, 1.0)))
    with open(path, "a") as f:
        f.write('{"run_key": "k", "knobs": {"x": 2}, "sta')
    assert [r.knobs for r in ledger.records("k")] == [{"x": 1}]
    assert knob_key({"b": 1, "a": 2}) == knob_key({"a": 2, "b": 1})


def test_the_record_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(TrialRecord.from_outcome("k", {"x": 1}, TrialOutcome(Outcome.FINISHED, 1.0, 1.0)))
    with open(path, "ab") as f:
        f.write('{"run_key": "k", "knobs": {"x": 2}, "reason": "caf\u00e9'.encode()[:-1])  # torn mid-character
    ledger.append(TrialRecord.from_outcome("k", {"x": 3}, TrialOutcome(Outcome.FINISHED, 1.0, 1.0)))
    ledger.append(TrialRecord.from_outcome("k", {"x": 4}, TrialOutcome(Outcome.OOM, reason="oom")))
    assert [r.knobs for r in ledger.records("k")] == [{"x": 1}, {"x": 3}, {"x": 4}]
    assert len(path.read_bytes().splitlines()) == 4  # the torn fragment stays, alone on its line


def test_a_record_an_older_writer_glued_to_a_torn_line_is_read(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.append(TrialRecord.from_outcome("k", {"x": 3}, TrialOutcome(Outcome.FINISHED, 1.0, 1.0)))
    whole = path.read_text()
    path.write_text('{"run_key": "k", "knobs": {"x": 2}, "sta' + whole + "not json {\n")
    assert [r.knobs for r in ledger.records("k")] == [{"x": 3}]
