"""Whether one grid cell beats another (``maskattn grid compare``): the difference of the cells' mean test metric,
its 95 % interval, the test statistic, p and "established at 5 %", with the test chosen from how the runs of the
cells are replicated. **One rule** throughout: a difference is established when p < 5 %, and every test's p and
interval agree — p < 5 % exactly when the 95 % interval excludes 0.

* **Seeds** (independent runs on fixed splits): Welch's unequal-variance t test over the runs (what
  ``scipy.stats.ttest_ind(equal_var=False)`` computes, from exact means and variances), with the number of seed
  pairs (same ``train.seed``) where each cell is ahead; cells that share no seed are said to.
* **Cross-validation folds** (``data.cv_folds``; the runs of one fold share its test items, and the training sets
  of different folds overlap): the paired t test over the per-fold differences with the variance corrected as
  Nadeau & Bengio (2003) propose, ``(1/J + n_test/n_train) · s²`` instead of ``s²/J`` (J pairs, ``s²`` the sample
  variance of the differences, ``J − 1`` degrees of freedom): the plain paired t ignores the overlap and overstates
  significance. ``n_test/n_train`` comes from the records: a fold tests ``1/k`` of the data and trains on the rest
  less the held-out dev share, ``(1/k) / ((1 − 1/k)(1 − data.dev_fraction))``. Both cells must have the same folds
  (and seeds): unpaired folds are refused.
* **One test set** (seeds, not folds): Welch's t over the seeds as above, and for every seed pair a paired
  bootstrap over the test items of what the two runs were scored on (:mod:`maskattn.metrics.test_outputs`):
  generation metrics (ROUGE, BLEU, chrF) from their hypotheses (``test.hyp.txt`` in each run folder, scored
  against the references of the runs' test split), accuracy and tagging F1 from their predictions
  (``test.pred.jsonl``, whose gold labels must be the runs' test split's, item by item). An
  item's statistics: whether it is right (a sentence's accuracy), its right and all tokens (a tagger's accuracy),
  its true, predicted and gold chunks (a tagger's micro F1). ``samples`` resamples of the item indices,
  the same for both systems (drawn as sacreBLEU's ``paired_bs`` draws them, ``numpy.random.default_rng(seed)``,
  in chunks within the memory budget), the difference recomputed on each. The interval is the percentile
  interval of the resampled differences Δ*, and p its two-sided bootstrap p, ``2 · min(#{Δ* ≤ 0}, #{Δ* ≥ 0}) /
  samples``: established exactly when the interval excludes 0 (:func:`paired_bootstrap`). (sacreBLEU's own p,
  ``#{|Δ*| − mean|Δ*| > |Δ|}``, is not a two-sided test of "no difference": it said "established" beside
  intervals holding 0.) BLEU and chrF are recomputed from sacreBLEU's per-sentence sufficient statistics, ROUGE
  as the mean of ``rouge-score``'s per-item F1 (:func:`maskattn.metrics.rouge_scores`'s tokenisation). The
  bootstrap says whether the two *trained models* differ beyond test-set sampling; Welch's t whether the
  difference holds across training seeds. Runs without those files get the Welch row and a note.

**Zero variance** is said in words, never as ``t = nan`` or ``inf``: cells whose runs all scored the same, folds
that all differ by the same, two runs that score every item alike. With no difference that is p 1; with a
difference the test is undefined (no spread to weigh it against): p, statistic and interval "–", established
neither way (``null`` in JSON).

A cell is named as ``maskattn grid table`` names it (``mtsa``, ``architecture=man``), qualified by its grid folder
when several grids are given or the names repeat: ``GRID:CELL`` (``benchmarks/results/table5_vectors/trec:mtsa``,
or any trailing part of a given grid's path, ``table5_vectors/trec:mtsa``). Cells of different presets or data,
a metric no run has (or the bound of an interval, ``rouge1_low``), fewer than 2 runs in a cell, unpaired folds,
``--samples`` outside 40–100,000 and a negative ``--seed`` raise :class:`~maskattn.errors.ArgumentError`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, DataError
from ..metrics.labels import bio_spans
from ..metrics.test_outputs import Label, Prediction
from ..sections import shown
from .records import (HYPOTHESES, PREDICTIONS, RunRecord, check_tested, collect_runs, read_test_hypotheses,
                      read_test_predictions, tested_metrics)
from .table import PERCENT_METRICS, shown_value, table_rows

__all__ = ["Cell", "Result", "PairReport", "resolve_cells", "compare", "welch", "nadeau_bengio", "paired_bootstrap",
           "cv_ratio", "markdown_report", "json_report", "item_statistics", "label_statistics", "run_references",
           "run_labels", "p_text", "check_bootstrap_options", "bootstrap_memory", "GENERATION_METRICS", "HYPOTHESES",
           "PREDICTIONS", "LEVEL", "MIN_SAMPLES", "MAX_SAMPLES"]

#: metrics scored on generated text (one test set), compared per seed pair by a paired bootstrap
GENERATION_METRICS = ("rouge", "rouge1", "rouge2", "rougeL", "bleu", "chrf")
#: the significance level of "established"
LEVEL = 0.05


@dataclass
class Cell:
    """A row of ``grid table`` in one grid folder: its name there, the folder, and its runs."""

    name: str
    grid: Path
    runs: list[RunRecord]

    @property
    def label(self) -> str:
        return self.name

    def replicate(self, record: RunRecord) -> tuple:
        """The run's replicate values: ``(fold, seed)`` under cross-validation, else ``(seed,)``."""
        if self.folds:
            return (record.config.get("data.fold"), record.config.get("train.seed"))
        return (record.config.get("train.seed"),)

    @property
    def folds(self) -> bool:
        """Are the runs cross-validation folds (``data.cv_folds`` set)?"""
        return bool(self.runs[0].config.get("data.cv_folds"))


