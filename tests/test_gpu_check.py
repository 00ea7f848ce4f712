"""The GPU acceptance command (scripts/gpu_check.py, a script of the source checkout): it refuses to run without
CUDA, judges the targets from bench records, and (slow) runs its whole pipeline on the CPU at toy sizes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _train_helpers import write_parallel

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "gpu_check.sh"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPTS / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_without_cuda_it_stops_with_a_clear_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([str(tmp_path / "out")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_script_fails_without_cuda(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 2 and "no CUDA device" in result.stderr


def _record(label, n, fwd, bwd=0.0, peak=1.0, kind="mechanism", backend="sdpa"):
    return {"label": label, "n": n, "fwd_ms_median": fwd, "bwd_ms_median": bwd, "peak_mib": peak,
            "status": "ok", "kind": kind, "backend": backend}


def test_targets_are_judged_from_the_records():
    records = [_record("mha/sdpa", 1024, 4), _record("mtsa/triton", 1024, 5.6, backend="triton"),
               _record("mha/sdpa", 16384, 10), _record("mtsa/triton", 16384, 12.5, backend="triton"),
               _record("dman/triton", 16384, 12, backend="triton"), _record("sdpa_causal", 16384, 5, kind="baseline"),
               _record("csan1d/triton", 16384, 0.9, backend="triton"),
               _record("csan2d/triton", 16384, 2.6, backend="triton"),
               _record("csan1d/triton", 8192, 1, peak=1.0, backend="triton"),
               _record("csan1d/triton", 16384, 0.9, peak=2.2, backend="triton")]
    rows = {(r["target"], r["n"]): r for r in gpu_check.bench_targets(records)}
    assert rows[("mtsa/triton time ≤ 1.5× mha/sdpa", 1024)]["met"] is True  # 1.4× below n = 2048
    assert rows[("mtsa/triton time ≤ 1.2× mha/sdpa", 16384)]["met"] is False  # 1.25×
    assert rows[("dman/triton time ≤ 1.3× mha/sdpa", 16384)]["met"] is True
    assert rows[("csan1d/triton ≥ 5× faster than SDPA causal", 16384)]["ratio"] == pytest.approx(5 / 0.9)
    assert rows[("csan2d/triton ≥ 2× faster than SDPA causal", 16384)]["met"] is False
    assert rows[("sman/triton ≥ 5× faster than SDPA causal", 16384)]["met"] is None  # not measured: said so
    growth = {r["path"]: r for r in gpu_check.memory_growth(records)}
    assert growth["csan1d/triton"]["per_doubling"] == pytest.approx(2.2)
    assert not growth["csan1d/triton"]["linear"]  # 2.2× per doubling > 2.1×


@pytest.mark.slow
def test_smoke_run_writes_the_report(tmp_path):
    data = write_parallel(tmp_path, n_train=48, n_eval=4)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), str(out), "--smoke", "--steps", "2",
                             "--data", str(data), "--budget", "1100"], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "gpu.json").read_text())
    assert summary["kernels"]["exit_code"] == 0
    assert summary["tests"]["exit_code"] in (0, 5)  # 5: every gpu test skipped on a CPU machine
    assert {row["preset"] for row in summary["training"]} == set(gpu_check.PRESETS)
    assert all(row["exit_code"] == 0 and row["steps"] == 2 for row in summary["training"])
    report = (out / "gpu.md").read_text()
    assert "## maskattn bench --suite gpu" in report and "--smoke" in report
    assert summary["tflops"]["exit_code"] == 0 and summary["tflops"]["rows"]
    assert "## Kernel TFLOP/s at flash-attn's shapes" in report


def test_failures_are_logged_as_they_happen(tmp_path):
    """tests/conftest.py appends each failure's traceback to MASKATTN_FAILURE_LOG at once (gpu_check sets it), so
    a pytest run stopped by a time limit keeps them; passing tests write nothing."""
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_demo.py").write_text("def test_ok():\n    pass\n\n\ndef test_broken():\n"
                                           "    assert 1 + 1 == 3, 'arithmetic'\n")
    log = tmp_path / "failures.log"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "MASKATTN_FAILURE_LOG": str(log)})
    assert result.returncode == 1, result.stdout
    text = log.read_text()
    assert text.startswith("FAILED test_demo.py::test_broken (call)") and "arithmetic" in text
    assert "test_ok" not in text


def test_the_budget_skips_the_parts_it_cannot_hold(tmp_path, monkeypatch, capsys):
    """``--budget``: the kernel tests run first, within their share (at least 30 s); a part that would start with
    under 30 s left is not started and says so in the report (here with 31 s: the kernel test, then nothing else);
    the report and the JSON are written either way. A budget that cannot hold one part is refused.

    The budget is read on a clock the test moves (the kernel test "takes" 5 s of it), so the outcome does not hang
    on how loaded the machine is; the kernel test itself runs for real, with the timeout the budget gave it
    stretched only so that a loaded machine cannot stop it."""
    clock = [1000.0]
    monkeypatch.setattr(gpu_check, "time", SimpleNamespace(perf_counter=lambda: clock[0], strftime=time.strftime))
    timeouts, real_run = [], gpu_check._run

    def timed_run(command, log, timeout, env=None, cwd=None):
        timeouts.append(timeout)
        result = real_run(command, log, 600, env=env, cwd=cwd)
        clock[0] += 5
        return result

    monkeypatch.setattr(gpu_check, "_run", timed_run)
    out = tmp_path / "out"
    assert gpu_check.main([str(out), "--smoke", "--budget", "31", "--data", str(tmp_path / "absent")]) == 0
    assert timeouts == [30]  # the kernel tests' share, raised to the 30 s floor; nothing else started
    summary = json.loads((out / "gpu.json").read_text())
    assert summary["kernels"]["exit_code"] == 0 and summary["kernels"]["counts"] == {"passed": 1}
    assert "tests" not in summary and "bench" not in summary
    notes = " ".join(summary["notes"])
    assert "pytest -m gpu not run: 26 s of the 31 s budget left" in notes and "maskattn bench not run" in notes
    assert "kernel TFLOP/s not run" in notes and "tflops" not in summary
    assert "## Triton kernel tests (tests/test_triton_*.py)" in (out / "gpu.md").read_text()
    with pytest.raises(SystemExit) as refused:
        gpu_check.main([str(out), "--smoke", "--budget", "20"])
    assert refused.value.code == 2 and "--budget must exceed 30 seconds, got 20" in capsys.readouterr().err


def test_the_kernel_tests_are_every_triton_test_file_but_the_compile_check():
    files = gpu_check.kernel_test_files()
    assert "tests/test_triton_band.py" in files and "tests/test_triton_tensorized.py" in files
    assert "tests/test_triton_compile.py" not in files and all(f.startswith("tests/test_triton_") for f in files)


def test_the_tflops_part_keeps_what_its_command_wrote_when_the_budget_stops_it(tmp_path, monkeypatch):
    """The kernel TFLOP/s part runs ``python -m maskattn.bench.kernels`` with its own budget (the part's 90 s
    less 10 for the command's start) and reads back what it wrote even when stopped (exit code 124: the budget,
    not a failure): the measured rows in the report, the others named as not reached."""
    from maskattn.bench import kernels as kb

    commands = []

    def fake_run(command, log, timeout, env=None, cwd=None):
        commands.append((command, timeout))
        folder = Path(command[command.index("maskattn.bench.kernels") + 1])
        folder.mkdir(parents=True)
        settings = kb.Settings(dims=(64,), lengths=(2048,), kernels=("sdpa_flash_causal", "mtsa_head"))
        cases = kb.plan(settings)
        (folder / "plan.json").write_text(json.dumps({"tokens": 16384, "hidden": 2048, "plan": [
            {"kernel": c.kernel.name, "d": c.d, "n": c.n} for c in cases]}))
        (folder / "rows.jsonl").write_text(json.dumps(kb.finish_row(cases[0], 1.0, 3.0)) + "\n")
        log.write_text("stopped\n")
        return 124, timeout

    monkeypatch.setattr(gpu_check, "_run", fake_run)
    out = tmp_path / "out"
    assert gpu_check.main([str(out), "--smoke", "--skip", "kernels,tests,bench,training"]) == 0
    command, timeout = commands[0]
    assert timeout == gpu_check.TFLOPS_S and command[command.index("--budget") + 1] == "80"
    assert command[command.index("--anchor") + 1].endswith("benchmarks/anchor_attention.py")
    summary = json.loads((out / "gpu.json").read_text())
    assert summary["tflops"]["exit_code"] == 124 and len(summary["tflops"]["rows"]) == 1
    report = (out / "gpu.md").read_text()
    assert "## Kernel TFLOP/s at flash-attn's shapes" in report and "| sdpa_flash_causal | causal | 64 | 2048 |" in report
    assert "Not reached within the budget (1 row): mtsa_head d 64: n 2048." in report
    assert "exit code 124 (stopped by the budget)" in report
