"""The offline performance report (``maskattn.kernels.triton.offline.perf_report``, docs/gpu/offline-perf.md): its reading of
SASS on a fixed sample, its occupancy arithmetic, its mirrors of the kernels' loop bounds, and one real compilation
in a subprocess (Triton's interpreter, which the rest of the suite uses, must be off there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from maskattn.kernels.triton import runtime

pytestmark = pytest.mark.skipif(not runtime.installed(), reason="needs triton")

# A hand-written stretch of ``nvdisasm -c`` output: a prologue, a loop whose body branches over a masked region,
# an epilogue. The loop body has 12 live instructions on its heavy path (the branch taken not: masked) and 8 on its
# light path (the branch jumps over the 4 masked ones); the @!PT line is padding and never counts.
SAMPLE = """
        .text.kern:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   MUFU.RCP R0, R0 ;
.L_x_2:
        /*0030*/                   LDGSTS.E.BYPASS.LTC128B.128 [R5], desc[UR6][R8.64] ;
        /*0040*/                   LDSM.16.M88.4 R12, [R5] ;
        /*0050*/                   HMMA.16816.F32.BF16 R16, R12, R14, R16 ;
        /*0060*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0070*/                   MUFU.EX2 R20, R20 ;
        /*0080*/               @P0 BRA `(.L_x_1) ;
        /*0090*/                   FSEL R20, R20, RZ, !P1 ;
        /*00a0*/                   FSEL R21, R21, RZ, !P1 ;
        /*00b0*/                   MUFU.EX2 R22, R22 ;
        /*00c0*/                   STS.64 [R3], R20 ;
.L_x_1:
        /*00d0*/              @!PT LDS RZ, [RZ] ;
        /*00e0*/                   FADD R20, R20, R21 ;
        /*00f0*/              @!P2 BRA `(.L_x_2) ;
        /*0100*/                   STG.E [R2.64], R20 ;
        /*0110*/                   EXIT ;
"""


def test_sass_lines_labels_and_branches_are_parsed():
    from maskattn.kernels.triton.offline.sass import parse_sass
    code = parse_sass(SAMPLE)
    assert [i.address for i in code[:3]] == [0, 0x10, 0x20]
    assert code[3].label == ".L_x_2" and code[3].base == "LDGSTS"
    branch = next(i for i in code if i.address == 0x80)
    assert (branch.predicate, branch.base, branch.target, branch.conditional) == ("@P0", "BRA", ".L_x_1", True)
    padding = next(i for i in code if i.address == 0xd0)
    assert padding.dead and padding.label == ".L_x_1"
    assert next(i for i in code if i.address == 0x60).opcode == "HGMMA.64x64x16.F32.BF16"


def test_the_hot_loop_and_its_light_and_heavy_paths():
    from maskattn.kernels.triton.offline.sass import classify, hot_loop, parse_sass, path_counts
    code = parse_sass(SAMPLE)
    first, last = hot_loop(code)
    assert (code[first].address, code[last].address) == (0x30, 0xf0)
    light, heavy = path_counts(code[first:last + 1])
    assert len(light) == 8 and len(heavy) == 12
    assert [i.address for i in light][-3:] == [0x80, 0xe0, 0xf0]
    c = classify(heavy)
    assert c.tensor == 2 and c.hgmma == 1
    # m16n8k16 per warp, plus a quarter (one warp) of a warpgroup's 64 x 64 x 16
    assert c.tensor_flops == 2 * 16 * 8 * 16 + 2 * 64 * 64 * 16 / 4
    # one descriptor operand: A (64 x 16) and B (16 x 64) both read from shared memory, per warp a quarter
    assert c.wgmma_shared_bytes == (64 * 16 + 16 * 64) * 2 / 4
    assert dict(c.mufu) == {"EX2": 2}
    assert (c.ldg, c.ldg_bytes) == (1, 16)  # the async copy global -> shared
    assert c.shared == 3 and c.shared_bytes == 16 + 16 + 8  # LDGSTS lands 16 B, LDSM x4 reads 16 B, STS.64 8 B
    assert dict(classify(light).mufu) == {"EX2": 1}


# DMAN's shape: a near loop and a far loop, each with the same two products (one of them heavier: its gate), and a
# third innermost loop with one product (a tail) that is not hot; the last loop nests an inner loop (not innermost).
TWO_LOOPS = """
        .text.dman:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_near:
        /*0010*/                   HMMA.16816.F32.BF16 R16, R12, R14, R16 ;
        /*0020*/                   MUFU.EX2 R20, R20 ;
        /*0030*/                   LDG.E R8, desc[UR4][R2.64] ;
        /*0040*/                   HMMA.16816.F32.BF16 R24, R12, R14, R24 ;
        /*0050*/               @P0 BRA `(.L_x_near) ;
.L_x_far:
        /*0060*/                   HMMA.16816.F32.BF16 R16, R12, R14, R16 ;
        /*0070*/                   HMMA.16816.F32.BF16 R24, R12, R14, R24 ;
        /*0080*/               @P1 BRA `(.L_x_far) ;