@dataclass
class Result:
    """One test of A − B: its name, the difference of means (A − B), its 95 % interval, the statistic, degrees of
    freedom (t tests), p, whether established at 5 %, the number of pairs or runs, and notes."""

    test: str
    difference: float
    low: float
    high: float
    statistic: float
    p: float
    df: float | None = None
    n: str = ""
    notes: list[str] = field(default_factory=list)
    #: a bootstrap's smallest p above 0 (2 / resamples): a p of 0 is below it
    p_resolution: float | None = None

    @property
    def established(self) -> bool | None:
        """p < :data:`LEVEL` — which is the 95 % interval excluding 0; ``None`` when the test is undefined (no
        spread to weigh a difference against: p is NaN)."""
        return None if math.isnan(self.p) else bool(self.p < LEVEL)


@dataclass
class PairReport:
    """Every test of cell ``a`` against cell ``b`` on ``metric``, and the cells' means and standard deviations."""

    a: str
    b: str
    metric: str
    replication: str
    mean_a: float
    std_a: float
    mean_b: float
    std_b: float
    results: list[Result]
    ahead: tuple[int, int, int] | None = None  # seed pairs where A leads, B leads, tie
    notes: list[str] = field(default_factory=list)


# --- the tests ----------------------------------------------------------------------------------------------------

def _scipy_stats():
    from scipy import stats  # a dependency; imported here so that the other grid commands start without it

    return stats


def _without_spread(test: str, difference: float, n: str, what: str) -> Result:
    """A test whose variance is 0 (module docstring, "zero variance"): ``what`` says where it is 0. No difference
    is p 1 and the interval [0, 0]; a difference is undefined — p, statistic and interval NaN, neither
    established nor not."""
    if difference == 0:
        return Result(test, 0.0, 0.0, 0.0, math.nan, 1.0, None, n,
                      [f"{test}: {what} and the cells do not differ: no difference, no spread (p 1)"])
    return Result(test, difference, math.nan, math.nan, math.nan, math.nan, None, n,
                  [f"{test} is undefined: {what}, so the difference ({difference:+.4g}) has no spread to be weighed "
                   "against; no test says whether it holds beyond these runs"])


def _t_result(test: str, difference: float, variance: float, df: float, n: str) -> Result:
    """The t test of ``difference`` with squared standard error ``variance`` and ``df`` degrees of freedom: t,
    its two-sided p and the 95 % interval (which excludes 0 exactly when p < 5 %)."""
    stats = _scipy_stats()
    error = math.sqrt(variance)
    statistic = difference / error
    half = float(stats.t.ppf(1 - LEVEL / 2, df)) * error
    return Result(test, difference, difference - half, difference + half, statistic,
                  float(2 * stats.t.sf(abs(statistic), df)), float(df), n)


def welch(a: Sequence[float], b: Sequence[float]) -> Result:
    """Welch's t test of mean(a) − mean(b) (independent runs, unequal variances), with its 95 % interval — what
    ``scipy.stats.ttest_ind(equal_var=False)`` computes, from exact means and variances (:mod:`statistics`: runs
    nearly alike lose no precision, and nothing warns). Neither cell varying is said in a note
    (:func:`_without_spread`)."""
    difference = statistics.mean(a) - statistics.mean(b)
    share_a, share_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    n = f"{len(a)} vs {len(b)} runs"
    if share_a + share_b == 0:
        return _without_spread("Welch t", difference, n, f"every run of each cell scored the same ({a[0]:.4g} and "
                               f"{b[0]:.4g})")
    df = (share_a + share_b) ** 2 / (share_a ** 2 / (len(a) - 1) + share_b ** 2 / (len(b) - 1))  # Welch–Satterthwaite
    return _t_result("Welch t", difference, share_a + share_b, df, n)


