"""The GPU acceptance run: ``scripts/gpu_check.sh OUTDIR`` (``python scripts/gpu_check.py OUTDIR``).

A script of the source checkout, not part of the installed package: its first part runs the checkout's test
suite (``tests/``, with the checkout's root as the working directory); ``maskattn`` must be installed from the
same checkout (``pip install -e '.[dev]'``).

On one CUDA GPU, in order, each part kept in OUTDIR with its own log, all within ``--budget`` seconds (default
510: one command of a lent GPU's session; a part that would start with under 30 s left is skipped with a note, and a
part stopped by the budget keeps what it wrote):

1. the Triton kernels' own tests (``tests/test_triton_*.py`` but the offline compile check, not ``slow``): on CUDA
   they run the compiled kernels with the device's tiles against the float64 oracles (the CPU runs them under
   Triton's interpreter) — at most 35 % of the budget;
2. ``pytest -m gpu`` — no host synchronisation on the default paths, flex gradients against the reference,
   bf16 / fp16 autocast training (``tests/test_gpu.py``) — at most 25 %; in both, each failure's traceback goes
   to ``failures.log`` as it happens, so a run stopped by a time limit keeps them;
3. kernel TFLOP/s (``python -m maskattn.bench.kernels``, :mod:`maskattn.bench.kernels`) — kernel-only forward,
   backward and forward + backward times and TFLOP/s at flash-attn's benchmark shapes (bf16, B·n = 16k tokens,
   H·d = 2,048, d 64 / 128, n 512 … 16k) of each maskattn Triton kernel beside SDPA flash, FlexAttention with the
   nearest mask and the anchor (``benchmarks/anchor_attention.py``), the measured ratio to the anchor beside
   ``docs/gpu/offline-perf.json``'s prediction — at most :data:`TFLOPS_S` seconds; rows are kept as measured
   (``tflops/rows.jsonl``) and those the budget leaves out are named;
4. ``maskattn bench --suite gpu`` — bf16, d_model 512, 8 heads, batch 8, n = 512 … 16384, forward + backward
   and peak memory of every backend (``triton`` beside ``flex``, ``sdpa``, ``banded``), against SDPA multi-head
   attention and SDPA's causal kernel; the fused-kernel issue's targets are evaluated from its records
   (:func:`bench_targets`, :func:`memory_growth`); ``bench.json`` is rewritten after every length;
5. ``--steps`` training steps of each ``multi30k-*-gpu`` preset with ``train.compile`` (when ``--data`` holds
   Multi30k): loss, tokens/s, seconds per step, compilation time.

Then ``OUTDIR/gpu.md`` (the report) and ``OUTDIR/gpu.json`` (every figure). Without CUDA it stops at once with
exit code 2 and says so; ``--smoke`` runs the whole pipeline on the CPU at toy sizes (to test the command).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from maskattn.bench import kernels as kernel_bench

#: the source checkout this script belongs to: pytest runs its tests/
ROOT = Path(__file__).resolve().parents[1]

__all__ = ["main", "bench_targets", "memory_growth"]

PRESETS = ("multi30k-transformer-gpu", "multi30k-man-gpu", "multi30k-csan-gpu", "multi30k-mtsa-encoder-gpu")
#: the auto backend of each mechanism on CUDA training (maskattn list --backends): the path the targets judge
TARGET_LABELS = {"mtsa": "mtsa/triton", "dman": "dman/triton", "csan1d": "csan1d/triton", "csan2d": "csan2d/triton",
                 "sman": "sman/triton", "mha": "mha/sdpa"}
#: peak memory of a fused path may grow at most this much per doubling of n (linear: 2)
MEMORY_PER_DOUBLING = 2.1
#: the default time of the whole run (seconds): one command of a lent GPU, under its 10-minute limit
BUDGET_S = 510
#: the largest share of the budget the kernel tests and the gpu tests may take
KERNEL_TESTS_SHARE, GPU_TESTS_SHARE = 0.35, 0.25
#: a part is not started with less than this many seconds left
MIN_PART_S = 30
#: the most seconds the kernel TFLOP/s part may take, and the seconds of it left to the command's start (Python,
#: torch, CUDA) and its report: the benchmark's own budget is the difference
TFLOPS_S, TFLOPS_STARTUP_S = 90, 10


#: ``--smoke``: one fast kernel test (the command's path, not the kernels: the CPU runs them in the default suite)
SMOKE_KERNEL_TESTS = ["tests/test_triton_band.py::test_empty_sequence"]


def kernel_test_files() -> list[str]:
    """The Triton kernels' test files (``tests/test_triton_*.py``), without the offline compile check's."""
    return [str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("tests/test_triton_*.py"))
            if p.name != "test_triton_compile.py"]


def _run(command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> tuple[int, float]:
    """Run ``command`` (in ``cwd``; default: this process's working directory) with its output in ``log`` (and
    ``env`` added to this process's environment); (exit code, seconds)."""
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=cwd,
                                  env=None if env is None else {**os.environ, **env}).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[gpu_check] stopped after {timeout:.0f} s\n")
            code = 124
    return code, time.perf_counter() - start