.L_x_tail:
        /*0090*/                   HMMA.16816.F32.BF16 R16, R12, R14, R16 ;
        /*00a0*/               @P2 BRA `(.L_x_tail) ;
.L_x_outer:
        /*00b0*/                   FADD R20, R20, R21 ;
.L_x_inner:
        /*00c0*/                   FADD R21, R21, R22 ;
        /*00d0*/               @P3 BRA `(.L_x_inner) ;
        /*00e0*/               @P4 BRA `(.L_x_outer) ;
        /*00f0*/                   EXIT ;
"""


def test_hot_loops_finds_every_innermost_loop_with_the_hot_loops_products():
    """The report counts DMAN's near and far loops both (the far tiles run the second): every innermost loop with as
    many tensor-core instructions as the hot one, in address order; a loop with fewer products and a loop that nests
    another are not hot; a kernel without a loop has none."""
    from maskattn.kernels.triton.offline.sass import hot_loop, hot_loops, parse_sass
    code = parse_sass(TWO_LOOPS)
    spans = [(code[a].address, code[b].address) for a, b in hot_loops(code)]
    assert spans == [(0x10, 0x50), (0x60, 0x80)]
    first = hot_loop(code)
    assert (code[first[0]].address, code[first[1]].address) == (0x10, 0x50)  # the longer of the two
    assert hot_loops(parse_sass(SAMPLE)) == [hot_loop(parse_sass(SAMPLE))]
    straight = parse_sass("""
        /*0000*/                   HMMA.16816.F32.BF16 R16, R12, R14, R16 ;
        /*0010*/                   EXIT ;
""")
    assert hot_loops(straight) == [] and hot_loop(straight) is None


def test_occupancy_from_registers_warps_and_shared_memory():
    from maskattn.kernels.triton.offline.sass import occupancy
    assert occupancy(90, 128, 4, 0) == (4, 0.25)  # 128 regs x 128 threads = 16K: 4 blocks by registers
    assert occupancy(90, 255, 8, 0) == (1, 0.125)  # 256 x 256 = 64K: one block
    assert occupancy(80, 64, 4, 100 * 1024) == (1, 4 / 64)  # shared memory: 164 KB hold one 101 KB block
    assert occupancy(90, 32, 4, 0)[0] == 16  # the warp slots: 64 warps per SM


def test_loop_mirrors_count_the_narrow_band_as_the_issue_does():
    """CSAN window 11 with the 64 x 32 narrow tiles of 0.x: 3 key tiles per query tile, 11.5 % of them inside the
    band; MTSA's window(3) head (7 positions) with 64 x 32 tiles aligned to tile edges: 4 tiles, 5.5 %."""
    import numpy as np

    from maskattn.kernels.triton.offline.perf_report import _useful, visited_tiles
    n = 2048
    tiles, allowed = visited_tiles("band_fwd", n, 64, 32, band=(-5, 5))
    assert len(tiles) == 3 * n // 64  # 64 + 10 keys per query tile: three 32-key tiles
    useful = _useful(tiles, allowed, 64, 32)
    assert useful == sum(min(i + 5, n - 1) - max(i - 5, 0) + 1 for i in range(n))
    assert useful / (len(tiles) * 64 * 32) == pytest.approx(0.115, abs=0.002)
    tiles, allowed = visited_tiles("tensorized_fwd", n, 64, 32, band=(-3, 3))
    assert _useful(tiles, allowed, 64, 32) / (len(tiles) * 64 * 32) == pytest.approx(0.055, abs=0.001)
    # every useful score is visited exactly once: the band's area
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    for kernel in ("tensorized_fwd", "tensorized_bwd_kv", "band_bwd_kv", "anchor_bwd_q"):
        band = (-(1 << 30), -1) if kernel.startswith("tensorized") else (-5, 5)
        tiles, allowed = visited_tiles(kernel, n, 32, 64, band=band, causal=True)
        assert len(set((i0, j0) for i0, j0, _ in tiles)) == len(tiles)
        assert _useful(tiles, allowed, 32, 64) == int(np.count_nonzero(allowed(i, j)))


_QUICK = """
import json, sys
from maskattn.kernels.triton.offline import perf_report as pr
p = next(p for p in pr.passes() if p.kernel == "tensorized_fwd" and p.mask == "window(3) head")
rows = pr.measure(p, 64, 80, (256,))
json.dump([pr.asdict(r) for r in rows], sys.stdout)
"""


@pytest.mark.slow  # one compilation in a fresh process: ~10 s idle, more on a loaded machine
def test_the_report_compiles_and_reads_one_pass(tmp_path):
    """One real compilation (MTSA's forward, d = 64, sm_80) read back: tensor cores in the loop, 6d tensor FLOPs per
    computed score (scores, numerator, denominator), one exponential per score, no spill."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", _QUICK], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)
    assert not row["error"], row["error"]
    assert row["registers"] > 0 and row["spill_bytes"] == 0 and not row["wgmma"]
    assert row["light"]["tensor"] > 0
    # the per-score figures also hold the prologue and the epilogue: at n = 256 within a few per cent
    assert row["per_score"]["tensor_flops"] == pytest.approx(6 * 64, rel=0.05)
    assert row["per_score"]["mufu_kinds"]["EX2"] == pytest.approx(1.0, abs=0.1)
    assert 0 < row["useful"] < row["computed"]


def _row(family, kernel, mask, mufu, useful=100, computed=100, wgmma=True, spill=0):
    from maskattn.kernels.triton.offline.perf_report import Row
    per = dict(tensor_flops=512.0, mufu=mufu, mufu_kinds={"EX2": mufu}, ldg=0.25, ldg_bytes=4.0, shared_bytes=8.0,
               wgmma_shared_bytes=12.0, issue=0.5)
    return Row(family, kernel, mask, 128, 90, 2048, tiles="64x64", warps=4, stages=2, registers=200,
               spill_bytes=spill, smem=65536, blocks_per_sm=1, occupancy=0.0625, wgmma=wgmma, computed=computed,
               useful=useful, per_score=per)


def test_ratios_and_targets_against_the_anchor():
    """Ratios divide by the anchor's pass of the same kind (per computed score: the unmasked anchor; per useful
    score: the causal one for a directional mask), and the targets read them: MUFU 1.2× the anchor's passes, 2.4×
    fails; a window(3) head with 5 % of its scores in the band fails the tile bound (7/32 = 21.9 %: 16 rows reach
    22 keys, two key tiles of 16), one with 21.9 % meets it; a spill is named."""
    from maskattn.kernels.triton.offline.perf_report import document, ratio_table, targets
    rows = [_row("anchor", "anchor_fwd", "full", 1.0), _row("anchor-causal", "anchor_fwd", "causal", 1.0, 90),
            _row("mtsa", "tensorized_fwd", "forward head", 1.2, 45, 50),
            _row("mtsa", "tensorized_bwd_kv", "forward head", 1.0, wgmma=False, spill=8),
            _row("anchor", "anchor_bwd_kv", "full", 1.0),
            _row("anchor-causal", "anchor_bwd_kv", "causal", 1.0, 90),
            _row("mtsa", "tensorized_fwd", "window(3) head", 1.2, 5, 100),
            _row("mtsa", "tensorized_bwd_q", "window(3) head", 1.2, 7, 32)]
    table = ratio_table(rows, 2048)
    line = next(x for x in table.splitlines() if "forward head" in x and "tensorized_fwd" in x)
    cells = [c.strip() for c in line.split("|")[1:-1]]
    # TC FLOPs per computed 1.00; per useful: (512 * 50 / 45) / (512 * 100 / 90) = 1.00; MUFU 1.20 and 1.20
    assert cells[5:9] == ["1.00", "1.00", "1.20", "1.20"]
    before = [_row(r.family, r.kernel, r.mask, 2.4 if r.family == "mtsa" else 1.0, r.useful, r.computed) for r in rows]
    text = targets(rows, 2048, before)
    assert "| MUFU per score ≤ 1.5× the anchor's | tensorized_fwd | 128 | sm_90 | 2.40× | 1.20× | yes |" in text
    assert "| wgmma on sm_90 at d = 128 | tensorized_bwd_kv | 128 | sm_90 | HGMMA | HMMA | no |" in text
    assert "(window(3) head; the issue asked ≥ 40 %) | tensorized_fwd | 128 | sm_90 | 5.0% (bound 21.9%) | " \
           "5.0% (bound 21.9%) | no |" in text
    assert "(window(3) head; the issue asked ≥ 40 %) | tensorized_bwd_q | 128 | sm_90 | 21.9% (bound 21.9%) | " \
           "21.9% (bound 21.9%) | yes |" in text
    assert "tensorized_bwd_kv d128 sm_90" in text.splitlines()[-1]
    page = document(rows, before, "python -m maskattn.kernels.triton.offline.perf_report", 1.0)
    assert page.startswith("# Offline performance report") and "## Before" in page and "What no static count" in page


def test_the_narrow_band_bound_is_the_share_of_16_row_tiles_a_band_fills():
    """``w / roundup(15 + w, 16)`` checked against the tiles themselves: 16 queries of a band of ``w`` positions,
    started where the band starts, over key tiles of 16 — the share of their scores inside the band, in the middle of
    a long sequence."""
    import numpy as np

    from maskattn.kernels.triton.offline.perf_report import _band_width, narrow_band_bound
    for width in range(1, 40):
        left = (width - 1) // 2
        i0 = 1000
        keys = 16 * -(-(15 + width) // 16)  # the key tiles of 16 the band of 16 rows spans
        i = np.arange(i0, i0 + 16)[:, None]
        j = np.arange(i0 - left, i0 - left + keys)[None, :]
        inside = np.count_nonzero((j - i >= -left) & (j - i <= width - 1 - left))
        assert inside == 16 * width
        assert narrow_band_bound(width) == pytest.approx(inside / (16 * keys))
    assert (_band_width("band 11 (CSAN window 11)"), _band_width("window(3) head")) == (11, 7)
    assert narrow_band_bound(11) == pytest.approx(11 / 32) and narrow_band_bound(7) == pytest.approx(7 / 32)


def _pass_row(family, kernel, mask, per, computed=1000, useful=1000, d=64, n=2048, wgmma=True):
    from maskattn.kernels.triton.offline.perf_report import Row
    return Row(family, kernel, mask, d, 90, n, wgmma=wgmma, computed=computed, useful=useful, per_score=per)


def test_a_pass_takes_its_largest_limit():
    """Per computed score: wgmma FLOPs at 4,096 per clock, the rest of the tensor work at mma.sync's 2,730, MUFU at
    16, warp instructions at 4, bytes from L2 at 47 — and a family adds its passes by the limit that decides each."""
    from maskattn.kernels.triton.offline import time_model as tm
    machine = tm.MACHINES[90]
    per = dict(tensor_flops=4096.0, wgmma_flops=2048.0, mufu=1.0, issue=0.5, ldg_bytes=4.7)
    clocks = tm.pass_clocks(per, machine, wgmma=True)
    assert clocks["tensor"] == pytest.approx(2048 / 4096 + 2048 / 2730)
    assert (clocks["mufu"], clocks["issue"], clocks["l2"]) == pytest.approx((1 / 16, 0.125, 0.1))
    # rows of an earlier report have no wgmma_flops: all of it on wgmma when the pass uses it
    old = {k: v for k, v in per.items() if k != "wgmma_flops"}
    assert tm.pass_clocks(old, machine, wgmma=True)["tensor"] == pytest.approx(1.0)
    assert tm.pass_clocks(old, machine, wgmma=False)["tensor"] == pytest.approx(4096 / 2730)
    rows = [_pass_row("mtsa", "k", "m", dict(per, issue=8.0), computed=100),
            _pass_row("mtsa", "k", "m", per, computed=10)]
    by_limit = tm.passes_time(rows, machine)
    assert by_limit["issue"] == pytest.approx(2.0 * 100) and by_limit["tensor"] == pytest.approx(clocks["tensor"] * 10)


def test_a_familys_ratio_is_its_passes_and_its_wrappers_bytes_over_the_anchors():
    """mtsa_layer: the forward head's three passes plus the wrapper's bytes per element over DRAM, against the
    non-causal anchor's passes plus its Δ pre-pass; mtsa_head against the causal anchor, without the wrapper."""
    from maskattn.kernels.triton.offline import time_model as tm
    machine = tm.MACHINES[90]
    issue_only = dict(tensor_flops=0.0, mufu=0.0, issue=4.0, ldg_bytes=0.0)  # 1 clock per computed score
    rows = []
    for stage in ("fwd", "bwd_kv", "bwd_q"):
        rows.append(_pass_row("mtsa", f"tensorized_{stage}", "forward head", issue_only, computed=600))
        rows.append(_pass_row("anchor", f"anchor_{stage}", "full", issue_only, computed=1000))
        rows.append(_pass_row("anchor-causal", f"anchor_{stage}", "causal", issue_only, computed=500))
    predictions = {p["family"]: p for p in tm.family_rows(rows, {"tensorized": 10.0, "dman": 0.0})}
    assert set(predictions) == {"mtsa_layer", "mtsa_head"}  # the other families have no rows here
    elements = 2048 * 64
    anchor = 3000 + tm.ANCHOR_WRAPPER_BYTES * elements / machine.dram_bytes
    layer = predictions["mtsa_layer"]
    assert layer["predicted_ratio"] == pytest.approx((1800 + 10.0 * elements / machine.dram_bytes) / anchor, rel=1e-3)
    assert layer["bound"] == "memory" and layer["anchor_mask"] == "none" and layer["arch"] == "sm_90"
    causal = 1500 + tm.ANCHOR_WRAPPER_BYTES * elements / machine.dram_bytes
    assert predictions["mtsa_head"]["predicted_ratio"] == pytest.approx(1800 / causal, rel=1e-3)
    assert predictions["mtsa_head"]["anchor_mask"] == "causal" and predictions["mtsa_head"]["bound"] == "issue"
    # a failed pass leaves its family out rather than predicting from two passes
    rows[0].error = "RuntimeError: no loop"
    assert {p["family"] for p in tm.family_rows(rows, {"tensorized": 10.0})} == set()
    checks = tm.ratio_targets(list(predictions.values()))
    assert ("mtsa_layer ≤ 1.2× flash (d 64, n 2,048)", f"{layer['predicted_ratio']:.2f}× (memory)",
            layer["predicted_ratio"] <= 1.2) in checks
    table = tm.table(list(predictions.values()))
    assert "| mtsa_layer | flash | 64 | sm_90 |" in table and "| mtsa_head | causal flash | 64 | sm_90 |" in table


def test_the_tutorial_comparison_reads_as_ratios_and_refuses_what_it_cannot_compile(tmp_path):
    """Per direction, the anchor over the tutorial; within 5 % or not; a path that is not the tutorial is refused
    naming it (no silent empty comparison)."""
    from maskattn.kernels.triton.offline import tutorial
    figures = {"issue": {"tutorial": 0.25, "anchor": 0.26, "ratio": 1.04},
               "mufu": {"tutorial": 1.0, "anchor": 1.0, "ratio": 1.0},
               "tensor_flops": {"tutorial": 256.0, "anchor": 256.0, "ratio": 1.0}}
    rows = [{"direction": "forward", "d": 64, "arch": 90, **figures}]
    assert tutorial.within(rows) and "| forward | 64 | sm_90 | 250 → 260 (1.04×) | 1 → 1 (1.00×) |" in \
        tutorial.table(rows)
    rows[0]["issue"] = {"tutorial": 0.25, "anchor": 0.35, "ratio": 1.4}
    assert not tutorial.within(rows)
    with pytest.raises(FileNotFoundError, match="no file at"):
        tutorial.load(tmp_path / "missing.py", 90)
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    with pytest.raises(ImportError, match="has no _attn_fwd"):
        tutorial.load(other, 90)


@pytest.mark.parametrize("args, words", [
    (["--families", "nosuch"], "--families: nosuch is not a family of the report (they are anchor, anchor-causal, "
                               "mtsa, dman, band, band-narrow)"),
    (["--kernels", "nosuch"], "--kernels: nosuch is not a pass of the report"),
    (["--families", "anchor"], "--families anchor leaves no maskattn pass to report"),
    (["--families", "dman", "--kernels", "band_fwd"], "--families dman --kernels band_fwd leaves no maskattn pass"),
    (["--dims", "0"], "--dims takes sizes of at least 1, got 0"),
    (["--dims", "64", "-8"], "--dims takes sizes of at least 1, got -8"),
    (["--lengths", "0"], "--lengths takes sizes of at least 1, got 0"),
    (["--lengths", "100000000"], "--lengths takes 1 … 65,536 (every visited tile is mirrored in Python), got 100000000"),
    (["--lengths", "1e8"], "argument --lengths: invalid int value: '1e8'"),
    (["--jobs", "0"], "--jobs takes at least 1 process, got 0"),
    (["--jobs", "-1"], "--jobs takes at least 1 process, got -1"),
    (["--json", "{file}/rows.json"], "is a file, not a folder"),
    (["--doc", "{tmp}"], "--doc {tmp} is a folder; give a file name"),
    (["--markdown", "{file}/deeper/report.md"], "is a file, not a folder"),
    (["--predictions", "{tmp}/p.json", "--json", "{tmp}/p.json"], "--json and --predictions name the same file"),
    (["--before", "{tmp}/missing.json"], "--before: rows file {tmp}/missing.json does not exist"),
    (["--before", "{file}"], "--before: {file} is not the rows of a --json run"),
    (["--before", "{rows}", "--json", "{rows}"], "is the --before file"),
    (["--tutorial", "{tmp}/missing.py"], "--tutorial {tmp}/missing.py: no such file"),
])
def test_bad_arguments_are_one_line_before_any_compiling(tmp_path, capsys, args, words):
    """Arguments the report cannot run with stop it with one line (argparse's error: the option, the value, what it
    takes) before anything is recorded or compiled — in this process, where the interpreter is on: the report never
    gets that far. Before (issue 55): ``--families nosuch`` / ``--kernels nosuch`` compiled the anchor alone and
    exited 0; with ``--dims 0`` every row was an error and the targets read "yes"; an output that could not be
    written failed after the whole run."""
    from maskattn.kernels.triton.offline import perf_report
    (tmp_path / "a-file").write_text("")
    (tmp_path / "rows.json").write_text("[]")
    values = dict(file=tmp_path / "a-file", tmp=tmp_path, rows=tmp_path / "rows.json")
    args, words = [a.format(**values) for a in args], words.format(**values)
    with pytest.raises(SystemExit) as stop:
        perf_report.main(args)
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("python -m maskattn.kernels.triton.offline.perf_report: error: ") and \
        words in error[-1], error
    assert "interpreter" not in error[-1]  # refused for its arguments, not for the process it runs in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "rows.json"], "a refused run writes nothing"


def test_outputs_into_a_read_only_place_are_refused_before_compiling(tmp_path, capsys):
    """``--json`` / ``--markdown`` / ``--doc`` / ``--predictions`` into a folder nothing can be written into (even
    by root: ``chattr +i``) — one line, nothing written (before: the write failed at the end of the run)."""
    from _files_helpers import read_only_folder
    from maskattn.kernels.triton.offline import perf_report

    with read_only_folder(tmp_path / "read-only") as folder:
        for flag in ("--json", "--markdown", "--doc", "--predictions"):
            with pytest.raises(SystemExit) as stop:
                perf_report.main([flag, str(folder / "out")])
            assert stop.value.code == 2
            last = capsys.readouterr().err.strip().splitlines()[-1]
            assert f"{flag} {folder / 'out'}: folder {folder} is not writable" in last, last
        assert not list(folder.iterdir())


def test_a_failed_pass_meets_no_target():
    """Rows that failed (``--dims 0`` made every row an error) are not measured: the targets name them and say "no"
    — before, with no row measured, "no spill (every pass of the report) | all | … | yes"."""
    from maskattn.kernels.triton.offline.perf_report import Row, targets
    failed = [Row(family, kernel, mask, 64, 90, 2048, error="RuntimeError: no tiles")
              for family, kernel, mask in (("anchor", "anchor_fwd", "full"), ("dman", "dman_fwd", "full, D = 128"))]
    text = targets(failed, 2048)
    assert "| yes |" not in text
    assert "| every pass measured (a failed pass meets no target) | anchor_fwd d64 sm_90, dman_fwd d64 sm_90 |" in text
    assert text.splitlines()[-1].endswith("| 0 spilling | no |")
    assert targets([], 2048).splitlines()[-2].startswith("| every pass measured (a failed pass meets no target) | "
                                                          "no maskattn pass |")
    # one measured pass beside a failed one: its own targets stand, "no spill" does not
    rows = [_row("anchor", "anchor_fwd", "full", 1.0), _row("mtsa", "tensorized_fwd", "forward head", 1.2), *failed]
    text = targets(rows, 2048)
    assert "| MUFU per score ≤ 1.5× the anchor's | tensorized_fwd | 128 | sm_90 | 1.20× | yes |" in text
    assert text.splitlines()[-1].endswith("| 0 spilling | no |")
    assert targets(rows[:2], 2048).splitlines()[-1] == \
        "| no spill (every pass of the report) | all | | | 0 spilling | yes |"


def test_the_before_rows_are_read_back_through_the_bounded_reader(tmp_path):
    """``--before`` rows round-trip (a ``--json`` run's rows), and a file that is not such rows is named."""
    from maskattn.errors import DataError
    from maskattn.kernels.triton.offline.perf_report import load_rows
    rows = [_row("anchor", "anchor_fwd", "full", 1.0)]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{**r.__dict__} for r in rows]))
    assert load_rows(str(path)) == rows
    path.write_text(json.dumps({"not": "rows"}))
    with pytest.raises(DataError, match="is not the rows of a --json run"):
        load_rows(str(path))
