"""Local attention (CSAN 1D/2D): the banded O(n·window) path against dense masked attention.

For every sequence length n the script times one forward + backward of the attention core
``maskattn.functional.local_attention(q, k, v, window=W, head_window=A)`` with q, k, v of shape
(batch, heads, n, d_model / heads), float32, for these paths:

* ``banded``      — ``backend="banded"``: blocked band kernel, O(n·W) time and memory;
* ``dense-sdpa``  — ``backend="sdpa"``: dense masked ``F.scaled_dot_product_attention`` (on CPU PyTorch
  picks its fused flash kernel: O(n²) time, but only the (…, n, A·n) bool mask is quadratic in memory);
* ``dense-math``  — the same call forced onto SDPA's math kernel (``sdpa_kernel(SDPBackend.MATH)``),
  i.e. masked attention that materialises the (B, H, n, A·n) scores and probabilities;
* ``flex``        — FlexAttention with a block mask (CUDA only).

Timing: wall clock (``time.perf_counter``, with ``torch.cuda.synchronize`` on GPU) of ``repeats``
forward+backward runs after one untimed run (the memory run below); the median is reported.

Peak memory, CPU: the forward+backward runs inside ``torch.profiler.profile(profile_memory=True)``,
which records every allocation and free made through PyTorch's CPU allocator (including buffers
allocated inside fused kernels) as ``[memory]`` events with signed byte counts. Summing them in time
order gives the live bytes allocated during the call; the peak of that running sum is reported. The
inputs q, k, v and the output gradient exist before the window and are not counted; everything else is
(activations saved for backward, temporaries, the mask, and the returned input gradients, which are
obtained with ``torch.autograd.grad`` so that they are allocated inside the window).
Peak memory, CUDA: ``torch.cuda.max_memory_allocated`` minus the allocated bytes before the call.

Points that would not fit are skipped and say so: before running a dense point the script estimates
its peak: dense-math ``c · B·H·n·(A·n)·4`` bytes (c = 5: scores, probabilities, their gradients, a
spare; the c measured at the smallest n replaces it once known) plus the bool mask; dense-sdpa (fused)
twice the bool mask plus eight q-sized buffers; it skips the point when the estimate exceeds
``--mem-budget-gb``. Dense points whose time, extrapolated
quadratically from the last measured n, exceeds ``--max-seconds`` per run are skipped for time.

Target check: at ``--target-n`` the paths are compared at the largest batch (≤ ``--batch``) at which
the dense paths fit the memory budget and time limit; that batch is stated in the output. Its timed
repeats are interleaved across the paths (banded, dense, banded, dense, …) so that a change of machine
load hits every path alike. ``--skip-sweep`` runs the target check alone, ``--skip-target`` the sweep
alone. The load average (1/5/15 min) is recorded at the start and end of the run and for every point.

Examples (the runs in docs/csan.md)::

    python benchmarks/bench_local.py --out benchmarks/results/bench_local.json
    python benchmarks/bench_local.py --threads 1 --skip-sweep --batch 1 --paths banded dense-sdpa --repeats 5 \
        --out benchmarks/results/bench_local_target.json
    python benchmarks/bench_local.py --threads 1 --skip-target --paths banded --n 1024 2048 4096 8192 16384 \
        --repeats 3 --out benchmarks/results/bench_local_growth.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from maskattn.benchmarking import peak_memory_bytes, time_call
from maskattn.functional import local_attention

PATHS_CPU = ("banded", "dense-sdpa", "dense-math")
PATHS_CUDA = ("banded", "flex", "dense-sdpa", "dense-math")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--window", type=int, default=11)
    p.add_argument("--head-windows", type=int, nargs="+", default=[1, 3], help="1 = CSAN 1D, 3 = CSAN 2D")
    p.add_argument("--paths", nargs="+", default=None, help="subset of " + ", ".join(PATHS_CUDA))
    p.add_argument("--repeats", type=int, default=2, help="timed runs per point (median reported)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mem-budget-gb", type=float, default=8.0, help="skip points estimated above this")
    p.add_argument("--max-seconds", type=float, default=25.0, help="skip dense points estimated slower per run")
    p.add_argument("--target-n", type=int, default=8192)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--skip-sweep", action="store_true", help="run only the target check at --target-n")
    p.add_argument("--skip-target", action="store_true", help="run only the sweep over --n")
    p.add_argument("--out", default="benchmarks/results/bench_local.json",
                   help="JSON path; the PNG plot is written next to it with the suffix .png")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------------------

def make_inputs(batch, heads, n, d_h, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v, grad = (torch.randn(batch, heads, n, d_h, generator=g).to(device) for _ in range(4))
    return [t.requires_grad_(True) for t in (q, k, v)], grad


def step(path, q, k, v, grad, window, head_window):
    backend = {"banded": "banded", "flex": "flex", "dense-sdpa": "sdpa", "dense-math": "sdpa"}[path]
    ctx = sdpa_kernel(SDPBackend.MATH) if path == "dense-math" else nullcontext()
    with ctx:
        out = local_attention(q, k, v, window=window, head_window=head_window, backend=backend)
        grads = torch.autograd.grad(out, (q, k, v), grad)
    return out, grads


def timed(fn, device):
    return time_call(fn, repeats=1, warmup=0, device=device)["median_s"]


def measure(path, batch, heads, n, d_h, window, head_window, repeats, device):
    (q, k, v), grad = make_inputs(batch, heads, n, d_h, device)
    fn = lambda: step(path, q, k, v, grad, window, head_window)  # noqa: E731
    peak = peak_memory_bytes(fn, device)  # also the warm-up run
    times = [timed(fn, device) for _ in range(repeats)]
    return statistics.median(times), times, peak


def measure_interleaved(paths, batch, heads, n, d_h, window, head_window, repeats, device):
    """Peak memory of each path (also its warm-up run), then ``repeats`` rounds that time every path
    once each, in turn: {path: (median seconds, times, peak bytes)}."""
    (q, k, v), grad = make_inputs(batch, heads, n, d_h, device)
    fns = {path: (lambda path=path: step(path, q, k, v, grad, window, head_window)) for path in paths}
    peaks = {path: peak_memory_bytes(fn, device) for path, fn in fns.items()}
    times = {path: [] for path in paths}
    for _ in range(repeats):
        for path, fn in fns.items():
            times[path].append(timed(fn, device))
    return {path: (statistics.median(times[path]), times[path], peaks[path]) for path in paths}


def dense_estimate(path, batch, heads, n, head_window, coef):
    """Up-front peak estimate (bytes) of a dense point: quadratic terms only."""
    area = head_window * n
    mask = heads * n * area if head_window > 1 else n * n
    if path == "dense-math":
        return coef * batch * heads * n * area * 4 + mask
    return 2 * mask + 8 * batch * heads * n * 64 * 4  # fused: the bool mask (+ a copy), q/k/v-sized buffers


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------

def plan_row(args, path, batch, n, head_window, tag, coefs, last_time):
    """The row of one point, with ``skipped`` set when a dense point is estimated over budget or time."""
    row = dict(sweep=tag, path=path, head_window=head_window, n=n, batch=batch)
    key = (path, head_window)
    if path.startswith("dense"):
        budget = args.mem_budget_gb * 2**30
        est = dense_estimate(path, batch, args.heads, n, head_window, coefs.get(key, 5.0))
        row["estimated_peak_bytes"] = int(est)
        if est > budget:
            row["skipped"] = f"estimated peak {est / 2**30:.1f} GiB > budget {args.mem_budget_gb} GiB"
        elif key in last_time:
            t_prev, n_prev, b_prev = last_time[key]
            t_est = t_prev * (n / n_prev) ** 2 * batch / b_prev
            row["estimated_seconds"] = t_est
            if t_est > args.max_seconds:
                row["skipped"] = f"estimated {t_est:.0f} s per run > --max-seconds {args.max_seconds:.0f}"
    return row


def record(row, args, result, coefs, last_time):
    t, times, peak = result
    n, batch, head_window, path = row["n"], row["batch"], row["head_window"], row["path"]
    row.update(seconds=t, times=times, peak_bytes=int(peak), load_average=os.getloadavg())
    last_time[(path, head_window)] = (t, n, batch)
    if path == "dense-math" and (path, head_window) not in coefs:
        coefs[(path, head_window)] = max(1.0, (peak - n * n) / (batch * args.heads * n * head_window * n * 4))


def run_sweep(args, device, paths, batch, ns, rows, tag, coefs, last_time):
    d_h = args.d_model // args.heads
    for head_window in args.head_windows:
        for path in paths:
            for n in ns:
                row = plan_row(args, path, batch, n, head_window, tag, coefs, last_time)
                if "skipped" not in row:
                    record(row, args, measure(path, batch, args.heads, n, d_h, args.window, head_window,
                                              args.repeats, device), coefs, last_time)
                rows.append(row)
                print(format_row(row), flush=True)


def run_target(args, device, paths, batch, rows, coefs, last_time):
    """The target check at --target-n: every path that fits, with interleaved timed repeats."""
    d_h = args.d_model // args.heads
    for head_window in args.head_windows:
        planned = [plan_row(args, path, batch, args.target_n, head_window, "target", coefs, last_time)
                   for path in paths]
        runnable = [row["path"] for row in planned if "skipped" not in row]
        results = measure_interleaved(runnable, batch, args.heads, args.target_n, d_h, args.window, head_window,
                                      args.repeats, device)
        for row in planned:
            if row["path"] in results:
                record(row, args, results[row["path"]], coefs, last_time)
            rows.append(row)
            print(format_row(row), flush=True)


def format_row(row):
    label = f"[{row['sweep']}] {row['path']:>10} {'1D' if row['head_window'] == 1 else '2D'} n={row['n']:>6} B={row['batch']}"
    if "skipped" in row:
        return f"{label}  skipped: {row['skipped']}"
    return f"{label}  {row['seconds'] * 1e3:10.1f} ms  peak {row['peak_bytes'] / 2**20:10.1f} MiB"


def target_batch(args, paths):
    """Largest batch ≤ --batch at which every dense path fits the memory budget at --target-n."""
    budget = args.mem_budget_gb * 2**30
    for b in range(args.batch, 0, -1):
        if all(dense_estimate(p, b, args.heads, args.target_n, hw, 5.0) <= budget
               for p in paths if p.startswith("dense") for hw in args.head_windows):
            return b
    return 1


def summarize(rows, args):
    out = {}
    key = lambda r: (r["sweep"], r["path"], r["head_window"], r["n"])  # noqa: E731
    table = {key(r): r for r in rows if "seconds" in r}
    for hw in args.head_windows:
        name = "1D" if hw == 1 else "2D"
        band = {r["n"]: r["seconds"] for r in rows if r["sweep"] == "sweep" and r["path"] == "banded"
                and r["head_window"] == hw and "seconds" in r}
        if 1024 in band and max(band) > 1024:
            n_max = max(band)
            out[f"{name}: banded time growth {n_max}/1024 vs linear"] = band[n_max] / band[1024] / (n_max / 1024)
        b = table.get(("target", "banded", hw, args.target_n))
        for dense in ("dense-sdpa", "dense-math"):
            d = table.get(("target", dense, hw, args.target_n))
            if b and d:
                out[f"{name}: n={args.target_n} B={b['batch']} {dense}/banded time"] = d["seconds"] / b["seconds"]
                out[f"{name}: n={args.target_n} B={b['batch']} {dense}/banded peak memory"] = \
                    d["peak_bytes"] / b["peak_bytes"]
    return out


def plot(rows, args, path_png, device):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (path, hw), style in _styles(rows).items():
        pts = sorted((r["n"], r["seconds"], r["peak_bytes"]) for r in rows
                     if r["sweep"] == "sweep" and r["path"] == path and r["head_window"] == hw and "seconds" in r)
        if not pts:
            continue
        n, t, m = zip(*pts)
        label = f"{path} {'1D' if hw == 1 else '2D'}"
        axes[0].plot(n, t, style, label=label)
        axes[1].plot(n, [x / 2**20 for x in m], style, label=label)
    for ax, ylabel in zip(axes, ("forward+backward time (s)", "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"local attention, batch {args.batch}, d_model {args.d_model}, {args.heads} heads, window "
                 f"{args.window}, {device.type} ({torch.get_num_threads()} threads)")
    fig.tight_layout()
    fig.savefig(path_png, dpi=110)


def _styles(rows):
    marks = {"banded": "o-", "flex": "s-", "dense-sdpa": "^--", "dense-math": "x:"}
    keys = sorted({(r["path"], r["head_window"]) for r in rows})
    return {k: marks[k[0]] for k in keys}


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    paths = args.paths or (PATHS_CUDA if device.type == "cuda" else PATHS_CPU)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    started = time.time()
    rows, coefs, last_time = [], {}, {}
    load_start = os.getloadavg()
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"load average {load_start}", flush=True)
    if not args.skip_sweep:
        run_sweep(args, device, paths, args.batch, args.n, rows, "sweep", coefs, last_time)
    if not args.skip_target:
        tb = target_batch(args, paths)
        print(f"target check at n={args.target_n}: batch {tb} (largest batch <= {args.batch} whose dense estimate "
              f"fits), repeats interleaved across paths")
        run_target(args, device, paths, tb, rows, coefs, last_time)
    summary = summarize(rows, args)
    for k, v in summary.items():
        print(f"{k}: {v:.2f}")
    result = dict(
        command=" ".join([os.path.basename(sys.executable), *sys.argv]),
        config=vars(args), device=str(device), torch=torch.__version__, threads=torch.get_num_threads(),
        platform=platform.platform(), load_average_start=load_start, load_average_end=os.getloadavg(),
        wall_seconds=time.time() - started, rows=rows, summary=summary,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    written = [args.out]
    if any(r["sweep"] == "sweep" and "seconds" in r for r in rows):
        written.append(os.path.splitext(args.out)[0] + ".png")
        plot(rows, args, written[-1], device)
    print(f"load average at the end {os.getloadavg()}; wrote {' and '.join(written)} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