def _environment() -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "platform": platform.platform()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}")
    return info


def _pytest_summary(log: Path) -> dict:
    text = log.read_text(encoding="utf-8", errors="replace")
    counts = {key: int(value) for value, key in re.findall(r"(\d+) (passed|failed|skipped|error|errors|xfailed)", text)}
    failures = re.findall(r"^FAILED (\S+)", text, flags=re.M)
    return {"counts": counts, "failures": failures}


def _time_ms(record: dict) -> float:
    return record["fwd_ms_median"] + (record["bwd_ms_median"] or 0.0)


def bench_targets(records: list[dict]) -> list[dict]:
    """The fused-kernel issue's targets, judged on ``maskattn bench`` records (H100, bf16, d_model 512, 8 heads,
    batch 8, forward + backward): MTSA ≤ 1.2× SDPA multi-head attention at n ≥ 2048 and ≤ 1.5× below; DMAN ≤ 1.3×
    at every n; CSAN 1D and SMAN ≥ 5×, CSAN 2D ≥ 2× faster than SDPA's causal flash at the longest length (16384).
    One row per (target, n) with the measured ratio and whether it holds (None: not measured)."""
    ok = {(r["label"], r["n"]): r for r in records if r["status"] == "ok"}
    lengths = sorted({n for _, n in ok})
    rows = []

    def ratio(a, b, n):
        if (a, n) in ok and (b, n) in ok:
            return _time_ms(ok[(a, n)]) / _time_ms(ok[(b, n)])
        return None

    for n in lengths:
        for name, limit in (("mtsa", 1.2 if n >= 2048 else 1.5), ("dman", 1.3)):
            value = ratio(TARGET_LABELS[name], "mha/sdpa", n)
            rows.append({"target": f"{TARGET_LABELS[name]} time ≤ {limit}× mha/sdpa", "n": n, "ratio": value,
                         "met": None if value is None else value <= limit})
    longest = lengths[-1] if lengths else None
    if longest is not None:
        for name, factor in (("csan1d", 5), ("sman", 5), ("csan2d", 2)):
            value = ratio("sdpa_causal", TARGET_LABELS[name], longest)
            rows.append({"target": f"{TARGET_LABELS[name]} ≥ {factor}× faster than SDPA causal", "n": longest,
                         "ratio": value, "met": None if value is None else value >= factor})
    return rows


def memory_growth(records: list[dict]) -> list[dict]:
    """Per fused path (the Triton and banded kernels): peak memory's growth per doubling of n between the two
    longest measured lengths (``2 ** slope`` of the log-log line; linear memory gives 2), against
    :data:`MEMORY_PER_DOUBLING`."""
    rows = []
    labels = sorted({r["label"] for r in records if r["kind"] == "mechanism"
                     and (r["label"] in TARGET_LABELS.values() or r["backend"] in ("banded", "triton"))})
    for label in labels:
        points = sorted({r["n"]: r["peak_mib"] for r in records if r["label"] == label and r["status"] == "ok"}.items())
        if len(points) >= 2 and points[-2][1] > 0:
            (n0, m0), (n1, m1) = points[-2], points[-1]
            slope = math.log(m1 / m0) / math.log(n1 / n0)
            rows.append({"path": label, "from_n": n0, "to_n": n1, "slope": slope, "per_doubling": 2 ** slope,
                         "linear": 2 ** slope <= MEMORY_PER_DOUBLING})
    return rows


def _tflops(out: Path, timeout: float, smoke: bool) -> dict:
    """The kernel TFLOP/s part: ``python -m maskattn.bench.kernels OUT/tflops`` with its own budget ``timeout`` −
    :data:`TFLOPS_STARTUP_S` (stopped at ``timeout``: the rows written by then are kept), then what it left
    (:func:`maskattn.bench.kernels.load`, compared with the checkout's ``docs/gpu/offline-perf.json``)."""
    folder = out / "tflops"
    command = [sys.executable, "-m", "maskattn.bench.kernels", str(folder.resolve()),
               "--budget", f"{max(timeout - TFLOPS_STARTUP_S, 1):.0f}",
               "--anchor", str(ROOT / "benchmarks" / "anchor_attention.py"), *(["--smoke"] if smoke else [])]
    code, seconds = _run(command, out / "tflops.log", timeout, cwd=ROOT,
                         env={"TRITON_INTERPRET": "1"} if smoke else None)
    return {"exit_code": code, "wall_s": seconds,
            **kernel_bench.load(folder, ROOT / "docs" / "gpu" / "offline-perf.json")}


