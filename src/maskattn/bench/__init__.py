"""``maskattn bench``: time and memory of every attention mechanism against sequence length.

For every registered mechanism × each of its backends that can train on the device (plus the baselines
``torch_mha``, ``bilstm``, ``multi_cnn`` and ``mtsa_algorithm1``; the naive n×n×d form of MTSA is
``mtsa`` on its ``reference`` backend), on the CPU and on CUDA when present, and every sequence length:

* forward time and backward time, measured separately: median, min and max over the repeats;
* peak memory of one forward + backward (:func:`maskattn.bench.peak_memory_bytes`);
* analytic FLOPs of a training step (:mod:`maskattn.bench.costs`), the achieved GFLOP/s, the measured
  GFLOP/s of a plain ``bmm`` of the attention-score shape, and their ratio;
* points whose estimated memory exceeds the budget are skipped (status ``skipped``), as are points
  that run out of memory.

Outputs: ``bench.csv``, ``bench.json`` (fields documented in :data:`FIELDS`) and ``bench.png``::

    from maskattn.bench import BenchSettings, run_benchmark, write_outputs
    result = run_benchmark(BenchSettings.quick(mechanisms=("mtsa", "torch_mha")))
    write_outputs(result, "bench-out")

Beside it, :mod:`maskattn.bench.finetune` (``python -m maskattn.bench.finetune``, needs the ``hf`` extra): the
training-step time of a pretrained encoder with and without maskattn conversions (docs/hf.md).
"""

from .baselines import BASELINES, Algorithm1, TorchMHA, list_baselines
from .costs import Point, estimate_bytes, family_of, forward_flops, step_flops
from .measure import count_flops, machine_info, matmul_gflops_per_s, measure_point, peak_memory_bytes, time_call
from .report import output_folder, plot, render_tables, write_csv, write_json, write_outputs
from .runner import FIELDS, MEMORY_FRACTION, BenchResult, run_benchmark
from .settings import (
    SUITES,
    QUICK,
    BenchSettings,
    Candidate,
    parse_lengths,
    parse_names,
    select_candidates,
    valid_mechanisms,
)

__all__ = [
    "BenchSettings", "BenchResult", "Candidate", "FIELDS", "QUICK", "SUITES", "MEMORY_FRACTION", "run_benchmark",
    "parse_lengths", "parse_names", "valid_mechanisms", "select_candidates",
    "BASELINES", "Algorithm1", "TorchMHA", "list_baselines",
    "Point", "family_of", "forward_flops", "step_flops", "estimate_bytes",
    "measure_point", "matmul_gflops_per_s", "time_call", "peak_memory_bytes", "count_flops", "machine_info",
    "write_outputs", "write_csv", "write_json", "output_folder", "plot", "render_tables",
]


def __getattr__(name: str):
    if name == "PRESETS":  # the named settings before they were called suites (a preset is a run configuration)
        from ..errors import warn_renamed

        warn_renamed("maskattn.bench.PRESETS", "maskattn.bench.SUITES")
        return SUITES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
