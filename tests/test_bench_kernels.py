"""Kernel TFLOP/s at flash-attn's shapes (maskattn.bench.kernels, the "kernel TFLOP/s" part of scripts/gpu_check.py):
the FLOP arithmetic against hand-computed values, the shapes and their order, the budget with a fake clock, the
report read back from a stopped run, the comparison with the offline prediction, and the real calls on the CPU at
toy sizes (Triton under the interpreter; flex forward only). On a GPU (-m gpu) the compiled kernels are timed."""

from __future__ import annotations

import json

import pytest
import torch

from maskattn.bench import kernels as kb

FLASH = kb.Settings()


def _case(name, d=64, n=2048, settings=FLASH):
    return kb.Case(kb._BY_NAME[name], d, n, *kb.shape(d, n, settings))


def test_band_scores_count_the_positions_inside_the_band():
    for n, left, right in ((1, 5, 5), (3, 5, 5), (10, 1, 1), (40, 5, 5), (40, 3, 0), (16384, 64, 64)):
        brute = sum(1 for i in range(n) for j in range(n) if i - left <= j <= i + right) if n < 100 else None
        if brute is not None:
            assert kb.band_scores(n, left, right) == brute
    assert kb.band_scores(3, 5, 5) == 9  # wider than the sequence: every score
    assert kb.band_scores(10, 1, 1) == 28  # 10 rows of 3, less one at each end
    assert kb.band_scores(16384, 5, 5) == 16384 * 11 - 30  # CSAN window 11


def test_flops_follow_flash_attn_convention():
    """flash-attn's benchmark_flash_attention.py: 4·B·n²·H·d forward (B·n = 16k, H·d = 2,048), halved when
    causal; backward 2.5×, forward + backward 3.5×."""
    case = _case("sdpa_flash")
    assert (case.B, case.H) == (8, 32)
    assert kb.forward_flops(case) == 4 * 8 * 2048**2 * 2048 == 274_877_906_944
    assert kb.forward_flops(_case("anchor_causal")) == kb.forward_flops(case) / 2
    assert kb.forward_flops(_case("mtsa_head")) == kb.forward_flops(case) / 2  # the causal attention it replaces
    assert kb.forward_flops(_case("mtsa_layer")) == kb.forward_flops(case)  # non-causal multi-head attention
    assert kb.forward_flops(_case("dman", d=128, n=16384)) == 4 * 1 * 16384**2 * 2048
    narrow = _case("band_narrow", n=16384)
    assert kb.forward_flops(narrow) == 4 * 1 * 32 * 64 * (16384 * 11 - 30)
    assert kb.forward_flops(_case("flex_band_narrow", n=16384)) == kb.forward_flops(narrow)
    assert kb.tflops(2e12, 1000.0) == pytest.approx(2.0) and kb.tflops(1.0, None) is None
    row = kb.finish_row(case, 1.0, 3.5, reps=5)
    assert row["bwd_ms"] == pytest.approx(2.5)
    assert row["fwd_tflops"] == pytest.approx(274.877906944)
    assert row["bwd_tflops"] == pytest.approx(274.877906944)  # 2.5× the FLOPs in 2.5× the time
    assert row["fwd_bwd_tflops"] == pytest.approx(274.877906944)
    assert row["status"] == "ok" and row["reps"] == 5 and row["counted"] == "full"
    assert kb.finish_row(narrow, 1.0, 2.0)["counted"] == "band 11"


def test_the_plan_is_flash_attn_shapes_with_the_predicted_lengths_first():
    cases = kb.plan(FLASH)
    assert len(cases) == len(kb.KERNELS) * 2 * 6 == 192
    assert all(c.B * c.n == 16384 and c.H * c.d == 2048 for c in cases)
    assert {c.n for c in cases} == {512, 1024, 2048, 4096, 8192, 16384} and {c.d for c in cases} == {64, 128}
    flex = [i for i, c in enumerate(cases) if c.kernel.impl == "flex"]
    assert flex == list(range(len(cases) - len(flex), len(cases)))  # flex last: tens of seconds to compile each
    first = [c for c in cases if c.kernel.impl != "flex"][:40]
    assert {c.n for c in first} == {2048, 16384} and [c.d for c in first[:20]] == [64] * 20
    assert [c.kernel.name for c in cases[:4]] == ["sdpa_flash", "sdpa_flash_causal", "anchor", "anchor_causal"]
    assert {k.family for k in kb.KERNELS} - {None} == {"mtsa_layer", "mtsa_head", "mtsa_window_head", "dman",
                                                       "band", "band_narrow"}