def _training(preset: str, data: Path, out: Path, steps: int, smoke: bool, timeout: float) -> dict:
    run = out / "train" / preset
    flags = [f"train.max_steps={steps}", "train.compile=true", f"train.eval_every={steps}", "train.metric=loss",
             "train.test_beam=1", "train.progress=false", "train.keep_last=false"]
    if smoke:
        flags += ["train.device=cpu", "train.compile=false", "model.encoder_layers=1", "model.decoder_layers=1",
                  "model.d_model=32", "model.num_heads=4", "data.subword_vocab=1000", "data.max_tokens=96",
                  "data.max_len=24", "data.test=null", "train.num_threads=1"]
    command = [sys.executable, "-m", "maskattn.cli", "train", "--preset", preset, "--data", str(data), "--out",
               str(run), "--overwrite", *sum((["--set", f] for f in flags), [])]
    code, seconds = _run(command, out / f"train-{preset}.log", timeout)
    result = {"preset": preset, "exit_code": code, "wall_s": round(seconds, 1)}
    metrics = run / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        train = [r for r in rows if r.get("split") == "train"]
        if train:
            rates = [r["tokens_per_s"] for r in train if r.get("tokens_per_s")]
            result.update(final_loss=train[-1]["loss"], steps=train[-1]["step"],
                          tokens_per_s=rates[-1] if rates else None,
                          first_step_s=train[0].get("elapsed_s"), elapsed_s=train[-1].get("elapsed_s"))
    return result