def nadeau_bengio(differences: Sequence[float], ratio: float) -> Result:
    """The paired t test of the mean of per-fold ``differences`` (A − B) with Nadeau & Bengio's corrected variance
    ``(1/J + ratio) · s²`` (``ratio`` = n_test / n_train), ``J − 1`` degrees of freedom. Every fold differing by
    the same is said in a note (:func:`_without_spread`)."""
    j = len(differences)
    mean = statistics.mean(differences)
    variance = (1 / j + ratio) * statistics.variance(differences)
    test, n = "paired t, Nadeau–Bengio corrected", f"{j} paired folds"
    result = (_without_spread(test, mean, n, f"every fold's difference is the same ({differences[0]:+.4g})")
              if variance == 0 else _t_result(test, mean, variance, j - 1, n))
    result.df = float(j - 1)
    result.notes.insert(0, f"n_test/n_train = {ratio:.4f}")
    return result


#: the fewest and the most resamples of a paired bootstrap (``--samples``): with fewer than 2 / LEVEL no p under
#: LEVEL can be told from 0 (the smallest p above 0 is 2 / samples); more change p past its third digit and take
#: minutes
MIN_SAMPLES = 40
MAX_SAMPLES = 100_000
#: the working memory of one chunk of resamples (their indices and the rows they gather), within the budget
_CHUNK_BYTES = 64 * 2**20