def test_estimates_scale_the_last_measurement_by_its_flops():
    assert kb.reps_for(10.0, FLASH) == 10 and kb.reps_for(1000.0, FLASH) == 5 and kb.reps_for(0.1, FLASH) == 30
    later = _case("sdpa_flash", n=4096)
    assert kb.estimate_s(later, FLASH, None) == kb.COMPILE_S["sdpa"] + kb.SETUP_S
    # 10 ms at n = 2048 → 20 ms at 4096 (same tokens, twice the scores per row): 5 repetitions
    expected = kb.SETUP_S + (7 * 20.0 + 5 * 20.0 / 3.5) / 1e3
    assert kb.estimate_s(later, FLASH, (_case("sdpa_flash"), 10.0)) == pytest.approx(expected)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_budget_passes_over_what_does_not_fit_and_keeps_every_row_as_measured():
    """Each measurement advances the fake clock by its own time (2 s SDPA, 9 s the others); with 38 s, at n =
    2048: SDPA (estimated 2.5 s: its compilation), the anchor, DMAN (fails) and the band (10.5 s each) fit,
    MTSA's head (10.5 s, 9 s left) does not; at 4096 SDPA and the anchor, now known to take milliseconds, still
    do, while MTSA's head, never compiled, does not. A kernel that failed is not retried at the same head width."""
    clock, written = FakeClock(), []
    settings = kb.Settings(dims=(64,), lengths=(2048, 4096), first=(2048,),
                           kernels=("sdpa_flash", "anchor", "dman", "band", "mtsa_head"))

    def measure_case(case):
        clock.now += {"sdpa": 2.0, "anchor": 9.0, "triton": 9.0}[case.kernel.impl]
        if case.kernel.name == "dman":
            return kb.finish_row(case, None, None, status="error", message="boom")
        return kb.finish_row(case, 1.0, 3.0)

    rows = kb.run(kb.plan(settings), settings, budget_s=38.0, measure_case=measure_case, clock=clock,
                  write=written.append)
    assert written == rows
    got = [(r["kernel"], r["n"], r["status"]) for r in rows]
    assert got == [("sdpa_flash", 2048, "ok"), ("anchor", 2048, "ok"), ("dman", 2048, "error"),
                   ("band", 2048, "ok"), ("sdpa_flash", 4096, "ok"), ("anchor", 4096, "ok"),
                   ("dman", 4096, "skipped")]
    assert rows[-1]["message"] == "failed at n = 2048"


def _write_run(folder, rows, plan, arch=90, truncated=True):
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"arch": arch, "tokens": 16384, "hidden": 2048, "device": "cuda", "gpu": "NVIDIA H200",
            "plan": [{"kernel": c.kernel.name, "d": c.d, "n": c.n} for c in plan]}
    (folder / "plan.json").write_text(json.dumps(meta))
    text = "".join(json.dumps(r) + "\n" for r in rows) + ('{"kernel": "mtsa_he' if truncated else "")
    (folder / "rows.jsonl").write_text(text)


def test_a_stopped_run_reads_back_with_ratios_not_reached_rows_and_the_offline_comparison(tmp_path):
    settings = kb.Settings(dims=(64,), lengths=(2048,), kernels=("sdpa_flash_causal", "anchor_causal",
                                                                 "mtsa_head", "band_narrow", "flex_mtsa_head"))
    cases = kb.plan(settings)
    times = {"sdpa_flash_causal": (1.0, 3.0), "anchor_causal": (1.2, 4.0), "mtsa_head": (2.0, 6.0)}
    rows = [kb.finish_row(c, *times[c.kernel.name], reps=5, first_call_s=3.0) for c in cases
            if c.kernel.name in times]
    _write_run(tmp_path / "run", rows, cases)  # stopped while writing band_narrow's row
    offline = tmp_path / "offline-perf.json"
    offline.write_text(json.dumps([
        {"family": "mtsa_head", "d": 64, "arch": 90, "n": 2048, "anchor_mask": "causal", "predicted_ratio": 2.09,
         "bound": "issue"},
        {"family": "mtsa_head", "d": 64, "arch": "sm_80", "n": 2048, "anchor_mask": "causal", "predicted_ratio": 2.2,
         "bound": "issue"},
        {"family": "mtsa_head", "d": 150, "arch": 90, "n": 2048, "anchor_mask": "causal", "predicted_ratio": 2.5,
         "bound": "tensor"},
        {"family": "band_narrow", "d": 64, "arch": "sm_90", "n": 2048, "anchor_mask": "causal",
         "predicted_ratio": 0.06, "bound": "memory"}]))
    summary = kb.load(tmp_path / "run", offline)
    assert summary["planned"] == 5 and len(summary["rows"]) == 3
    assert [(p["kernel"], p["n"]) for p in summary["not_reached"]] == [("band_narrow", 2048),
                                                                       ("flex_mtsa_head", 2048)]
    mtsa = next(r for r in summary["rows"] if r["kernel"] == "mtsa_head")
    assert mtsa["vs_sdpa"] == pytest.approx(2.0) and mtsa["vs_anchor"] == pytest.approx(1.5)
    # only sm_90 (the device's) rows at a measured (family, d, n); the band was not reached
    assert [(c["family"], c["d"]) for c in summary["comparison"]] == [("mtsa_head", 64), ("band_narrow", 64)]
    head, band = summary["comparison"]
    assert head["measured_ratio"] == pytest.approx(1.5)
    assert head["measured_over_predicted"] == pytest.approx(1.5 / 2.09)
    assert band["measured_ratio"] is None and band["measured_over_predicted"] is None

    text = kb.render(summary)
    assert text.startswith("## Kernel TFLOP/s at flash-attn's shapes\n")
    assert "3 of 5 rows measured" in text
    header = ("| kernel | mask | d | n | B×H | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | "
              "fwd+bwd TFLOP/s | × SDPA flash | × anchor |")
    assert header in text
    # 4·8·2048²·2048 / 2 FLOPs (causal) in 2 ms forward: 68.7 TFLOP/s; 3.5× that in 6 ms: 80.2
    assert "| mtsa_head | directional j < i, σ | 64 | 2048 | 8×32 | 2.000 | 4.000 | 6.000 | 68.7 | 85.9 | 80.2 | " \
           "2.00 | 1.50 |" in text
    assert "First call (compilation included), s: sdpa_flash_causal d 64 3.0; anchor_causal d 64 3.0; " \
           "mtsa_head d 64 3.0." in text
    assert "Not reached within the budget (2 rows): band_narrow d 64: n 2048; flex_mtsa_head d 64: n 2048." in text
    assert "| mtsa_head | 64 | 2048 | causal | 2.09 | 1.50 | 0.72 | issue |" in text
    assert "| band_narrow | 64 | 2048 | causal | 0.06 | – | – | memory |" in text
    assert all(line.count("|") == header.count("|") for line in text.splitlines()
               if line.startswith("| mtsa_head | directional"))


