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
    for row in compiled:
        assert 0 < row["smem"] <= row["smem_limit"], row
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