def check_bootstrap_options(samples: int, seed: int) -> None:
    """Refuse (:class:`ArgumentError`, one line) ``--samples`` outside [:data:`MIN_SAMPLES`, :data:`MAX_SAMPLES`]
    and a ``--seed`` that is not an int >= 0."""
    if isinstance(samples, bool) or not isinstance(samples, int) or not MIN_SAMPLES <= samples <= MAX_SAMPLES:
        raise ArgumentError(f"--samples must be an int from {MIN_SAMPLES} to {MAX_SAMPLES:,}, got {samples!r} (fewer "
                            f"than {MIN_SAMPLES} cannot tell a p under {LEVEL:g}; the default 1,000 gives p to 0.002)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ArgumentError(f"--seed must be an int >= 0 (the bootstrap's random seed), got {seed!r}")


def bootstrap_memory(items: int, columns: int, samples: int) -> tuple[int, int]:
    """What :func:`paired_bootstrap` holds over ``items`` test items of ``columns`` statistics each: the bytes
    held throughout (the two systems' statistics, the resampled differences) and per resample of a chunk (its
    indices and the rows it gathers from both systems)."""
    return 2 * items * columns * 8 + samples * 8, items * 8 * (1 + 2 * columns)


def paired_bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, score: Callable[[np.ndarray], float], *,
                     samples: int = 1000, seed: int = 12345) -> Result:
    """Paired bootstrap over test items (module docstring). ``stats_a`` / ``stats_b``: per-item statistics, one
    row per item (the same items, in order); ``score``: a corpus score from the column sums of the rows.

    The resampled item indices are sacreBLEU's (``default_rng(seed).choice(n, (samples, n))``), drawn in chunks
    that give the same numbers, each chunk within the memory budget (:func:`maskattn.device.memory_budget`): the
    memory held is the items' statistics, the ``samples`` differences and one chunk, never ``samples × n``
    indices; what cannot fit even one resample at a time is refused with the estimate (``MemoryLimitError``).

    One rule decides: the difference is established when the 95 % percentile interval of the resampled
    differences Δ* excludes 0 — the k-th smallest and k-th largest Δ*, k = ⌈samples · 2.5 %⌉ — and p is the
    two-sided bootstrap p of that interval, ``2 · min(#{Δ* ≤ 0}, #{Δ* ≥ 0}) / samples`` (at most 1), so p < 5 %
    exactly when the interval excludes 0. A p of 0 (no resample on the other side of 0) is below
    ``2 / samples``, kept as ``p_resolution``."""
    from ..device import check_memory, memory_budget

    a, b = np.asarray(stats_a, dtype=float), np.asarray(stats_b, dtype=float)
    if a.shape != b.shape or not len(a):
        raise ArgumentError(f"paired bootstrap: the two systems have {len(a)} and {len(b)} test items; they must be "
                            "the same items (and at least one)")
    check_bootstrap_options(samples, seed)
    n = len(a)
    a, b = a.reshape(n, -1), b.reshape(n, -1)
    held, per_resample = bootstrap_memory(n, a.shape[1], samples)
    check_memory(held + per_resample, what=f"the paired bootstrap over {n:,} test items ({samples:,} resamples)",
                 advice="compare fewer test items")
    budget = memory_budget()
    room = _CHUNK_BYTES if budget is None else max(per_resample, min(_CHUNK_BYTES, budget - held))
    chunk = max(1, min(samples, room // per_resample))
    rng = np.random.default_rng(seed)
    deltas = np.empty(samples)
    for start in range(0, samples, chunk):
        rows = min(chunk, samples - start)
        indices = rng.choice(n, size=(rows, n), replace=True)  # row by row what one (samples, n) draw gives
        sums_a, sums_b = a[indices].sum(axis=1), b[indices].sum(axis=1)
        deltas[start:start + rows] = [score(x) - score(y) for x, y in zip(sums_a, sums_b)]
        del indices, sums_a, sums_b
    observed = score(a.sum(0)) - score(b.sum(0))
    k = math.ceil(samples * LEVEL / 2 - 1e-9)
    ordered = np.sort(deltas)
    below, above = int(np.sum(deltas <= 0)), int(np.sum(deltas >= 0))
    result = Result("paired bootstrap", float(observed), float(ordered[k - 1]), float(ordered[samples - k]),
                    float(observed), min(1.0, 2 * min(below, above) / samples), None,
                    f"{n} test items, {samples} resamples", p_resolution=2 / samples)
    if not np.any(deltas):
        same = np.array_equal(a, b)
        result.notes.append("paired bootstrap: " + ("the two runs score every test item the same" if same else
                            "every resample scores the two runs the same") + ": no difference, no spread (p 1)")
    return result


def cv_ratio(record: RunRecord) -> float:
    """n_test / n_train of a cross-validation fold run (module docstring), from its configuration."""
    k = int(record.config.get("data.cv_folds") or 0)
    dev = float(record.config.get("data.dev_fraction") or 0.0)
    if k < 2:
        raise ArgumentError(f"{record.folder}: data.cv_folds {k} is not a cross-validation run")
    return (1 / k) / ((1 - 1 / k) * (1 - dev))


# --- the cells ----------------------------------------------------------------------------------------------------

def _split_spec(item: str, grids: list[Path]) -> tuple[Path | None, str]:
    """``GRID:CELL`` → (the grid folder, CELL); a bare name → (None, name)."""
    for position in [i for i, char in enumerate(item) if char == ":"]:
        prefix, name = item[:position], item[position + 1:]
        if not prefix or not name:
            continue
        if Path(prefix).is_dir():
            return Path(prefix), name
        parts = Path(prefix).parts
        matches = [g for g in grids if g.resolve().parts[-len(parts):] == parts]
        if len(matches) == 1:
            return matches[0], name
        if len(matches) > 1:
            raise ArgumentError(f"cell {item!r}: {prefix!r} names {len(matches)} of the grids given "
                                f"({', '.join(map(str, matches))}); give more of the path")
        raise ArgumentError(f"cell {item!r}: {prefix!r} is neither a folder nor the end of a grid folder given "
                            f"({', '.join(map(str, grids)) or 'none given'})")
    return None, item


def resolve_cells(items: Sequence[str], grids: Sequence[str | Path] = ()) -> list[Cell]:
    """The cells ``items`` name (``CELL`` or ``GRID:CELL``; module docstring) in ``grids`` (folders; a ``GRID:`` that
    is a folder adds it). Refuses unknown or ambiguous names, cells with fewer than 2 finished runs, and cells of
    different presets or data."""
    folders = [Path(g) for g in grids]
    specs = []
    for item in items:
        grid, name = _split_spec(item, folders)
        if grid is not None and all(grid.resolve() != g.resolve() for g in folders):
            folders.append(grid)
        specs.append((item, grid, name))
    if not folders:
        raise ArgumentError("no grid folder given: name one (maskattn grid compare GRID --metric M A B) or qualify "
                        "the cells with theirs (GRID:CELL)")
    if len(specs) < 2:
        raise ArgumentError(f"compare needs at least two cells, got {len(specs)}: {', '.join(items) or 'none'}")
    rows: dict[Path, dict[str, list[RunRecord]]] = {}
    for folder in folders:
        records, _ = collect_runs([folder])
        _, table = table_rows(records)
        rows[folder] = {row.label: row.runs for row in table}
    cells = []
    for item, grid, name in specs:
        where = [f for f in folders if grid is None or f.resolve() == grid.resolve()]
        found = [(f, rows[f][name]) for f in where if name in rows[f]]
        if not found:
            known = "; ".join(f"{f}: {', '.join(rows[f])}" for f in where)
            raise ArgumentError(f"cell {item!r} is not a cell of {'the grids' if grid is None else grid} (cells, as "
                                f"grid table names them: {known})")
        if len(found) > 1:
            raise ArgumentError(f"cell {name!r} is in {len(found)} grids ({', '.join(str(g) for g, _ in found)}); "
                                f"qualify it: GRID:{name}")
        folder, runs = found[0]
        if len(runs) < 2:
            raise ArgumentError(f"cell {item!r} has {len(runs)} finished run; a comparison needs at least 2 per cell")
        label = name if len(folders) == 1 else f"{_short(folder, folders)}:{name}"
        cells.append(Cell(label, folder, runs))
    first = cells[0]
    for cell in cells[1:]:
        if cell.runs[0].identity != first.runs[0].identity:
            differ = [k for k in first.runs[0].identity if first.runs[0].identity[k] != cell.runs[0].identity[k]]
            raise ArgumentError(f"cells {first.label} and {cell.label} are of different presets or data (they differ "
                                f"in {', '.join(differ)}: {', '.join(str(first.runs[0].identity[k]) for k in differ)} "
                                f"vs {', '.join(str(cell.runs[0].identity[k]) for k in differ)}); compare cells of one "
                                "task")
    return cells


def _short(folder: Path, folders: list[Path]) -> str:
    """The shortest trailing part of ``folder``'s path that tells it from the other grid folders."""
    parts = folder.resolve().parts
    others = [f.resolve().parts for f in folders if f.resolve() != folder.resolve()]
    for length in range(1, len(parts) + 1):
        if all(o[-length:] != parts[-length:] for o in others):
            return "/".join(parts[-length:])
    return str(folder)


# --- the comparison -----------------------------------------------------------------------------------------------

def _value(record: RunRecord, metric: str) -> float:
    return shown_value(metric, record.summary["test"][metric])


def _check_metric(cells: list[Cell], metric: str) -> None:
    """Refuse a ``--metric`` that is no test metric of the cells' runs (or an interval's bound:
    :func:`~maskattn.grid.records.check_tested`), or that some of their runs were not tested on."""
    runs = [r for cell in cells for r in cell.runs]
    check_tested([metric], runs)
    missing = [f"{cell.label} ({sum(metric not in r.summary.get('test', {}) for r in cell.runs)} runs)"
               for cell in cells if any(metric not in r.summary.get("test", {}) for r in cell.runs)]
    if missing:
        raise ArgumentError(f"--metric {metric}: no test score of it in {', '.join(missing)}; the runs' test metrics "
                            f"are {', '.join(tested_metrics(runs))}")


def compare(cells: list[Cell], metric: str, *, samples: int = 1000, seed: int = 12345,
            references: Callable[[RunRecord], list[str]] | None = None,
            labels: Callable[[RunRecord], list[Label]] | None = None) -> list[PairReport]:
    """Every pair of ``cells`` (in order: 1–2, 1–3, …, 2–3, …) compared on the test ``metric`` (module docstring).
    ``references(record)``: the test references of a seq2seq run; ``labels(record)``: the gold labels of a
    classifier run's test split (default: both read from the run's data folder)."""
    check_bootstrap_options(samples, seed)
    _check_metric(cells, metric)
    references, labels = _per_data(references or run_references), _per_data(labels or run_labels)
    reports = []
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            reports.append(_compare_pair(a, b, metric, samples, seed, references, labels))
    return reports


def _per_data(read: Callable[[RunRecord], list]) -> Callable[[RunRecord], list]:
    """``read`` (a run's test references or labels) read once per data configuration."""
    cache: dict[str, list] = {}

    def cached(record: RunRecord) -> list:
        key = json.dumps({k: v for k, v in record.config.items() if k.startswith("data.")}, sort_keys=True,
                         default=str)
        if key not in cache:
            cache[key] = read(record)
        return cache[key]

    return cached


def _compare_pair(a: Cell, b: Cell, metric: str, samples: int, seed: int,
                  references: Callable[[RunRecord], list[str]], labels: Callable[[RunRecord], list[Label]]
                  ) -> PairReport:
    values_a = {a.replicate(r): _value(r, metric) for r in a.runs}
    values_b = {b.replicate(r): _value(r, metric) for r in b.runs}
    xs, ys = list(values_a.values()), list(values_b.values())
    report = PairReport(a.label, b.label, metric, "folds" if a.folds else "seeds", statistics.mean(xs),
                        statistics.stdev(xs), statistics.mean(ys), statistics.stdev(ys), [])
    if a.folds:
        if set(values_a) != set(values_b):
            only_a = sorted(set(values_a) - set(values_b), key=str)
            only_b = sorted(set(values_b) - set(values_a), key=str)
            raise ArgumentError(f"unpaired folds: {a.label} and {b.label} must have the same (fold, seed) runs; only "
                                f"{a.label} has {only_a or 'none'}, only {b.label} has {only_b or 'none'}")
        keys = sorted(values_a, key=lambda k: tuple(-1 if v is None else v for v in k))
        ratios = {round(cv_ratio(r), 6) for cell in (a, b) for r in cell.runs}
        if len(ratios) > 1:
            raise ArgumentError(f"the folds of {a.label} and {b.label} hold out different shares "
                                f"(n_test/n_train {sorted(ratios)}); they are not paired")
        result = nadeau_bengio([values_a[k] - values_b[k] for k in keys], ratios.pop())
        r = a.runs[0]
        result.notes[0] += (f" ({r.config.get('data.cv_folds')} folds: 1/{r.config.get('data.cv_folds')} tested, the "
                            f"rest less dev_fraction {r.config.get('data.dev_fraction')} trained on)")
        report.results.append(result)
        report.ahead = _ahead(values_a, values_b)
        return report
    report.results.append(welch(xs, ys))
    if not set(values_a) & set(values_b):
        report.notes.append(f"the cells share no seed ({a.label}: {_seeds(values_a)}; {b.label}: "
                            f"{_seeds(values_b)}): no seed pairs to count or to test item by item (no paired "
                            "bootstrap); Welch's t compares their runs as independent")
        return report
    report.ahead = _ahead(values_a, values_b)
    if metric in GENERATION_METRICS:
        report.results += _bootstraps(a, b, metric, samples, seed, _generation_items(metric, references), HYPOTHESES,
                                      "a seq2seq run writes them when it is tested; runs trained before that need "
                                      "retraining — or `maskattn eval -k RUN/best.safetensors --src … --ref … "
                                      f"--predictions RUN/{HYPOTHESES}` with the run's test decoding settings",
                                      report.notes)
    elif metric in PERCENT_METRICS:
        report.results += _bootstraps(a, b, metric, samples, seed, _label_items(metric, labels), PREDICTIONS,
                                      "a classifier run writes them when it is tested; for runs trained before "
                                      "that: `maskattn eval -k RUN/best.safetensors --data TEST_FILE --predictions "
                                      f"RUN/{PREDICTIONS}`", report.notes)
    return report


def _seeds(values: dict) -> str:
    """The seeds of a cell's runs (keys ``(seed,)``), for messages."""
    return "seed" + ("s " if len(values) > 1 else " ") + ", ".join(str(key[0]) for key in sorted(values, key=str))


def _ahead(values_a: dict, values_b: dict) -> tuple[int, int, int]:
    common = [k for k in values_a if k in values_b]
    return (sum(values_a[k] > values_b[k] for k in common), sum(values_a[k] < values_b[k] for k in common),
            sum(values_a[k] == values_b[k] for k in common))


#: per seed pair: the two runs' per-item statistics (rows: the same test items) and the corpus score of summed rows
ItemStatistics = Callable[[RunRecord, RunRecord], tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], float]]]