def test_anchor_masks_of_the_offline_rows():
    assert kb._anchor_mask("non-causal multi-head", "mtsa_layer") == "full"
    assert kb._anchor_mask("causal", "dman") == "causal"
    assert kb._anchor_mask(None, "band") == "causal" and kb._anchor_mask("", "dman") == "full"


def test_a_run_that_never_started_reads_back_empty(tmp_path):
    summary = kb.load(tmp_path / "absent")
    assert summary["rows"] == [] and summary["planned"] == 0
    assert "0 of 0 rows measured" in kb.render(summary)


def test_the_real_calls_on_the_cpu(tmp_path):
    """The command at toy sizes: SDPA's flash kernel, the anchor and the narrow band under Triton's interpreter
    forward and backward, flex forward only; the files it writes read back."""
    code = kb.main([str(tmp_path / "out"), "--smoke", "--budget", "120",
                    "--kernels", "sdpa_flash_causal,anchor_causal,band_narrow,flex_band_narrow"])
    assert code == 0
    summary = json.loads((tmp_path / "out" / "kernels.json").read_text())
    rows = {r["kernel"]: r for r in summary["rows"]}
    assert set(rows) == {"sdpa_flash_causal", "anchor_causal", "band_narrow", "flex_band_narrow"}
    assert all(r["status"] == "ok" and r["fwd_ms"] > 0 for r in rows.values()), rows
    assert rows["band_narrow"]["fwd_bwd_ms"] > 0 and rows["band_narrow"]["vs_anchor"] is not None
    assert rows["flex_band_narrow"]["fwd_bwd_ms"] is None and "forward only" in rows["flex_band_narrow"]["message"]
    assert (rows["band_narrow"]["B"], rows["band_narrow"]["H"], rows["band_narrow"]["d"]) == (2, 2, 16)
    assert "# Kernel TFLOP/s at flash-attn's shapes" in (tmp_path / "out" / "kernels.md").read_text()


def test_a_failing_call_is_a_row_not_the_end_of_the_run(monkeypatch):
    def broken(*args):
        raise RuntimeError("triton.compiler.errors.CompilationError: at 12:4\nmore lines")

    monkeypatch.setattr(kb, "_call", broken)
    settings = kb.Settings.smoke()
    row = kb.measure(_case("band", d=16, n=16, settings=settings), settings, device="cpu")
    assert row["status"] == "error" and row["fwd_ms"] is None and row["fwd_bwd_tflops"] is None
    assert row["message"] == "RuntimeError: triton.compiler.errors.CompilationError: at 12:4"


def test_without_cuda_the_command_refuses(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kb.main([str(tmp_path / "out")]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_the_kernels_are_timed_on_a_gpu(tmp_path):
    """On CUDA: every maskattn kernel and SDPA at a small flash-attn-like shape, forward and backward."""
    settings = kb.Settings(dims=(64,), lengths=(1024,), tokens=4096, hidden=512, min_reps=2, max_reps=3,
                           kernels=("sdpa_flash", "sdpa_flash_causal", "mtsa_layer", "dman", "mtsa_head",
                                    "mtsa_window_head", "band", "band_narrow"))
    rows = [kb.measure(case, settings) for case in kb.plan(settings)]
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows if r["status"] != "ok"]
    assert all(r["fwd_bwd_tflops"] > 0 and r["bwd_ms"] > 0 for r in rows)
