"""MTSA time and memory against sequence length (the setting of MTSA Fig. 1).

For each configuration ``d_model:heads`` and sequence length n, one forward + backward
(``module(x).sum().backward()``, x of shape (batch, n, d_model), float32) of:

* ``mtsa``        — :class:`maskattn.MTSA` (paper defaults: log-sigmoid token2token, forward/backward heads,
  output projection), ``backend="sdpa"``: one scalar attention over ``[v ⊙ E ; E]`` (DESIGN.md §1) in
  the blocked sigmoid kernel of :mod:`maskattn.backends`;
* ``mha``         — ``torch.nn.MultiheadAttention(d_model, heads, batch_first=True)``, ``need_weights=False``
  (PyTorch's fused SDPA kernel);
* ``algorithm1``  — a direct port of the paper's Algorithm 1 (n×n matrices ``E_R`` per head, ``exp`` with
  no max-subtraction), with MTSA's projections: :class:`maskattn.bench.Algorithm1`;
* ``naive``       — the explicit tensor form of Eq. 10–12 (``backend="reference"``: n×n×d_h scores).

Time: median wall time over ``--repeats`` runs after one warm-up (the memory run); the models of one
length are run in turn, repeat by repeat, so that a change of machine load affects all of them alike.
Peak memory: PyTorch CPU-allocator events (:func:`maskattn.benchmarking.peak_memory_bytes`).
FLOPs: ``gflops`` is counted by ``FlopCounterMode`` (matrix products, forward+backward, at batch 1 and
scaled); it does not see inside PyTorch's fused CPU SDPA kernel, so the MTSA / MHA FLOP ratio of the
summary uses the analytic count of :func:`analytic_gflops` instead.
Points whose estimated memory exceeds ``--mem-budget-gb`` are skipped and marked so.

Example (the run in the README)::

    python benchmarks/bench_mtsa.py --out benchmarks/results/bench_mtsa.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn

import maskattn
from maskattn.bench import Algorithm1
from maskattn.benchmarking import count_flops, machine_info, peak_memory_bytes, time_call

MODELS = ("mtsa", "mha", "algorithm1", "naive")


def build(name, d_model, heads):
    if name == "mtsa":
        return maskattn.MTSA(d_model, heads, backend="sdpa")
    if name == "naive":
        return maskattn.MTSA(d_model, heads, backend="reference")
    if name == "algorithm1":
        return Algorithm1(d_model, heads)
    mha = nn.MultiheadAttention(d_model, heads, batch_first=True)
    return lambda x: mha(x, x, x, need_weights=False)[0]  # noqa: E731


def parameters(module):
    owner = module if isinstance(module, nn.Module) else module.__closure__[0].cell_contents
    return list(owner.parameters())


def estimate_bytes(name, batch, heads, n, d_model):
    """Rough peak: the n×n (or n×n×d_h) tensors a model keeps for backward, times a few copies."""
    if name == "naive":
        return 4 * 6 * batch * n * n * d_model  # scores, probabilities, products: B·H·n·n·d_h each
    if name == "algorithm1":
        return 4 * 5 * batch * heads * n * n
    return 4 * 40 * batch * n * d_model


def analytic_gflops(model, batch, n, d_model, heads):
    """Forward+backward FLOPs (backward = 2 × forward) of the matrix products of MTSA and MHA.

    MHA: q/k/v/o projections ``4 · 2 B n d²`` and attention ``q kᵀ`` + ``P v`` = ``4 B n² d`` per forward.
    MTSA: the same projections, the per-head source2token MLP ``2 · 2 B n d d_h``, and attention
    ``q kᵀ`` + ``A [v ⊙ E ; E]`` = ``2 B n² d + 4 B n² d`` per forward (values twice as wide).
    """
    projections = 4 * 2 * batch * n * d_model**2
    if model == "mha":
        forward = projections + 4 * batch * n * n * d_model
    elif model == "mtsa":
        forward = projections + 4 * batch * n * d_model * (d_model // heads) + 6 * batch * n * n * d_model
    else:
        raise ValueError(model)
    return 3 * forward / 1e9


def step(module, x):
    def run():
        for p in parameters(module):
            p.grad = None
        module(x).sum().backward()
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="300:2,600:2", help="comma-separated d_model:heads (default %(default)s)")
    parser.add_argument("--lengths", default="64,128,256,512,1024")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--mem-budget-gb", type=float, default=16.0)
    parser.add_argument("--out", type=Path, default=Path("bench_mtsa.json"))
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: --out with .png)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    unknown = set(models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for config in args.configs.split(","):
        d_model, heads = (int(v) for v in config.split(":"))
        for n in (int(v) for v in args.lengths.split(",")):
            x = torch.randn(args.batch, n, d_model)
            group, runs = [], {}
            for name in models:
                row = {"model": name, "d_model": d_model, "heads": heads, "n": n, "batch": args.batch}
                estimate = estimate_bytes(name, args.batch, heads, n, d_model)
                if estimate > args.mem_budget_gb * 2**30:
                    row["skipped"] = f"estimated {estimate / 2**30:.0f} GiB > budget {args.mem_budget_gb:g} GiB"
                else:
                    module = build(name, d_model, heads)
                    runs[name] = step(module, x)
                    row["peak_bytes"] = peak_memory_bytes(runs[name])  # also the warm-up run
                    row["gflops"] = count_flops(step(module, x[:1])) * args.batch / 1e9
                    row["finite"] = bool(torch.isfinite(module(x[:2])).all())
                group.append(row)
            # interleaved repeats, so that a change of machine load hits every model alike
            times = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, run in runs.items():
                    times[name].append(time_call(run, repeats=1, warmup=0)["median_s"])
            for row in group:
                if row["model"] in times:
                    ts = times[row["model"]]
                    row.update(median_s=statistics.median(ts), min_s=min(ts), max_s=max(ts), repeats=len(ts))
                rows.append(row)
                print(format_row(row), flush=True)
    summary = summarise(rows)
    for line in summary:
        print(line)
    result = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
              "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    args.out.with_suffix(".md").write_text(markdown_table(rows))
    plot(rows, args.plot or args.out.with_suffix(".png"))
    return 0


def format_row(row):
    head = f"{row['model']:>10} d={row['d_model']} h={row['heads']} n={row['n']:>5}"
    if "skipped" in row:
        return f"{head}  skipped: {row['skipped']}"
    return (f"{head}  {row['median_s'] * 1e3:9.1f} ms  {row['peak_bytes'] / 2**20:9.1f} MiB  "
            f"{row['gflops']:8.1f} GFLOP  finite={row['finite']}")


def summarise(rows):
    lines = ["MTSA / nn.MultiheadAttention (time, peak memory, FLOPs):"]
    index = {(r["model"], r["d_model"], r["heads"], r["n"]): r for r in rows}
    for (model, d, h, n), r in index.items():
        base = index.get(("mha", d, h, n))
        if model != "mtsa" or base is None or "skipped" in r or "skipped" in base:
            continue
        flops = analytic_gflops("mtsa", r["batch"], n, d, h) / analytic_gflops("mha", r["batch"], n, d, h)
        lines.append(f"  d={d} h={h} n={n:>5}: time {r['median_s'] / base['median_s']:.2f}x  "
                     f"memory {r['peak_bytes'] / base['peak_bytes']:.2f}x  FLOPs (analytic) {flops:.2f}x")
    return lines


def markdown_table(rows):
    """Per configuration and length: time and peak memory of each model, and the MTSA / MHA ratios."""
    index = {(r["model"], r["d_model"], r["heads"], r["n"]): r for r in rows}
    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    head = ["d_model:heads", "n"] + [f"{m} ms" for m in models] + [f"{m} MiB" for m in models] + \
        ["time MTSA/MHA", "memory MTSA/MHA", "FLOPs MTSA/MHA"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for d, h, n in sorted({(r["d_model"], r["heads"], r["n"]) for r in rows}):
        cells = [f"{d}:{h}", str(n)]
        got = {m: index.get((m, d, h, n)) for m in models}
        ok = {m: r for m, r in got.items() if r is not None and "skipped" not in r}
        cells += [f"{ok[m]['median_s'] * 1e3:.0f}" if m in ok else "skipped" for m in models]
        cells += [f"{ok[m]['peak_bytes'] / 2**20:.0f}" if m in ok else "skipped" for m in models]
        if "mtsa" in ok and "mha" in ok:
            a, b = ok["mtsa"], ok["mha"]
            flops = analytic_gflops("mtsa", a["batch"], n, d, h) / analytic_gflops("mha", a["batch"], n, d, h)
            cells += [f"{a['median_s'] / b['median_s']:.2f}", f"{a['peak_bytes'] / b['peak_bytes']:.2f}", f"{flops:.2f}"]
        else:
            cells += ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = sorted({(r["d_model"], r["heads"]) for r in rows})
    fig, axes = plt.subplots(len(configs), 2, figsize=(10, 3.6 * len(configs)), squeeze=False)
    for row_axes, (d, h) in zip(axes, configs):
        for model in MODELS:
            pts = [r for r in rows if r["model"] == model and (r["d_model"], r["heads"]) == (d, h) and "skipped" not in r]
            if not pts:
                continue
            ns = [r["n"] for r in pts]
            row_axes[0].plot(ns, [r["peak_bytes"] / 2**20 for r in pts], marker="o", label=model)
            row_axes[1].plot(ns, [r["median_s"] for r in pts], marker="o", label=model)
        for ax, label in zip(row_axes, ("peak memory (MiB)", "forward+backward time (s)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(label)
            ax.set_title(f"d_model={d}, heads={h}")
            ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