def _bootstraps(a: Cell, b: Cell, metric: str, samples: int, seed: int, items: ItemStatistics, file: str,
                how: str, notes: list[str]) -> list[Result]:
    """The paired bootstrap of every seed pair whose two runs kept what they were scored on (``file``; ``how``
    says how runs get it)."""
    runs_b = {b.replicate(r): r for r in b.runs}
    pairs = [(a.replicate(r), r, runs_b[a.replicate(r)]) for r in a.runs if a.replicate(r) in runs_b]
    lacking = [r for _, ra, rb in pairs for r in (ra, rb) if not (r.folder / file).is_file()]
    if lacking:
        notes.append(f"paired bootstrap not run: {len(lacking)} of {2 * len(pairs)} runs of the seed pairs lack "
                     f"{file} ({how})")
        return []
    results = []
    for key, run_a, run_b in pairs:
        stats_a, stats_b, score = items(run_a, run_b)
        for run, s in ((run_a, stats_a), (run_b, stats_b)):
            recorded, recomputed = _value(run, metric), score(s.sum(0))
            if abs(recorded - recomputed) > 1e-3 * max(1.0, abs(recorded)):
                raise DataError(f"{run.folder / file} scores {metric} {recomputed:.4f}, its summary.json "
                                f"{recorded:.4f}: the file does not hold what that run was scored on")
        result = paired_bootstrap(stats_a, stats_b, score, samples=samples, seed=seed)
        result.test = f"paired bootstrap, seed {key[0]}"
        results.append(result)
    return results


