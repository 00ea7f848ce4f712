"""The offline compile check (maskattn.kernels.triton.offline.compile_check): every Triton kernel, in the configurations the
launchers choose on CUDA, bound as ``JITFunction.run`` binds it and compiled for sm_80 / sm_86 / sm_90 with the
ptxas that the triton wheel bundles — no GPU. Each check runs in a subprocess: Triton's interpreter, which the rest
of the suite uses, must be off when the kernels are decorated.

Default run: every launch of the ``ci`` matrix bound (refused keywords, specialisation). .ci/run compiles the ``ci``
matrix; the slow tests compile ``smoke`` (every kernel at its widest half-precision configuration on the smallest and
the largest shared memory), ``half`` and ``full`` (docs/gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from maskattn.kernels.triton import runtime
from maskattn.kernels.triton.offline import compile_check

pytestmark = pytest.mark.skipif(not runtime.installed(), reason="needs the triton package")

KERNELS = {"tensorized_fwd", "tensorized_bwd_kv", "tensorized_bwd_q", "dman_fwd", "dman_bwd_kv", "dman_bwd_q",
           "band_fwd", "band_bwd_q", "band_bwd_kv",
           # MTSA's fused elementwise kernels (tensorized.ELEMENTWISE_KERNELS)
           "tensorized_source_max", "tensorized_prologue", "tensorized_reliable", "tensorized_output_grads",
           "tensorized_prologue_bwd"}


def _check(tmp_path, *args: str, timeout: int = 1800) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "-m", "maskattn.kernels.triton.offline.compile_check", *args, "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    rows = json.loads(out.read_text()) if out.exists() else []
    return done, rows


def test_every_launch_binds_as_triton_would(tmp_path):
    """No launch of the ``ci`` matrix is refused at binding (an unknown keyword such as the ``FAST`` that
    ``band_fwd`` was passed without declaring it: the interpreter drops it, ``JITFunction.run`` raises)."""
    done, rows = _check(tmp_path, "--matrix", "ci", "--bind-only")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bound = [r for r in rows if r["status"] == "bound"]
    assert {r["kernel"] for r in bound} == KERNELS
    assert {r["arch"] for r in bound} == set(runtime.TARGETS)  # every architecture auto accepts
    assert not [r for r in rows if r["status"] == "refused"]


def test_the_ci_matrix_holds_every_preset_head_width_and_every_architecture_auto_accepts():
    """issue 41 §1.2–1.3: the ``ci`` matrix compiles the head width of every shipped preset with attention of its
    own (``d_model / num_heads``, read here through the trainer's own config loader), 72, 80 and 96, plain and with
    every option, on every architecture ``auto`` accepts (:data:`runtime.TARGETS`: sm_80 … sm_121)."""
    from maskattn.train.config import list_presets, load_config, preset_path

    widths = set()
    for name in list_presets():
        model = load_config(preset_path(name)).model
        if getattr(model, "pretrained", None):  # a pretrained encoder: no attention of the library's
            continue
        widths.add(model.d_model // model.num_heads)
    assert {64, 150} <= widths  # the transformer presets and the sentence presets (d_model 300, 2 heads)
    assert set(compile_check.preset_head_widths()) == widths
    pairs = compile_check.matrix_pairs("ci")
    assert {arch for _, arch in pairs} == set(runtime.TARGETS)
    for arch in runtime.TARGETS:
        for width in widths | set(compile_check.EXTRA_WIDTHS) | {64, 128, 256}:
            chosen = {(case.family, case.plain) for case, a in pairs if a == arch and case.head_dim == width}
            assert chosen == {(family, plain) for family in ("mtsa", "dman", "band") for plain in (True, False)}, \
                (arch, width)
            # every option on is compiled with both of the band's tile shapes: a wide band with dropout, padding,
            # log-sigmoid scores and a head area is a launch of its own (it spilled 480 B on sm_100 unseen)
            band_all = {dict(case.options)["narrow"] for case, a in pairs
                        if a == arch and case.head_dim == width and case.family == "band" and not case.plain}
            assert band_all == {False, True}, (arch, width)


def test_plain_is_every_configuration_without_an_option_causal_and_not():
    """issue 52 §4: a plain configuration is every option off in every form of the call — non-causal and causal for
    every family (DMAN's ``CAUSAL`` is a compile-time constant: the decoders' DMAN is a compilation of its own; the
    band ``i − left … i`` and an MTSA layer of backward-looking heads are run-time bands), and both of the band's tile
    shapes. Each is :attr:`Case.plain` (spill budget 0 at every width), and the ``ci`` matrix compiles each of them,
    and each with every option on, at every width it covers on every architecture ``auto`` accepts."""
    forms = {"mtsa": {(False,), (True,)}, "dman": {(False,), (True,)},
             "band": {(False, False), (False, True), (True, False), (True, True)}}
    for family, expected in forms.items():
        structure = compile_check.STRUCTURE[family]
        assert structure[0] == "causal"
        plain = compile_check.plain_sets(family)
        assert {tuple(o[k] for k in structure) for o in plain} == expected
        for options in plain:
            assert {k: v for k, v in options.items() if k not in structure} == \
                {k: v for k, v in compile_check.PLAIN[family].items() if k not in structure}
            assert compile_check.Case(family, 64, "bf16", tuple(sorted(options.items()))).plain
        every_on = compile_check.option_sets(family, "all")
        assert {tuple(o[k] for k in structure) for o in every_on} == expected
        assert not any(compile_check.Case(family, 64, "bf16", tuple(sorted(o.items()))).plain for o in every_on)
        # one option on is not plain, in either form
        for options in plain:
            for key, values in compile_check.OPTIONS[family].items():
                if key in structure:
                    continue
                changed = dict(options, **{key: next(v for v in values if v != options[key])})
                assert not compile_check.Case(family, 64, "bf16", tuple(sorted(changed.items()))).plain, changed
    pairs = compile_check.matrix_pairs("ci")
    widths = set(compile_check.preset_head_widths()) | set(compile_check.EXTRA_WIDTHS) | {64, 128, 256}
    for arch in runtime.TARGETS:
        for width in widths:
            for family, expected in forms.items():
                structure = compile_check.STRUCTURE[family]
                chosen = {(tuple(dict(case.options)[k] for k in structure), case.plain) for case, a in pairs
                          if a == arch and case.head_dim == width and case.family == family}
                assert chosen == {(form, plain) for form in expected for plain in (True, False)}, \
                    (arch, width, family)


def test_a_compilation_shared_with_a_plain_case_answers_to_the_plain_budget(tmp_path):
    """Cases whose launches bind to one compilation are compiled once: that compilation is plain (spill budget 0)
    when any of its cases is, whichever came first — a band of a head area of 3 with every option off is the plain
    band's compilation (the area is a run-time table), and so is the causal band."""
    script = textwrap.dedent("""
        from maskattn.kernels.triton.offline import compile_check as cc
        plain = cc.Case("band", 64, "bf16", tuple(sorted(cc.PLAIN["band"].items())))
        area = cc.Case("band", 64, "bf16", tuple(sorted(dict(cc.PLAIN["band"], area=3).items())))
        causal = cc.Case("band", 64, "bf16", tuple(sorted(dict(cc.PLAIN["band"], causal=True).items())))
        assert plain.plain and causal.plain and not area.plain
        alone, _ = cc._jobs([(plain, 90)], 256)
        jobs, rows = cc._jobs([(area, 90), (causal, 90), (plain, 90)], 256)
        assert not rows and len(jobs) == len(alone) == 3, (len(jobs), len(alone))
        assert all(job.case.plain for job in jobs), [job.case.label for job in jobs]
        print("plain")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "plain", done.stderr[-3000:]


@pytest.mark.parametrize("args, words", [
    (["--kernels", "nosuch"], "--kernels: nosuch is not a kernel of mtsa, dman, band"),
    (["--family", "band", "--kernels", "dman_fwd"], "--kernels: dman_fwd is not a kernel of band"),
    (["--seq-len", "0"], "--seq-len takes 1 … 16384 (the launches do not depend on the length), got 0"),
    (["--seq-len", "-5"], "--seq-len takes 1 … 16384 (the launches do not depend on the length), got -5"),
    (["--seq-len", "1e8"], "argument --seq-len: invalid int value: '1e8'"),
    (["--seq-len", "100000000"], "got 100000000"),
    (["--dims", "0"], "--dims takes head widths of at least 1 feature, got 0"),
    (["--dims", "64", "-8"], "--dims takes head widths of at least 1 feature, got -8"),
    (["--jobs", "0"], "--jobs takes at least 1 process, got 0"),
    (["--jobs", "-1"], "--jobs takes at least 1 process, got -1"),
    (["--json", "{file}/rows.json"], "is a file, not a folder"),
    (["--markdown", "{file}/deeper/compile.md"], "is a file, not a folder"),
    (["--json", "{tmp}"], "is a folder; give a file name"),
    (["--json", "{tmp}/same.json", "--markdown", "{tmp}/same.json"], "--json and --markdown name the same file"),
])
def test_bad_arguments_are_one_line_before_any_compiling(tmp_path, capsys, args, words):
    """Arguments the check cannot run with stop it with one line (argparse's usage and error: the option, the value,
    what it takes), before anything is recorded or compiled — in this process, where the interpreter is on: the
    check never gets that far. Before (issue 55): ``--kernels nosuch`` and ``--seq-len 0`` printed "0 rows, 0
    violations" and exited 0; ``--dims 0`` and ``--jobs 0`` failed deep inside; a report path that could not be
    written failed after the whole compilation."""
    (tmp_path / "a-file").write_text("")
    args = [a.format(file=tmp_path / "a-file", tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as stop:
        compile_check.main(["--matrix", "smoke", *args])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("python -m maskattn.kernels.triton.offline.compile_check: error: ") and \
        words in error[-1], error
    assert "interpreter" not in error[-1]  # refused for its arguments, not for the process it runs in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "a refused run leaves no file behind"


def test_a_report_into_a_read_only_place_is_refused_before_compiling(tmp_path, capsys):
    """``--json`` / ``--markdown`` into a folder nothing can be written into (even by root: ``chattr +i``) — one
    line, and nothing written (before: the write failed after the whole compilation)."""
    from _files_helpers import read_only_folder

    with read_only_folder(tmp_path / "read-only") as folder:
        for flag in ("--json", "--markdown"):
            with pytest.raises(SystemExit) as stop:
                compile_check.main(["--matrix", "smoke", flag, str(folder / "report")])
            assert stop.value.code == 2
            last = capsys.readouterr().err.strip().splitlines()[-1]
            assert f"{flag} {folder / 'report'}: folder {folder} is not writable" in last, last
        assert not list(folder.iterdir())


def test_a_check_that_checks_nothing_fails(tmp_path):
    """A run whose every case is unsupported (heads wider than the kernels take) checked nothing: it fails, with
    one line naming the kernels nothing was compiled for — it used to print "0 rows, 0 violations" and exit 0."""
    rows = [compile_check.Row("*", "d=300 bf16", 90, "unsupported", True),
            compile_check.Row("dman_fwd", "d=64 bf16", 90, "ok", True)]
    assert compile_check.unchecked(rows, ["dman_fwd", "dman_bwd_q"]) == ["dman_bwd_q"]
    assert set(compile_check.kernel_names()) == KERNELS
    done, found = _check(tmp_path, "--matrix", "ci", "--bind-only", "--family", "dman", "--dims", "300",
                         "--archs", "90", "--dtypes", "bf16")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert found and {r["status"] for r in found} == {"unsupported"}
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: nothing bound for dman_fwd, dman_bwd_kv, dman_bwd_q"), last


def test_the_markdown_report_says_how_it_was_made():
    """docs/gpu/compile-ci.md is regenerated by the command its first line names (``--json``, an extra output, left
    out), with the counts of the run that wrote it."""
    rows = [compile_check.Row("dman_fwd", "d=64 bf16", 90, "ok", True, "bf16", 64, spill=4),
            compile_check.Row("*", "d=300 bf16", 90, "unsupported", True)]
    text = compile_check.header(["--matrix", "ci", "--jobs", "2", "--json", "rows.json", "--markdown",
                                 "docs/gpu/compile-ci.md"], rows, 12.4)
    assert text.startswith("Generated by `python -m maskattn.kernels.triton.offline.compile_check --matrix ci --jobs 2 "
                           "--markdown docs/gpu/compile-ci.md` (triton ")
    assert "2 rows, 1 compiled, 1 violations, 12 s)" in text and text.endswith("\n\n")


@pytest.mark.parametrize("head_dim, padded, share", [(72, 80, 1 - 72 / 128), (150, 160, 1 - 150 / 256),
                                                      (64, 64, 0.0), (5, 16, 1 - 5 / 16)])
def test_head_widths_are_padded_to_a_multiple_of_16(head_dim, padded, share):
    """The wrappers pad features to a multiple of 16 (runtime.padded_head_dim), so Triton sees widths and strides
    divisible by 16; the tensor-core tiles stay powers of two, whose padding share the check reports."""
    assert runtime.padded_head_dim(head_dim) == padded
    block = max(16, runtime.next_power_of_2(padded))
    assert compile_check.padding_share(head_dim, block, block) == pytest.approx(share)


def test_the_check_catches_a_keyword_the_kernel_does_not_declare(tmp_path):
    """The binding step is Triton's own: a launch with an undeclared keyword (the band kernel's old ``FAST``)
    is refused, as on a GPU."""
    script = textwrap.dedent("""
        import math, torch
        from maskattn.kernels.triton import runtime
        from maskattn.kernels.triton.offline import compile_check as cc
        from maskattn.kernels.triton.band import band_triton
        q = torch.randn(1, 2, 64, 32, dtype=torch.float16)
        with runtime.recording(runtime.TARGETS[80]) as launches:
            band_triton(q, q, q, 3, 3, None, None, None, 0.2, False, 0.0)
        launch = launches[0]
        cc.bind(launch.kernel, launch.args, launch.kwargs, 80)  # as launched: binds
        try:
            cc.bind(launch.kernel, launch.args, dict(launch.kwargs, FAST=True), 80)
        except KeyError as error:
            assert "FAST" in str(error), error
            print("refused")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr[-3000:]


@pytest.mark.slow  # 30 s; .ci/run compiles the ci matrix, a superset
def test_every_kernel_compiles_within_shared_memory_without_spilling(tmp_path):
    """The smoke matrix: every kernel with every option on, float16, head dim 128, on sm_86 (99 KB of shared memory
    per block, the least) and sm_90 (wgmma): compiled, within shared memory and registers, spills within budget, no
    wgmma serialisation."""
    done, rows = _check(tmp_path, "--matrix", "smoke", "--jobs", "2")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    compiled = [r for r in rows if r["status"] == "ok"]
    assert {(r["kernel"], r["arch"]) for r in compiled} == {(k, a) for k in KERNELS for a in (86, 90)}
    from maskattn.kernels.triton.tensorized import ELEMENTWISE_KERNELS
    for row in compiled:
        # every attention pass stages its tiles in shared memory; MTSA's elementwise kernels hold none
        assert row["smem"] <= row["smem_limit"] and (row["smem"] > 0 or row["kernel"] in ELEMENTWISE_KERNELS), row
        assert row["registers"] > 0 and row["spill"] <= compile_check.SPILL_BUDGET_OPTIONS, row


@pytest.mark.slow
@pytest.mark.parametrize("matrix", ["half", "full"])
def test_whole_matrix_compiles_within_the_contract(tmp_path, matrix):
    """Every head width and option set (``full``: also float32, IEEE and TF32 — minutes per kernel)."""
    done, rows = _check(tmp_path, "--matrix", matrix, "--jobs", "2", timeout=6 * 3600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert {r["kernel"] for r in rows if r["status"] == "ok"} == KERNELS


def _row(**fields) -> compile_check.Row:
    base = dict(kernel="tensorized_fwd", case="d=64 fp16", arch=90, status="ok", plain=True, dtype="fp16",
                head_dim=64, warps=4, registers=128, smem=64 * 1024, smem_limit=227 * 1024)
    return compile_check.Row(**{**base, **fields})


@pytest.mark.parametrize("fields, words", [
    ({"status": "refused", "message": "KeyError: 'Keyword argument FAST was specified but unrecognised'"}, "FAST"),
    ({"status": "error", "message": "OutOfResources"}, "error"),
    ({"smem": 232 * 1024}, "shared memory"),
    ({"registers": 255, "warps": 16}, "registers"),
    ({"spill": 8}, "spilled"),
    ({"spill": 300, "plain": False}, "spilled"),
    ({"spill": 8, "head_dim": 256}, "spilled"),  # plain: no spill at any width (issue 41 §1.2)
    ({"advisories": ["C7515: Potential Performance Loss: wgmma.mma_async instructions are serialized"]}, "wgmma"),
])
def test_violations_name_what_breaks_the_contract(fields, words):
    found = compile_check.violations(_row(**fields))
    assert found and any(words in v for v in found), found


@pytest.mark.parametrize("fields", [{}, {"spill": 200, "plain": False}, {"spill": 4000, "head_dim": 256, "plain": False},
                                    {"spill": 4000, "dtype": "fp32"}, {"advisories": ["C7515: ..."], "arch": 80},
                                    {"status": "unsupported", "message": "no tiles"}])
def test_what_the_contract_allows(fields):
    assert compile_check.violations(_row(**fields)) == []


def test_an_architecture_s_own_tiles_win_over_its_class_and_are_recorded_for_it(tmp_path):
    """Blackwell shares the 227 KB class with sm_90, where sm_90's tiles spill (runtime.ARCH_TILES): the launchers
    take the architecture's entry there and the class's on sm_90, and the compile check records the launches of
    such an architecture separately (or it would compile sm_90's tiles for it)."""
    import torch

    assert runtime.ARCH_TILES, "no architecture has tiles of its own: drop this test with the mechanism"
    for (kernel, arch, width), own in runtime.ARCH_TILES.items():
        with runtime.assume_target(runtime.TARGETS[arch]):
            assert runtime.tiles(kernel, width, "cuda", torch.bfloat16) == own
        with runtime.assume_target(runtime.TARGETS[90]):
            assert runtime.tiles(kernel, width, "cuda", torch.bfloat16) == runtime.TILE_TABLE[(kernel, "227K", width)]
        assert own != runtime.TILE_TABLE[(kernel, "227K", width)]
    kernel, arch, width = next(iter(runtime.ARCH_TILES))
    family = "mtsa" if kernel.startswith("tensorized") else "band" if kernel.startswith("band") else "dman"
    done, rows = _check(tmp_path, "--matrix", "ci", "--bind-only", "--family", family, "--archs", "90", str(arch),
                        "--dims", str(width), "--dtypes", "bf16", "--kernels", kernel)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    warps = {(r["arch"], r["warps"], r["stages"]) for r in rows if r["status"] == "bound"}
    own = runtime.ARCH_TILES[(kernel, arch, width)]
    class_tiles = runtime.TILE_TABLE[(kernel, "227K", width)]
    assert (arch, own.warps, own.stages) in warps and (arch, class_tiles.warps, class_tiles.stages) not in warps
    assert (90, class_tiles.warps, class_tiles.stages) in warps


def test_the_runtime_and_the_kernels_import_nothing_from_the_offline_tools():
    """The offline tools sit apart (docs/design.md §7): they import the kernels, never the other way round."""
    import ast
    from pathlib import Path

    folder = Path(runtime.__file__).parent
    modules = sorted(folder.glob("*.py"))
    assert {"runtime.py", "tensorized_jit.py", "dman_jit.py", "band_jit.py"} <= {m.name for m in modules}
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any("offline" in name.split(".") for name in names), f"{module.name} imports {names}"
