"""``maskattn bench``: outputs, fields, separate forward/backward timing, memory-budget skips, errors, FLOPs."""

import csv
import json

import pytest
import torch
from typer.testing import CliRunner

import maskattn
from maskattn.bench import (
    BASELINES,
    BenchResult,
    FIELDS,
    BenchSettings,
    Point,
    measure,
    runner,
    step_flops,
)
from maskattn.bench.baselines import Baseline
from maskattn.bench.settings import select_candidates
from maskattn.bench import count_flops
from maskattn.cli import app
from maskattn.models.fusion import HierarchicalCNN

cli = CliRunner()
TINY = ["--batch", "2", "--width", "8", "--heads", "2", "--warmup", "0", "--device", "cpu"]


def bench(tmp_path, *args):
    return cli.invoke(app, ["bench", *TINY, "--out", str(tmp_path), *args])


def text(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def test_command_writes_csv_json_png_with_the_documented_fields(tmp_path):
    result = bench(tmp_path, "--lengths", "8,16", "--repeats", "2", "--mechanisms", "mha,mtsa,torch_mha",
                   "--backends", "reference,sdpa")
    assert result.exit_code == 0, result.output
    assert "mtsa/reference" in result.output and "torch_mha" in result.output  # the table
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {"format", "machine", "settings", "fields", "descriptions", "notes", "wall_s", "records"} <= set(data)
    assert {"torch", "threads", "cpu_count", "platform"} <= set(data["machine"])
    assert data["settings"]["lengths"] == [8, 16] and data["settings"]["batch"] == 2
    assert data["fields"] == FIELDS
    labels = {"mha/reference", "mha/sdpa", "mtsa/reference", "mtsa/sdpa", "torch_mha"}
    assert {(r["label"], r["n"]) for r in data["records"]} == {(label, n) for label in labels for n in (8, 16)}
    for r in data["records"]:
        assert set(r) == set(FIELDS) and r["status"] == "ok", r
        for phase in ("fwd", "bwd"):
            assert 0 < r[f"{phase}_ms_min"] <= r[f"{phase}_ms_median"] <= r[f"{phase}_ms_max"]
        assert r["peak_mib"] > 0 and r["gflop"] > 0 and r["achieved_gflops"] > 0 and r["matmul_gflops"] > 0
        assert r["matmul_fraction"] == pytest.approx(r["achieved_gflops"] / r["matmul_gflops"])
    assert {r["family"] for r in data["records"] if r["mechanism"] == "mtsa"} == {"tensorized", "tensorized_naive"}
    with open(tmp_path / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(data["records"]) and list(rows[0]) == list(FIELDS)
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_forward_and_backward_are_timed_separately(monkeypatch):
    calls = {"forward": 0, "backward": 0}

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            calls["forward"] += 1
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            calls["backward"] += 1
            return grad * 2

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return Counted.apply(self.linear(x))

    timed = []  # (forward calls, backward calls) inside each timed run
    real_time_call = measure.time_call

    def spy(fn, **kwargs):
        def counted():
            before = dict(calls)
            fn()
            timed.append((calls["forward"] - before["forward"], calls["backward"] - before["backward"]))
        return real_time_call(counted, **kwargs)

    monkeypatch.setattr(measure, "time_call", spy)
    x = torch.randn(2, 3, 4, requires_grad=True)
    out = measure.measure_point(Module(), x, torch.randn(2, 3, 4), repeats=3, warmup=1, device="cpu")
    assert timed == [(1, 0)] * 3 + [(0, 1)] * 3
    assert calls == {"forward": 1 + 1 + 3 + 3, "backward": 1 + 1 + 3}  # warm-up, memory, timed
    assert out["fwd_ms_median"] > 0 and out["bwd_ms_median"] > 0 and out["peak_bytes"] > 0


def test_point_over_the_memory_budget_is_skipped_with_a_message_and_not_run(tmp_path, monkeypatch):
    ran = []
    real = runner.measure_point

    def spy(module, x, *args, **kwargs):
        ran.append(x.shape[1])
        return real(module, x, *args, **kwargs)

    monkeypatch.setattr(runner, "measure_point", spy)
    # the naive n×n×d form: ~25 MB estimated at n=256 (batch 2, width 8), a few KiB at n=8
    result = bench(tmp_path, "--lengths", "8,256", "--repeats", "1", "--mechanisms", "mtsa", "--backends",
                   "reference", "--mem-budget-gb", "0.005")
    assert result.exit_code == 0, result.output
    assert ran == [8]
    assert "skipped cpu mtsa/reference n=256: estimated" in text(result)
    records = {r["n"]: r for r in json.loads((tmp_path / "bench.json").read_text())["records"]}
    assert records[8]["status"] == "ok"
    skipped = records[256]
    assert skipped["status"] == "skipped" and "budget" in skipped["reason"]
    assert skipped["fwd_ms_median"] is None and skipped["peak_mib"] is None and skipped["est_mib"] > 0.005 * 1024


def test_a_run_stopped_part_way_keeps_the_lengths_it_finished(tmp_path, monkeypatch):
    """A time limit or Ctrl-C during the second length: bench.json and bench.csv already hold the first, with a
    note that the result is partial (on a GPU, a run stopped at n = 16384 once lost every length before it)."""
    real = runner.measure_point

    def stopped_at_16(module, x, *args, **kwargs):
        if x.shape[1] == 16:
            raise KeyboardInterrupt
        return real(module, x, *args, **kwargs)

    monkeypatch.setattr(runner, "measure_point", stopped_at_16)
    result = bench(tmp_path, "--lengths", "8,16", "--repeats", "1", "--mechanisms", "mha")
    assert result.exit_code != 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert {r["n"] for r in saved["records"]} == {8} and saved["records"][0]["status"] == "ok"
    assert any("partial result" in note and "n = 8 of [8, 16]" in note for note in saved["notes"])
    with open(tmp_path / "bench.csv", newline="") as f:
        assert {row["n"] for row in csv.DictReader(f)} == {"8"}
    monkeypatch.undo()
    complete = bench(tmp_path, "--lengths", "8,16", "--repeats", "1", "--mechanisms", "mha", "--overwrite")
    assert complete.exit_code == 0, complete.output
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert {r["n"] for r in saved["records"]} == {8, 16}
    assert not any("partial result" in note for note in saved["notes"])


def test_out_of_memory_is_skipped_and_other_errors_fail_the_command(tmp_path, monkeypatch):
    def raising(module, x, *args, **kwargs):
        if isinstance(module, maskattn.MTSA):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        raise RuntimeError("boom")

    monkeypatch.setattr(runner, "measure_point", raising)
    result = bench(tmp_path, "--lengths", "8", "--repeats", "1", "--mechanisms", "mtsa,mha", "--backends", "sdpa")
    assert result.exit_code == 1
    records = {r["mechanism"]: r for r in json.loads((tmp_path / "bench.json").read_text())["records"]}
    assert records["mtsa"]["status"] == "skipped" and records["mtsa"]["reason"].startswith("out of memory")
    assert records["mha"]["status"] == "failed" and records["mha"]["reason"] == "RuntimeError: boom"
    assert "1 point(s) failed" in text(result)


def test_unknown_mechanism_exits_2_naming_the_valid_ones(tmp_path):
    result = bench(tmp_path, "--mechanisms", "mtsa,nope")
    assert result.exit_code == 2
    assert "unknown mechanisms ['nope']" in text(result)
    for name in maskattn.list_attentions() + list(BASELINES):
        assert name in text(result)
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--lengths", "0,8"], "lengths must be positive integers (>= 1), got 0"),
    (["--lengths", "8,-4"], "lengths must be positive integers (>= 1), got -4"),
    (["--lengths", "8,1.5"], "lengths must be positive integers separated by commas, got '1.5'"),
    (["--lengths", "8,,16"], "no empty entries"),
    (["--batch", "0"], "batch must be >= 1, got 0"),
    (["--batch", "2.5"], "--batch"),
    (["--heads", "3"], "d_model (8) must be divisible by num_heads (3)"),
    (["--backends", "fast"], "unknown backends ['fast']; valid backends: banded, flex, reference, sdpa"),
])
def test_bad_options_are_clear_errors(tmp_path, args, message):
    result = cli.invoke(app, ["bench", "--batch", "2", "--width", "8", "--heads", "2", "--mechanisms", "mha",
                              "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in text(result)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(batch=2.5), TypeError, "batch must be an int >= 1, got float 2.5"),
    (dict(lengths=(8, 0)), ValueError, "each length must be >= 1, got 0"),
    (dict(lengths=(8.0,)), TypeError, "each length must be an int"),
    (dict(lengths="64"), TypeError, "lengths must be a sequence of positive ints"),
    (dict(lengths=()), ValueError, "lengths is empty"),
    (dict(repeats=0), ValueError, "repeats must be >= 1"),
    (dict(dtype="float16"), ValueError, "unknown dtype 'float16'"),
    (dict(mechanisms=("mtsa", "mhaa")), ValueError, "unknown mechanisms ['mhaa']; registered mechanisms: csan1d"),
])
def test_settings_validate_at_the_boundary(kwargs, error, message):
    with pytest.raises(error) as info:
        BenchSettings(**kwargs)
    assert message in str(info.value)