def _generation_items(metric: str, references: Callable[[RunRecord], list[str]]) -> ItemStatistics:
    def items(run_a: RunRecord, run_b: RunRecord):
        refs = references(run_a)
        if references(run_b) != refs:
            raise ArgumentError(f"{run_a.folder} and {run_b.folder} were tested on different references")
        stats_a, score = item_statistics(read_test_hypotheses(run_a.folder, len(refs)), refs, metric)
        stats_b, _ = item_statistics(read_test_hypotheses(run_b.folder, len(refs)), refs, metric)
        return stats_a, stats_b, score

    return items


def _label_items(metric: str, labels: Callable[[RunRecord], list[Label]]) -> ItemStatistics:
    def items(run_a: RunRecord, run_b: RunRecord):
        gold = labels(run_a)
        if labels(run_b) != gold:
            raise ArgumentError(f"{run_a.folder} and {run_b.folder} were tested on different test splits")
        preds_a, preds_b = read_test_predictions(run_a.folder), read_test_predictions(run_b.folder)
        for run, predictions in ((run_a, preds_a), (run_b, preds_b)):
            _check_gold(run.folder / PREDICTIONS, predictions, gold)
        stats_a, score = label_statistics(preds_a, metric)
        stats_b, _ = label_statistics(preds_b, metric)
        return stats_a, stats_b, score

    return items


