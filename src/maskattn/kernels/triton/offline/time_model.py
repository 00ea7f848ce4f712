"""A predicted time per pass and per family, from the report's counts (docs/gpu/offline-perf.md, "Predicted time").

Each pass's per-score counts (:class:`.perf_report.Row`) meet five limits of one SM per clock (:data:`MACHINES`):
tensor-core FLOPs (wgmma and ``mma.sync`` at their own rates), special functions (``MUFU``), instruction issue (all
warp instructions — libdevice's calls, such as an accurate ``log2f``, are counted at their real cost because they
are counted instruction by instruction in the SASS), bytes loaded from L2 into the SM, and — for the PyTorch work
around the kernels, which is elementwise — DRAM bytes. A pass takes as long as its largest limit::

    clocks per computed score = max(tensor, MUFU, issue, L2)       time = clocks × computed scores

A family (what a user swapping attention sees, forward + backward, one (batch, head) pair) is the sum of its passes
and of its wrapper's elementwise bytes over DRAM; its ratio is that time over the anchor's with the nearest mask
(:data:`FAMILIES`). The model knows no stalls, no overlap of limits beyond taking the largest, no occupancy, no
wave quantisation: a ratio, not a time. ``bound`` is the limit behind the largest share of the family's time.

The wrapper's bytes are measured, not estimated (:func:`wrapper_bytes`): the launcher runs forward and backward
with a dispatch mode that adds up the bytes every PyTorch operation outside the kernels
reads and writes (views and allocations move nothing and are not counted), per query position and feature — the
kernels' launches recorded for an sm_90 device, not run, so every dtype is the GPU's; a launch of the launcher's own
elementwise Triton kernels (not an attention pass) counts every tensor it takes once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

#: per SM and clock, dense bfloat16 (NVIDIA's A100 and H100 whitepapers; ``mma.sync`` on sm_90 reaches about two
#: thirds of wgmma; L2 → SM: the A100 whitepaper's 5,120 B/clk over 108 SMs, taken for sm_90 too; DRAM: A100 SXM
#: 2.0 TB/s at 1.41 GHz over 108 SMs, H100 SXM 3.35 TB/s at 1.83 GHz over 132 SMs)


@dataclass(frozen=True)
class Machine:
    """What one SM does per clock."""

    arch: int
    wgmma_flops: float
    mma_flops: float
    mufu: float = 16.0
    issue: float = 4.0  # warp instructions
    l2_bytes: float = 47.0
    dram_bytes: float = 13.0


MACHINES = {90: Machine(90, 4096.0, 2730.0, dram_bytes=13.9), 80: Machine(80, 2048.0, 2048.0, dram_bytes=13.1)}
LIMITS = ("tensor", "mufu", "issue", "l2")

#: family → (the report rows' family and mask, the anchor it is set against, what runs per head). ``mtsa_layer`` is a
#: layer's heads with their masks — MTSA's default heads are directional, half forward and half backward, which cost
#: alike — with the wrapper's elementwise work, against non-causal multi-head attention on the same B, H, n, d.
FAMILIES = {
    "mtsa_layer": (("mtsa", "forward head"), "anchor", "tensorized"),
    "mtsa_head": (("mtsa", "forward head"), "anchor-causal", None),
    "mtsa_window_head": (("mtsa", "window(3) head"), "anchor-causal", None),
    "dman": (("dman", "full, D = 128"), "anchor", "dman"),
    "band": (("band", "band 129"), "anchor-causal", None),
    "band_narrow": (("band-narrow", "band 11 (CSAN window 11)"), "anchor-causal", None),
}
#: the anchor's own elementwise pre-pass, Δ = rowsum(dO ⊙ O): reads O and dO (bfloat16) once per element
ANCHOR_WRAPPER_BYTES = 4.0


def pass_clocks(per_score: dict, machine: Machine, wgmma: bool) -> dict[str, float]:
    """Clocks per computed score of one pass under each limit (``per_score``: a report row's)."""
    flops = per_score["tensor_flops"]
    on_wgmma = per_score.get("wgmma_flops", flops if wgmma else 0.0)
    return {"tensor": on_wgmma / machine.wgmma_flops + (flops - on_wgmma) / machine.mma_flops,
            "mufu": per_score["mufu"] / machine.mufu,
            "issue": per_score["issue"] / machine.issue,
            "l2": per_score["ldg_bytes"] / machine.l2_bytes}


def passes_time(rows, machine: Machine) -> dict[str, float]:
    """Clocks of one (batch, head) pair over ``rows`` (the passes of one family), by the limit that decides each."""
    by_limit = dict.fromkeys(LIMITS + ("memory",), 0.0)
    for row in rows:
        clocks = pass_clocks(row.per_score, machine, row.wgmma)
        limit = max(clocks, key=clocks.__getitem__)
        by_limit[limit] += clocks[limit] * row.computed
    return by_limit


def family_rows(rows, wrapper: dict[str, float], archs=None, lengths=None, dims=None) -> list[dict]:
    """The predicted forward + backward ratio of every family to its anchor, per (d, arch, n) present in ``rows``
    (the report's rows); ``wrapper``: bytes per element of each wrapper's elementwise work (:func:`wrapper_bytes`).
    A family whose rows or anchor rows are missing or failed is left out."""
    out = []
    keys = sorted({(r.head_dim, r.arch, r.n) for r in rows})
    for d, arch, n in keys:
        if (archs and arch not in archs) or (lengths and n not in lengths) or (dims and d not in dims):
            continue
        machine = MACHINES[arch]
        here = [r for r in rows if (r.head_dim, r.arch, r.n) == (d, arch, n) and not r.error]
        for family, ((report_family, mask), anchor, wrapped) in FAMILIES.items():
            mine = [r for r in here if r.family == report_family and r.mask == mask]
            theirs = [r for r in here if r.family == anchor]
            if len(mine) != 3 or len(theirs) != 3:
                continue
            ours, base = passes_time(mine, machine), passes_time(theirs, machine)
            elements = n * d
            if wrapped:
                ours["memory"] += wrapper[wrapped] * elements / machine.dram_bytes
            base["memory"] += ANCHOR_WRAPPER_BYTES * elements / machine.dram_bytes
            total, anchor_total = sum(ours.values()), sum(base.values())
            out.append({"family": family, "d": d, "arch": f"sm_{arch}", "n": n,
                        "anchor_mask": "causal" if anchor.endswith("causal") else "none",
                        "predicted_ratio": round(total / anchor_total, 4),
                        "bound": max(ours, key=ours.__getitem__),
                        "clocks": round(total), "anchor_clocks": round(anchor_total),
                        "by_limit": {k: round(v) for k, v in ours.items() if v},
                        "useful_fraction": round(sum(r.useful for r in mine) / max(sum(r.computed for r in mine), 1),
                                                 4),
                        "wrapper_bytes_per_element": wrapper.get(wrapped, 0.0) if wrapped else 0.0})
    return out


def table(predictions: list[dict]) -> str:
    """The predictions as a Markdown table, one row per family, d and architecture, n across."""
    lengths = sorted({p["n"] for p in predictions})
    index = {(p["family"], p["d"], p["arch"], p["n"]): p for p in predictions}
    head = " | ".join(f"n = {n:,}" for n in lengths)
    lines = [f"| family | against | d | arch | {head} | bound |", "|---|---|---:|---|" + "---:|" * len(lengths) + "---|"]
    for family, d, arch in sorted({(p["family"], p["d"], p["arch"]) for p in predictions},
                                  key=lambda k: (list(FAMILIES).index(k[0]), k[1], k[2])):
        cells = [index.get((family, d, arch, n)) for n in lengths]
        against = "causal flash" if cells[0] and cells[0]["anchor_mask"] == "causal" else "flash"
        bound = cells[-1]["bound"] if cells[-1] else ""
        lines.append(f"| {family} | {against} | {d} | {arch} | "
                     + " | ".join(f"{c['predicted_ratio']:.2f}×" if c else "–" for c in cells) + f" | {bound} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# the wrappers' elementwise work, measured
# --------------------------------------------------------------------------------------------------

_COUNT = r"""
import json, math, sys, torch
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from maskattn.kernels.triton import runtime

FREE = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "detach", "lift_fresh"}

# adds up the bytes each operation reads and writes; maskattn's operators run their Python bodies under the mode, so
# the PyTorch work inside them (MTSA's dN / dD pre-pass, DMAN's delta) is counted; their kernel launches are recorded
# and skipped (runtime.recording)
class Bytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0
        self.ops = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "maskattn":
            with self:
                return OPDEFS[func.name().split(".")[0]]._init_fn(*args, **kwargs)
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in FREE:
            return out
        moved = sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                    if isinstance(t, torch.Tensor))
        self.total += moved
        self.ops[name] = self.ops.get(name, 0) + moved
        return out

family, d = sys.argv[1], int(sys.argv[2])
B, H, n = 1, 2, 64
torch.manual_seed(0)
dtype = torch.bfloat16
def heads():
    return torch.randn(B, n, H, d, dtype=dtype).transpose(1, 2).requires_grad_()
if family == "tensorized":
    from maskattn.kernels.triton.tensorized import KERNELS, tensorized_triton
    q, k, v, s2t = heads(), heads(), heads(), heads()
    inputs = (q, k, v, s2t)
    run = lambda: tensorized_triton(q, k, v, s2t, [(math.inf, -1), (-1, math.inf)], None, scale="log_sigmoid",
                                    dropout_p=0.0)[0]
else:
    from maskattn.kernels.triton.dman import KERNELS, dman_triton
    q, k, v = heads(), heads(), heads()
    a = torch.randn(B, n, requires_grad=True)
    table = torch.randn(2 * 128 + 1, requires_grad=True)
    u = torch.randn(H, requires_grad=True)
    inputs = (q, k, v, a, table, u)
    run = lambda: dman_triton(q, k, v, a, table, u, causal=False, key_padding_mask=None, q_offset=0, dropout_p=0.0,
                              mask_floor=None)
grad = torch.randn(B, n, H, d, dtype=dtype).transpose(1, 2)
counter = Bytes()
with runtime.recording(runtime.TARGETS[90]) as launches, counter:
    out = run()
    torch.autograd.grad(out, inputs, grad)
# the launcher's own elementwise Triton kernels (not the attention passes) read or write each tensor they take once
attention = set(KERNELS)
for launch in launches:
    name = launch.kernel.fn.__name__
    if name in attention:
        continue
    moved = sum(t.numel() * t.element_size() for t in (*launch.args, *launch.kwargs.values())
                if isinstance(t, torch.Tensor) and t.numel() > 1)
    counter.total += moved
    counter.ops["triton:" + name] = counter.ops.get("triton:" + name, 0) + moved
print("BYTES " + json.dumps({"per_element": counter.total / (B * H * n * d), "ops": counter.ops}))
"""


def wrapper_bytes(family: str, head_dim: int = 64) -> dict:
    """Bytes moved per query position and feature by the PyTorch work of ``family``'s launcher (``tensorized``,
    ``dman``) outside its kernels, forward + backward, bfloat16 inputs laid out as a projection's output, with the
    launches of an sm_90 device recorded, not run (a fresh process: :data:`_COUNT`); ``{"per_element": …, "ops":
    {op: bytes}}``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COUNT, family, str(head_dim)], capture_output=True, text=True,
                          env=env, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("BYTES ")]
    if done.returncode or not lines:
        raise RuntimeError(f"counting {family}'s elementwise bytes failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("BYTES "):])


# --------------------------------------------------------------------------------------------------
# the issue's targets, by the prediction
# --------------------------------------------------------------------------------------------------

#: family → the largest predicted forward + backward ratio to its anchor the issue accepts (sm_90, bfloat16, d 64
#: and 128, n 2,048 and 16,384; the bands at 16,384 only: ≥ 5× faster than causal flash)
RATIO_TARGETS = {"mtsa_layer": 1.2, "dman": 1.3, "mtsa_head": 1.6, "band": 0.2, "band_narrow": 0.2}


def ratio_targets(predictions: list[dict]) -> list[tuple[str, str, bool]]:
    """``(target, measured, met)`` per family, d and n of :data:`RATIO_TARGETS` on sm_90 at d 64 and 128."""
    out = []
    for p in sorted(predictions, key=lambda p: (list(FAMILIES).index(p["family"]), p["d"], p["n"])):
        limit = RATIO_TARGETS.get(p["family"])
        if limit is None or p["arch"] != "sm_90" or p["d"] not in (64, 128):
            continue
        if p["family"].startswith("band") and p["n"] != max(x["n"] for x in predictions):
            continue
        against = "causal flash" if p["anchor_mask"] == "causal" else "flash"
        out.append((f"{p['family']} ≤ {limit}× {against} (d {p['d']}, n {p['n']:,})",
                    f"{p['predicted_ratio']:.2f}× ({p['bound']})", p["predicted_ratio"] <= limit))
    return out


def width_targets(rows, n: int, wide: int = 150, base: int = 128, limit: float = 1.25) -> list[tuple[str, str, bool]]:
    """The head width of the presets (``wide`` = 150, padded to 256) against ``base`` = 128, per maskattn pass on
    sm_90 at length ``n``: predicted clocks per useful score and feature within ``limit``×, and wgmma in the pass."""
    out = []
    machine = MACHINES[90]
    index = {(r.family, r.kernel, r.mask, r.head_dim): r for r in rows if r.arch == 90 and r.n == n and not r.error}
    for (family, kernel, mask, d), row in sorted(index.items()):
        if d != wide or family.startswith("anchor") or (family, kernel, mask, base) not in index:
            continue
        other = index[(family, kernel, mask, base)]
        per = [max(pass_clocks(r.per_score, machine, r.wgmma).values()) * r.computed / max(r.useful, 1) / r.head_dim
               for r in (row, other)]
        ratio = per[0] / per[1]
        out.append((f"d {wide} within {limit}× of d {base} per useful score and feature: {kernel} ({mask})",
                    f"{ratio:.2f}×", ratio <= limit))
        if family != "band-narrow" and "window" not in mask:  # narrow tiles hold 16 rows: mma.sync by design
            out.append((f"d {wide}: wgmma on sm_90: {kernel} ({mask})", "HGMMA" if row.wgmma else "HMMA", row.wgmma))
    return out