def test_quick_suite_and_overrides():
    quick = BenchSettings.quick(batch=2)
    assert quick.lengths == (32, 64, 128, 256) and quick.width == 64 and quick.repeats == 2 and quick.batch == 2
    with pytest.warns(DeprecationWarning, match="BenchSettings.preset is now BenchSettings.suite"):
        assert BenchSettings.preset("quick", batch=2) == quick


def test_devices_mean_what_they_mean_in_every_command(monkeypatch):
    from maskattn.bench.settings import resolve_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_devices("auto") == ["cpu"] and resolve_devices("all") == ["cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_devices("auto") == ["cuda"] and resolve_devices("all") == ["cpu", "cuda"]


def test_the_old_preset_flag_still_works_with_a_warning(tmp_path):
    args = ["bench", "--lengths", "8", "--mechanisms", "mha", "--backends", "sdpa", "--repeats", "1", "--warmup", "0",
            "--device", "cpu", "--out", str(tmp_path)]
    result = cli.invoke(app, [*args, "--preset", "quick"])
    assert result.exit_code == 0, result.output
    assert "--preset is now --suite" in result.output
    result = cli.invoke(app, [*args, "--preset", "quick", "--suite", "quick"])
    assert result.exit_code == 2 and "give --suite only" in result.output


def test_flex_is_left_out_on_cpu_with_a_note():
    candidates, notes = select_candidates(BenchSettings(mechanisms=("mha", "torch_mha")), "cpu")
    assert [c.label for c in candidates] == ["mha/sdpa", "mha/reference", "torch_mha"]
    assert len(notes) == 1 and notes[0].startswith("cpu: mha/flex not run: it supports backward only on CUDA")


B, N, D, H = 2, 12, 16, 4
POINT = Point(B, N, D, torch.float32)


def counted_flops(module):
    x = torch.randn(B, N, D, requires_grad=True)
    grad = torch.randn(B, N, getattr(module, "out_dim", D))
    return count_flops(lambda: module(x).backward(grad))


@pytest.mark.parametrize("name, backend", [("mha", "reference"), ("csan2d", "reference"), ("dman", "reference"),
                                           ("mtsa_algorithm1", "torch"), ("multi_cnn", "torch")])
def test_analytic_flops_equal_flop_counter_mode_where_it_sees_all_the_work(name, backend):
    module = BASELINES[name].build(D, H) if name in BASELINES else maskattn.create_attention(name, D, H,
                                                                                             backend=backend)
    assert step_flops(module, backend, POINT) == counted_flops(module)


def test_tensorized_flops_differ_from_flop_counter_mode_by_exactly_what_it_cannot_see():
    d_h = D // H
    # naive form: FlopCounterMode misses the feature-wise weighted sum Σ_j p_ijl v_jl (forward + 2 × backward)
    naive = maskattn.create_attention("mtsa", D, H, backend="reference")
    assert step_flops(naive, "reference", POINT) == counted_flops(naive) + 3 * 2 * B * H * N * N * d_h
    # value augmentation: the chunked kernel also recomputes q kᵀ in backward, which the analytic count leaves out
    fused = maskattn.create_attention("mtsa", D, H, backend="sdpa")
    assert step_flops(fused, "sdpa", POINT) == counted_flops(fused) - 2 * B * H * N * N * d_h


def test_unmodelled_module_is_counted_by_flop_counter_mode(tmp_path, monkeypatch):
    monkeypatch.setitem(BASELINES, "hrchy_cnn", Baseline("Hrchy-CNN", lambda width, heads: HierarchicalCNN(width)))
    result = bench(tmp_path, "--lengths", "8", "--repeats", "1", "--mechanisms", "hrchy_cnn")
    assert result.exit_code == 0, result.output
    (record,) = json.loads((tmp_path / "bench.json").read_text())["records"]
    assert record["flop_source"] == "FlopCounterMode" and record["gflop"] > 0


def test_useful_attention_flops_count_only_the_pairs_a_mask_allows():
    """FlashAttention's TFLOP/s convention: the attention core over the allowed (query, key) pairs — all of them
    for MHA and DMAN, half (plus the diagonal) for causal or MTSA's directional heads, the band for CSAN / SMAN —,
    forward + backward as 3 × forward."""
    from maskattn.bench.baselines import CausalSDPA
    from maskattn.bench.costs import band_pairs, useful_attention_flops

    n, d_h = 64, D // H
    point = Point(B, n, D, torch.float32)
    full = 3 * 2 * B * H * n * n * (2 * d_h)
    assert useful_attention_flops(maskattn.create_attention("mha", D, H), point) == full
    assert useful_attention_flops(maskattn.create_attention("dman", D, H), point) == full
    assert useful_attention_flops(maskattn.create_attention("mha", D, H), point, inference=True) == full // 3
    half = n * (n + 1) // 2
    assert band_pairs(n, float("inf"), 0) == half and band_pairs(n, 2, 2) == 5 * n - 6
    assert useful_attention_flops(CausalSDPA(D, H), point) == 3 * 2 * B * H * half * (2 * d_h)
    # MTSA: forward and backward heads (diagonal included), over [v ⊙ E ; E]: value width 2·d_h
    assert useful_attention_flops(maskattn.create_attention("mtsa", D, H), point) == 3 * 2 * B * H * half * (3 * d_h)
    csan2d = maskattn.create_attention("csan2d", D, H, window=5, head_window=3)
    assert useful_attention_flops(csan2d, point) == 3 * 2 * B * 3 * H * band_pairs(n, 2, 2) * (2 * d_h)
    assert useful_attention_flops(maskattn.models.fusion.BiRNN(D), point) is None


def test_compile_runs_the_default_mechanisms_and_leaves_out_what_cannot_compile(tmp_path, monkeypatch):
    """Issue 32 item 8: ``bench --compile`` failed on man_san, sdpa_causal (their FLOPs, counted by FlopCounterMode
    around the compiled module, found no compiled frames) and bilstm (packed sequences break the graph). Compiled
    here with Dynamo and the eager backend (the same tracing, no code generation)."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    result = bench(tmp_path, "--lengths", "8", "--repeats", "1", "--warmup", "1", "--compile", "--mechanisms",
                   "man_san,sdpa_causal,bilstm", "--backends", "sdpa")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {(r["label"], r["status"], r["compiled"]) for r in data["records"]} == {
        ("man_san/sdpa", "ok", True), ("sdpa_causal", "ok", True)}
    assert any("bilstm not run with compile: Dynamo does not trace nn.LSTM" in note for note in data["notes"])
    assert all(r["flop_source"] == "FlopCounterMode" and r["gflop"] > 0 for r in data["records"])


def test_the_figure_title_sits_above_its_panels(tmp_path):
    """Issue 32 item 8: the figure's title overlapped the titles of the first row of panels."""
    from maskattn.bench.report import figure

    assert bench(tmp_path, "--lengths", "8", "--repeats", "1", "--mechanisms", "mha,csan1d",
                 "--backends", "sdpa").exit_code == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    fig = figure(BenchResult(machine=data["machine"], settings=data["settings"], descriptions=data["descriptions"],
                             notes=data["notes"], records=data["records"], wall_s=data["wall_s"]))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    panels = [ax.title.get_window_extent(renderer) for ax in fig.axes]
    assert all(title.y0 >= panel.y1 for panel in panels)
