"""Benchmark: forward+backward time and peak memory of a DMAN layer vs SAN (MAN Eq. 12 vs Eq. 2).

Compares, for self-attention over ``x`` of shape ``(batch, n, d_model)``:

* ``dman``      — :class:`maskattn.DynamicMaskAttention` (backend ``sdpa``: the query-chunked kernel that
  recomputes in backward and returns the W/P/U gradients itself);
* ``dman_ref``  — the same module on the materialised ``reference`` backend (only with ``--with-reference``);
* ``san``       — :class:`maskattn.MultiHeadAttention` (``F.scaled_dot_product_attention``);
* ``torch_mha`` — ``torch.nn.MultiheadAttention(batch_first=True)`` with ``need_weights=False``.

The ratios in the summary are DMAN / SAN (maskattn.MultiHeadAttention) for the same configuration.

Time: the median (and minimum) wall time of ``out = module(x); out.sum().backward()`` over ``--repeats``
runs after ``--warmup`` runs (CUDA: synchronised); the modules of one configuration run interleaved,
one run each in turn, so a change of machine load affects them alike. Also the median CPU time of the
process (``time.process_time``) over the same runs: with ``--threads 1`` it is the compute itself and
hardly depends on other jobs sharing the machine (wall time does: a descheduled run waits); with more
threads it also counts the time threads spend waiting for each other.

Peak memory on CPU: the increase of the process's peak resident set size during one forward+backward,
``VmHWM − VmRSS(before)`` from ``/proc/self/status``, with the high-water mark reset through
``/proc/self/clear_refs`` (value 5) right before the run. To make RSS follow tensor lifetimes, memory is
measured in a fresh child process started with ``MALLOC_MMAP_THRESHOLD_=65536``: every allocation of
64 KiB or more is then an ``mmap`` that glibc returns to the OS on free (no heap caching, no dynamic
threshold). Timings run in the parent with the default allocator, because per-allocation ``mmap``
slows down code that allocates many blocks. Parameter gradients are set to ``None`` before the run, so their allocation counts
too. This measures everything the run
touches, including kernel scratch buffers that allocator hooks would miss; it needs Linux. CUDA: the
peak of ``torch.cuda.max_memory_allocated`` minus the allocation before the run.

Example (the table in docs/man.md)::

    python benchmarks/bench_man.py --batch 2 --repeats 5 --out bench_man.json
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import gc
import importlib
import json
import os
import platform
import statistics
import sys
import time

import torch

import maskattn
from maskattn.benchmarking import synchronize

MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def build(name: str, d_model: int, heads: int, device: str) -> torch.nn.Module:
    if name == "dman":
        module = maskattn.DynamicMaskAttention(d_model, heads, backend="sdpa")
    elif name == "dman_ref":
        module = maskattn.DynamicMaskAttention(d_model, heads, backend="reference")
    elif name == "san":
        module = maskattn.MultiHeadAttention(d_model, heads, backend="sdpa")
    elif name == "torch_mha":
        module = torch.nn.MultiheadAttention(d_model, heads, batch_first=True)
    else:
        raise ValueError(f"unknown module {name!r}")
    return module.to(device)


def step(module: torch.nn.Module, x: torch.Tensor) -> None:
    if isinstance(module, torch.nn.MultiheadAttention):
        out = module(x, x, x, need_weights=False)[0]
    else:
        out = module(x)
    out.sum().backward()


def peak_memory(module, x, device: str) -> float:
    """Peak memory (MiB) of one forward+backward; see the module docstring for the method."""
    module.zero_grad(set_to_none=True)
    x.grad = None
    gc.collect()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step(module, x)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = _status("VmRSS:")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        step(module, x)
        peak = _status("VmHWM:") - before
    module.zero_grad(set_to_none=True)
    x.grad = None
    return peak / 2**20


def measure(modules: dict, x, *, repeats: int, warmup: int, device: str) -> dict:
    """Times of every module, interleaved run by run (so that load changes hit all alike)."""
    times = {name: [] for name in modules}
    cpu = {name: [] for name in modules}
    for _ in range(warmup):
        for module in modules.values():
            step(module, x)
    for _ in range(repeats):
        for name, module in modules.items():
            module.zero_grad(set_to_none=True)
            x.grad = None
            synchronize(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            step(module, x)
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: {"time_ms_median": 1e3 * statistics.median(t), "time_ms_min": 1e3 * min(t),
                   "cpu_ms_median": 1e3 * statistics.median(cpu[name])}
            for name, t in times.items()}


def memory_rows(args, configs, names) -> list:
    """[[device, heads, n, module], peak MiB] for every configuration (run in the child process)."""
    out = []
    for device, heads, n in configs:
        for name in names:
            torch.manual_seed(0)
            x = torch.randn(args.batch, n, args.d_model, device=device, requires_grad=True)
            module = build(name, args.d_model, heads, device)
            step(module, x)  # warm-up: lazily initialised state is not part of the peak
            out.append([[device, heads, n, name], peak_memory(module, x, device)])
            del module, x
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--heads", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when available")
    parser.add_argument("--with-reference", action="store_true", help="also time the materialised DMAN backend")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--chunk-fraction", type=float, default=None,
                        help="override maskattn.functional.mask_attention.CHUNK_FRACTION (DMAN tile size)")
    parser.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--out", required=True, help="path of the JSON results")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    kernel = importlib.import_module("maskattn.functional.mask_attention")
    if args.chunk_fraction is not None:
        kernel.CHUNK_FRACTION = args.chunk_fraction
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    names = ["dman"] + (["dman_ref"] if args.with_reference else []) + ["san", "torch_mha"]
    torch.manual_seed(0)
    rows = []
    started, load_start = time.time(), os.getloadavg()
    configs = [(device, heads, n) for device in devices for heads in args.heads for n in args.lengths]
    if args.memory_only:
        with open(args.out, "w") as f:
            json.dump(memory_rows(args, configs, names), f)
        return 0
    for device, heads, n in configs:  # 1. time, with the default allocator
        torch.manual_seed(0)
        x = torch.randn(args.batch, n, args.d_model, device=device, requires_grad=True)
        modules = {name: build(name, args.d_model, heads, device) for name in names}
        for name, result in measure(modules, x, repeats=args.repeats, warmup=args.warmup, device=device).items():
            rows.append({"device": device, "heads": heads, "n": n, "batch": args.batch, "d_model": args.d_model,
                         "module": name, **result})
        del modules
    with tempfile.TemporaryDirectory() as tmp:  # 2. peak memory, in a fresh process (see the docstring)
        child_out = os.path.join(tmp, "memory.json")
        child_argv = list(argv) if argv is not None else sys.argv[1:]
        cmd = [sys.executable, os.path.abspath(__file__), *child_argv, "--memory-only", "--out", child_out]
        subprocess.run(cmd, check=True, env={**os.environ, MMAP_ENV: "65536"})
        with open(child_out) as f:
            peaks = {tuple(k): v for k, v in json.load(f)}
    for row in rows:
        row["peak_mib"] = peaks[(row["device"], row["heads"], row["n"], row["module"])]
        print(f"{row['device']:4s} H={row['heads']} n={row['n']:5d} {row['module']:9s} "
              f"{row['time_ms_median']:9.2f} ms (min {row['time_ms_min']:9.2f}, CPU {row['cpu_ms_median']:9.2f})  "
              f"peak {row['peak_mib']:8.2f} MiB",
              flush=True)
    summary = []
    for r in rows:
        if r["module"] != "dman":
            continue
        san = next(s for s in rows if s["module"] == "san" and all(s[k] == r[k] for k in ("device", "heads", "n")))
        summary.append({k: r[k] for k in ("device", "heads", "n")} | {
            "time_ratio": r["time_ms_median"] / san["time_ms_median"],
            "cpu_time_ratio": r["cpu_ms_median"] / san["cpu_ms_median"],
            "memory_ratio": r["peak_mib"] / san["peak_mib"] if san["peak_mib"] > 0 else None})
    meta = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "load_average_start": load_start, "load_average_end": os.getloadavg(), "seconds": time.time() - started,
            "chunk_fraction": kernel.CHUNK_FRACTION,
            "memory_method": "peak RSS increase (VmHWM reset via clear_refs) in a child with MALLOC_MMAP_THRESHOLD_=65536"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "dman_over_san": summary}, f, indent=1)
    for s in summary:
        mem = f"{s['memory_ratio']:.2f}" if s["memory_ratio"] is not None else "n/a"
        print(f"{s['device']:4s} H={s['heads']} n={s['n']:5d}  DMAN/SAN time {s['time_ratio']:.2f}  "
              f"CPU time {s['cpu_time_ratio']:.2f}  memory {mem}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