def _report(summary: dict) -> str:
    env = summary["environment"]
    lines = ["# GPU acceptance run", "",
             f"Device: {env.get('device', 'none')} ({env.get('memory_gib', '?')} GiB, capability "
             f"{env.get('capability', '?')}); torch {env['torch']}, CUDA {env['cuda']}; {summary['started']}.",
             f"Command: `{summary['command']}`", ""]
    for key, title in (("kernels", "Triton kernel tests (tests/test_triton_*.py)"), ("tests", "pytest -m gpu")):
        tests = summary.get(key)
        if tests:
            stopped = " (stopped by the budget)" if tests["exit_code"] == 124 else ""
            lines += [f"## {title}", "", f"exit code {tests['exit_code']}{stopped}, {tests['wall_s']:.0f} s: "
                      + ", ".join(f"{v} {k}" for k, v in tests["counts"].items()), ""]
            lines += [f"- FAILED {name}" for name in tests["failures"]] + ([""] if tests["failures"] else [])
    tflops = summary.get("tflops")
    if tflops:
        stopped = " (stopped by the budget)" if tflops["exit_code"] == 124 else ""
        lines += [kernel_bench.render(tflops).rstrip("\n"), "",
                  f"exit code {tflops['exit_code']}{stopped}, {tflops['wall_s']:.0f} s; rows in tflops/rows.jsonl, "
                  "log tflops.log.", ""]
    bench = summary.get("bench")
    if bench:
        lines += ["## maskattn bench --suite gpu", "", f"exit code {bench['exit_code']}, {bench['wall_s']:.0f} s; "
                  "records in bench/bench.json, plot bench/bench.png.", "",
                  "| target | n | ratio | met |", "|---|---:|---:|---|"]
        for row in bench["targets"]:
            value = "–" if row["ratio"] is None else f"{row['ratio']:.2f}"
            met = "not measured" if row["met"] is None else ("yes" if row["met"] else "**no**")
            lines.append(f"| {row['target']} | {row['n']} | {value} | {met} |")
        lines += ["", f"| path | peak memory per doubling of n (from → to) | ≤ {MEMORY_PER_DOUBLING}× |",
                  "|---|---|---|"]
        for row in bench["memory"]:
            lines.append(f"| {row['path']} | {row['per_doubling']:.2f}× ({row['from_n']} → {row['to_n']}) | "
                         f"{'yes' if row['linear'] else '**no**'} |")
        lines.append("")
    if summary.get("training"):
        lines += ["## Training, `train.compile: true`", "",
                  "| preset | exit | steps | final loss | tokens/s | first step s | total s |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for row in summary["training"]:
            lines.append(f"| {row['preset']} | {row['exit_code']} | {row.get('steps', '–')} | "
                         f"{row.get('final_loss', float('nan')):.3f} | {row.get('tokens_per_s') or '–'} | "
                         f"{row.get('first_step_s', '–')} | {row.get('elapsed_s', '–')} |")
        lines.append("")
    for note in summary["notes"]:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for the logs, bench outputs, gpu.md and gpu.json")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"),
                        help="the Multi30k folder for the training part (skipped, with a note, when absent)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per -gpu preset")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: kernels, tests, tflops, bench, "
                                                   "training")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help=f"seconds for the whole run (default {BUDGET_S}); each part gets what is left")
    parser.add_argument("--smoke", action="store_true", help="run every part on the CPU at toy sizes (tests this "
                                                             "command; the figures mean nothing)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False): the GPU acceptance run needs one "
              "GPU; run it on a CUDA machine (or use --smoke to test the command on the CPU)", file=sys.stderr)
        return 2
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    unknown = skip - {"kernels", "tests", "tflops", "bench", "training"}
    if unknown:
        parser.error(f"unknown parts in --skip: {sorted(unknown)}; expected kernels, tests, tflops, bench, training")
    if args.budget <= MIN_PART_S:
        parser.error(f"--budget must exceed {MIN_PART_S} seconds, got {args.budget:g}")
    deadline = time.perf_counter() + args.budget

    def left(cap: float = float("inf"), part: str = "") -> float | None:
        """Seconds part ``part`` may take: its ``cap`` (at least MIN_PART_S) within what is left of the budget;
        None, with a note, when under MIN_PART_S are left."""
        remaining = deadline - time.perf_counter()
        if remaining < MIN_PART_S:
            summary["notes"].append(f"{part} not run: {remaining:.0f} s of the {args.budget:.0f} s budget left")
            return None
        return min(max(cap, MIN_PART_S), remaining)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"command": " ".join(["scripts/gpu_check.sh", *(argv if argv is not None else sys.argv[1:])]),
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "environment": _environment(), "notes": []}
    if args.smoke:
        summary["notes"].append("--smoke: toy sizes on the CPU; these figures test the command, they measure nothing")
    # failures are written to failures.log as they happen (tests/conftest.py): kept if the time limit stops pytest
    failure_log = {"MASKATTN_FAILURE_LOG": str((args.out / "failures.log").resolve())}
    pytest = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
    if "kernels" not in skip and (timeout := left(KERNEL_TESTS_SHARE * args.budget, "kernel tests")):
        files = SMOKE_KERNEL_TESTS if args.smoke else kernel_test_files()
        code, seconds = _run([*pytest, "-m", "not slow", *files], args.out / "kernels.log", timeout, cwd=ROOT,
                             env=failure_log)
        summary["kernels"] = {"exit_code": code, "wall_s": seconds, **_pytest_summary(args.out / "kernels.log")}
    if "tests" not in skip and (timeout := left(GPU_TESTS_SHARE * args.budget, "pytest -m gpu")):
        code, seconds = _run([*pytest, "-m", "gpu"], args.out / "tests.log", timeout, cwd=ROOT, env=failure_log)
        summary["tests"] = {"exit_code": code, "wall_s": seconds, **_pytest_summary(args.out / "tests.log")}
    if "tflops" not in skip and (timeout := left(TFLOPS_S, "kernel TFLOP/s")):
        summary["tflops"] = _tflops(args.out, timeout, args.smoke)
    if "bench" not in skip and (timeout := left(900, "maskattn bench")):
        bench_args = (["--suite", "quick", "--mechanisms", "mha,mtsa,csan1d,sdpa_causal", "--lengths", "16,32",
                       "--device", "cpu"] if args.smoke else ["--suite", "gpu"])
        code, seconds = _run([sys.executable, "-m", "maskattn.cli", "bench", *bench_args, "--out",
                              str(args.out / "bench")], args.out / "bench.log", timeout)
        records = []
        if (args.out / "bench" / "bench.json").exists():
            records = json.loads((args.out / "bench" / "bench.json").read_text())["records"]
        summary["bench"] = {"exit_code": code, "wall_s": seconds, "targets": bench_targets(records),
                            "memory": memory_growth(records)}
    if "training" not in skip:
        if args.data.is_dir():
            summary["training"] = []
            for preset in PRESETS:
                if timeout := left(480, f"training {preset}"):
                    summary["training"].append(_training(preset, args.data, args.out, args.steps, args.smoke,
                                                         timeout))
        else:
            summary["notes"].append(f"training skipped: {args.data} is not a folder (pass --data MULTI30K)")
    (args.out / "gpu.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (args.out / "gpu.md").write_text(_report(summary), encoding="utf-8")
    print(f"wrote {args.out / 'gpu.md'} and {args.out / 'gpu.json'}")
    failed = [part for part in ("kernels", "tests", "bench") if summary.get(part, {}).get("exit_code", 0) != 0]
    failed += ["tflops"] if summary.get("tflops", {}).get("exit_code", 0) not in (0, 124) else []
    failed += [row["preset"] for row in summary.get("training", []) if row["exit_code"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
