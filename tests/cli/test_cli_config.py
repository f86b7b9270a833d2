"""The config commands end to end: `zerorun validate`, `print-config`, `report`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from zerorun.cli import main
from zerorun.commands import report
from zerorun.config import load_config

ROOT = Path(__file__).parents[2]
TEMPLATES = sorted((ROOT / "templates").glob("*.yaml"))
HF_ZERO3 = str(Path(__file__).parents[1] / "configs" / "hf_zero3.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_templates(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", *map(str, TEMPLATES))
    assert code == 0
    assert out.count(": ok (") == len(TEMPLATES) == 7
    assert out.rstrip().endswith("all 7 files valid")
    assert f"{ROOT / 'templates' / 'zero2.yaml'}: ok (ZeRO stage 2, bf16, AdamW, micro batch 4 x accumulation 1" in out


def test_validate_with_world_size_prints_the_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(ROOT / "templates" / "zero3.yaml"), "--world-size", "8")
    assert code == 0
    assert "batch 32 = 4 x 1 x 8 ranks" in out


def test_validate_lists_every_problem_and_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 4, "overlap_com": True}}))
    good = ROOT / "templates" / "zero1.yaml"
    code, out, err = run(capsys, "validate", str(bad), str(good), "-w", "1")
    assert code == 1
    assert f"{bad}: invalid (3 problems)" in out
    assert f"  {bad}: zero_optimization.stage: 4 is not one of 0, 1, 2, 3" in out
    assert f"  {bad}: zero_optimization.overlap_com: unknown key (did you mean zero_optimization.overlap_comm?)" in out
    assert f"  {bad}: train_batch_size: train_batch_size (10) is not divisible by" in out
    assert f"{good}: ok" in out
    assert "error: 1 of 2 config files invalid" in err


def test_validate_warnings_and_notes_go_to_stderr(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("train_micro_batch_size_per_gpu: 1\nzero_optimization:\n  stage: 2\n  cpu_offload: true\n")
    code, out, err = run(capsys, "validate", str(path))
    assert code == 0 and "warning:" not in out
    assert f"warning: {path}: zero_optimization.cpu_offload: is deprecated; use zero_optimization.offload_optimizer.device: cpu" in err
    code, out, err = run(capsys, "validate", HF_ZERO3)
    assert code == 0
    assert "note:" in err and "resolved at run time" in err


def test_validate_malformed_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"zero_optimization": {"stage": 2,]}')  # a trailing comma alone is valid Hjson, as DeepSpeed reads it
    code, out, _ = run(capsys, "validate", str(path))
    assert code == 1
    assert f"{path}: malformed JSON at line 1, column 35: Expecting property name enclosed in double quotes" in out


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_print_config_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str) -> None:
    code, out, _ = run(capsys, "print-config", HF_ZERO3, "--world-size", "4", "--hidden-size", "256", "--format", fmt)
    assert code == 0
    resolved = tmp_path / f"resolved.{fmt}"
    resolved.write_text(out)
    assert load_config(resolved, world_size=4) == load_config(HF_ZERO3, world_size=4, hidden_size=256)
    code, out, _ = run(capsys, "validate", str(resolved), "-w", "4")
    assert code == 0, out


def test_print_config_json_is_complete(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "print-config", str(ROOT / "templates" / "zero2.yaml"), "-f", "json")
    data = json.loads(out)
    assert code == 0
    assert data["zero_optimization"]["stage3_prefetch_bucket_size"] == 50_000_000  # a default, filled in
    assert data["zero_optimization"]["offload_param"]["device"] == "none"
    assert data["aio"]["queue_depth"] == 8 and data["train_batch_size"] is None


def test_print_config_table_shows_sources(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "bfloat16": {"enabled": True}, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}))
    code, out, _ = run(capsys, "print-config", str(path), "-w", "2", "--hidden-size", "100")
    assert code == 0
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 4}
    assert "file" in lines["train_micro_batch_size_per_gpu"]
    assert "derived" in lines["train_batch_size"] and " 4 " in lines["train_batch_size"]
    assert "auto" in lines["zero_optimization.reduce_bucket_size"] and "10000" in lines["zero_optimization.reduce_bucket_size"]
    assert "deprecated alias" in lines["bf16.enabled"]
    assert "default" in lines["fp16.hysteresis"]
    code, out, _ = run(capsys, "print-config", str(path), "--changed")
    assert "fp16.hysteresis" not in out and "zero_optimization.stage" in out


def test_print_config_template(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "print-config", "--template", "zero3")
    assert code == 0 and out == (ROOT / "templates" / "zero3.yaml").read_text()
    target = tmp_path / "ds.yaml"
    assert run(capsys, "print-config", "--template", "zero2-offload-cpu", "-o", str(target))[0] == 0
    assert load_config(target).zero_optimization.offload_optimizer.device == "cpu"
    code, _, err = run(capsys, "print-config", "--template", "zero4")
    assert code == 1 and "error: unknown template 'zero4' (did you mean zero3?)" in err


def test_print_config_bad_file_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("zero_optimization: {stage: 9}\n")
    code, _, err = run(capsys, "print-config", str(path))
    assert code == 1
    assert f"{path}: zero_optimization.stage: 9 is not one of 0, 1, 2, 3" in err
    assert "hint:" in err


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        ("validate", ["--world-size", "--hidden-size", "Examples", "zerorun validate templates/*.yaml --world-size 8"]),
        ("print-config", ["--format", "--template", "--changed", "--docs", "--output", "Examples", "zerorun print-config --template zero3"]),
        ("report", ["--json", "Examples", "zerorun report --json"]),
    ],
)
def test_help_is_complete(capsys: pytest.CaptureFixture[str], name: str, needles: list[str]) -> None:
    code, out, _ = run(capsys, name, "--help")
    assert code == 0
    for needle in needles:
        assert needle in out, needle


def test_report_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "report", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["backends"]["gloo"] is True
    assert data["cpu_logical"] >= 1 and data["memory_total_gib"] > 0
    assert data["torch"].split("+")[0].count(".") == 2
    if not data["gpus"]:
        assert data["gpu_note"].startswith("no GPU")


class FakeNvml:
    """Stands in for pynvml: this machine has no GPU and no NVML library to drive."""

    def __init__(self, count: int) -> None:
        self.count, self.shutdown = count, False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return f"NVIDIA H100 #{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, used=2**30)


def test_report_gpus_through_nvml() -> None:
    nvml = FakeNvml(2)
    driver, gpus, note = report.probe_gpus(nvml)
    assert driver == "550.54.15" and note == "" and nvml.shutdown
    assert gpus == [report.Gpu(0, "NVIDIA H100 #0", 80.0, 1.0), report.Gpu(1, "NVIDIA H100 #1", 80.0, 1.0)]
    assert report.probe_gpus(FakeNvml(0))[2] == "no GPU (NVML sees 0 devices)"


def test_report_warnings() -> None:
    base = report.collect(nvml=FakeNvml(0))
    small = report.Report(**{**base.__dict__, "shm_total_gib": 0.06, "warnings": []})
    assert any(w.startswith("/dev/shm is only 0.06 GiB") for w in report.check(small))
    gpus_no_cuda = report.Report(**{**base.__dict__, "gpus": [report.Gpu(0, "x", 1.0, 0.0)], "cuda_available": False})
    assert "NVML sees 1 GPU(s) but torch has no CUDA: install a CUDA build of torch" in report.check(gpus_no_cuda)