def _check_gold(path: Path, predictions: list[Prediction], gold: list[Label]) -> None:
    """Each item's gold label in a run's ``test.pred.jsonl`` is its test split's, item by item (a tagger's tags: as
    many as the model read, from the first); else a :class:`DataError` naming ``file:line``."""
    if len(predictions) != len(gold):
        raise DataError(f"{path} holds {len(predictions):,} items, the run's test split {len(gold):,}: the file does "
                        "not hold what that run was scored on")
    for number, (item, label) in enumerate(zip(predictions, gold), start=1):
        if item.label != label and not (isinstance(label, list) and isinstance(item.label, list)
                                        and 0 < len(item.label) < len(label) and label[:len(item.label)] == item.label):
            raise DataError(f"{path}:{number}: gold label {shown(item.label)}, the test split's item {number} is "
                            f"{shown(label)}: the file does not hold what that run was scored on")


def label_statistics(predictions: list[Prediction], metric: str) -> tuple[np.ndarray, Callable[[np.ndarray], float]]:
    """Per-item statistics of a classifier's ``accuracy`` or a tagger's ``f1`` and the score (in points) from their
    column sums (module docstring): a sentence's ``[right]``, a tagger's ``[right tokens, tokens]`` or ``[true,
    predicted, gold chunks]`` (micro F1, as :func:`maskattn.metrics.span_f1`)."""
    tagger = isinstance(predictions[0].label, list)
    if metric == "f1":
        if not tagger:
            raise ArgumentError("--metric f1 is a tagger's chunk F1; these runs classify sentences (use accuracy)")
        rows = []
        for p in predictions:
            predicted, gold = bio_spans(p.prediction), bio_spans(p.label)
            rows.append((len(predicted & gold), len(predicted), len(gold)))

        def f1(totals: np.ndarray) -> float:
            true, predicted, gold = totals
            return 0.0 if true == 0 else float(100 * 2 * true / (predicted + gold))

        return np.array(rows, dtype=float), f1
    if tagger:
        tokens = [(sum(x == y for x, y in zip(p.prediction, p.label)), len(p.label)) for p in predictions]
        return np.array(tokens, dtype=float), lambda totals: float(100 * totals[0] / max(1.0, totals[1]))
    right = np.array([[float(p.prediction == p.label)] for p in predictions])
    return right, lambda totals: float(100 * totals[0] / len(predictions))


def item_statistics(hypotheses: Sequence[str], references: Sequence[str],
                    metric: str) -> tuple[np.ndarray, Callable[[np.ndarray], float]]:
    """Per-item statistics of ``metric`` and the corpus score from their column sums: sacreBLEU's sufficient
    statistics for ``bleu`` / ``chrf``; the ROUGE F1 (``rouge``: the mean of ROUGE-1, -2, -L) for ROUGE, scored as
    :func:`maskattn.metrics.rouge_scores` scores it."""
    n = len(references)
    if metric in ("bleu", "chrf"):
        import sacrebleu

        scorer = sacrebleu.BLEU() if metric == "bleu" else sacrebleu.CHRF()
        stats = np.array(scorer._extract_corpus_statistics(list(hypotheses), [list(references)]), dtype=float)
        return stats, lambda totals: float(scorer._compute_score_from_stats(list(totals)).score)
    from rouge_score import rouge_scorer

    from ..metrics.summarization import ROUGE_TYPES, sentences

    multi = any(len(sentences(reference)) > 1 for reference in references)
    types = list(ROUGE_TYPES) if metric == "rouge" else [metric]
    scorer = rouge_scorer.RougeScorer(types, use_stemmer=False)
    values = np.empty((n, 1))
    for i, (hypothesis, reference) in enumerate(zip(hypotheses, references)):
        if multi:
            hypothesis, reference = "\n".join(sentences(hypothesis)), "\n".join(sentences(reference))
        scores = scorer.score(reference, hypothesis)
        values[i, 0] = float(np.mean([scores[t].fmeasure for t in types]))
    return values, lambda totals: float(100 * totals[0] / n)


def _run_data(record: RunRecord, what: str):
    """The ``data`` section of a run's configuration (its ``data.dir`` resolved by :func:`collect_runs`), which must
    name a folder here: ``what`` says what is read from it."""
    from ..train.config import RunConfig, from_dict

    nested: dict = {}
    for key, value in record.config.items():
        section, name = key.split(".", 1)
        nested.setdefault(section, {})[name] = value
    try:
        cfg = from_dict(RunConfig, nested)
    except ValueError as exc:
        raise DataError(f"{record.folder}/config.yaml: cannot be read back ({exc})") from None
    data = cfg.data
    if data.source == "files" and (data.dir is None or not Path(data.dir).is_dir() or not data.test):
        raise ArgumentError(f"the paired bootstrap reads {what} of {record.folder} from data.dir {data.dir}, which "
                            "is not a folder here (give the data beside the repository)")
    return data


def run_references(record: RunRecord) -> list[str]:
    """The references of a seq2seq run's test split, as its task scored them (its data folder must be there)."""
    from ..data.parallel import read_parallel_prefixes

    data = _run_data(record, "the test references")
    src, tgt = data.suffixes
    return list(read_parallel_prefixes(data.dir, data.test, src, tgt).with_unknown(data.unk_tokens).target)


def run_labels(record: RunRecord) -> list[Label]:
    """The gold labels of a classifier run's test split (a tagger's: lists of tags), in test order, as its task
    read them (:func:`maskattn.data.tasks.load_splits`; its data folder must be there)."""
    from ..data.tasks import load_splits

    test = load_splits(_run_data(record, "the test split's gold labels")).test
    return [list(item.tags) if hasattr(item, "tags") else item.label for item in test]


# --- output -------------------------------------------------------------------------------------------------------

def _number(value: float, digits: int = 2) -> str:
    return f"{value:+.{digits}f}" if math.isfinite(value) else "–"


def p_text(result: Result) -> str:
    """p as the table shows it: "–" when undefined, "< 0.002" for a bootstrap's 0 (below its resolution)."""
    p = result.p
    if math.isnan(p):
        return "–"
    if p == 0 and result.p_resolution:
        return f"< {result.p_resolution:.2g}"
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def _verdict(result: Result) -> str:
    return {True: "yes", False: "no", None: "undefined (no spread: see the note)"}[result.established]


def markdown_report(reports: list[PairReport]) -> str:
    """The comparisons as a Markdown table (one row per test), then each pair's notes."""
    if not reports:
        return ""
    unit = " (points)" if reports[0].metric in PERCENT_METRICS else ""
    lines = [f"| A | B | test {reports[0].metric}: A, B (mean ± std) | test | A − B{unit} | 95 % CI | statistic | p "
             "| established at 5 % |", "|---|---|---|---|---:|---|---:|---:|---|"]
    notes = []
    for report in reports:
        means = f"{report.mean_a:.2f} ± {report.std_a:.2f}, {report.mean_b:.2f} ± {report.std_b:.2f}"
        for result in report.results:
            if math.isnan(result.statistic):
                statistic = "–"
            elif result.df is not None:
                statistic = f"t = {result.statistic:.2f} (df {result.df:.1f})"
            else:
                statistic = f"Δ = {result.statistic:.2f}"
            test = f"{result.test} ({result.n})"
            lines.append(f"| {report.a} | {report.b} | {means} | {test} | {_number(result.difference)} | "
                         f"[{_number(result.low)}, {_number(result.high)}] | {statistic} | {p_text(result)} | "
                         f"{_verdict(result)} |")
        if report.ahead is not None:
            pairs = "fold pairs" if report.replication == "folds" else "seed pairs"
            lead_a, lead_b, tie = report.ahead
            notes.append(f"{report.a} vs {report.b}: {report.a} ahead in {lead_a}, {report.b} in {lead_b} of "
                         f"{lead_a + lead_b + tie} {pairs}" + (f" ({tie} tied)" if tie else ""))
        notes += [f"{report.a} vs {report.b}: {note}" for result in report.results for note in result.notes]
        notes += [f"{report.a} vs {report.b}: {note}" for note in report.notes]
    if any(result.p_resolution for report in reports for result in report.results):
        notes.append(f"paired bootstrap: established when its 95 % percentile interval excludes 0, which is its "
                     f"two-sided p, 2 · min(share of resampled differences ≤ 0, share ≥ 0), under {LEVEL:g}")
    return "\n".join(lines + [""] + [f"- {note}" for note in dict.fromkeys(notes)])


def _json_value(value):
    """``value`` with its NaN floats as ``null`` (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    return value


def json_report(reports: list[PairReport]) -> str:
    """The comparisons as JSON (a list, one object per pair of cells, its tests under ``results``; an undefined
    test's p, statistic, interval and ``established`` are ``null``)."""
    out = []
    for report in reports:
        item = asdict(report)
        for result, data in zip(report.results, item["results"]):
            data["established"] = result.established
        out.append(_json_value(item))
    return json.dumps(out, indent=2, allow_nan=False)
