"""Whether one grid cell beats another (``maskattn grid compare``): the difference of the cells' mean test metric,
its 95 % interval, the test statistic, p and "established at 5 %", with the test chosen from how the runs of the
cells are replicated.

* **Seeds** (independent runs on fixed splits): Welch's unequal-variance t test over the runs
  (``scipy.stats.ttest_ind(equal_var=False)``), with the number of seed pairs (same ``train.seed``) where each cell
  is ahead.
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
  (``test.pred.jsonl``, which carries the gold labels: both runs must hold the same items, in the same order). An
  item's statistics: whether it is right (a sentence's accuracy), its right and all tokens (a tagger's accuracy),
  its true, predicted and gold chunks (a tagger's micro F1). ``samples`` resamples of the item indices,
  the same for both systems (drawn as sacreBLEU's ``paired_bs`` draws them, ``numpy.random.default_rng(seed)``),
  the difference recomputed on each; the interval is its 2.5–97.5 percentiles, p is sacreBLEU's
  (``(#{|Δ*| − mean|Δ*| > |Δ|} + 1) / (samples + 1)``; 1 when Δ = 0). BLEU and chrF are recomputed from sacreBLEU's per-sentence
  sufficient statistics, ROUGE as the mean of ``rouge-score``'s per-item F1 (:func:`maskattn.metrics.rouge_scores`'s
  tokenisation). The bootstrap says whether the two *trained models* differ beyond test-set sampling; Welch's t
  whether the difference holds across training seeds. Runs without those files get the Welch row and a note.

A cell is named as ``maskattn grid table`` names it (``mtsa``, ``architecture=man``), qualified by its grid folder
when several grids are given or the names repeat: ``GRID:CELL`` (``benchmarks/results/table5_vectors/trec:mtsa``,
or any trailing part of a given grid's path, ``table5_vectors/trec:mtsa``). Cells of different presets or data,
a metric no run has, fewer than 2 runs in a cell and unpaired folds raise :class:`~maskattn.errors.ArgumentError`.
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
from ..metrics.test_outputs import Prediction
from .records import (HYPOTHESES, PREDICTIONS, RunRecord, collect_runs, read_test_hypotheses,
                      read_test_predictions)
from .table import PERCENT_METRICS, shown_value, table_rows

__all__ = ["Cell", "Result", "PairReport", "resolve_cells", "compare", "welch", "nadeau_bengio", "paired_bootstrap",
           "cv_ratio", "markdown_report", "json_report", "item_statistics", "label_statistics", "GENERATION_METRICS",
           "HYPOTHESES", "PREDICTIONS", "LEVEL"]

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

    @property
    def established(self) -> bool:
        return bool(self.p < LEVEL)


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


def welch(a: Sequence[float], b: Sequence[float]) -> Result:
    """Welch's t test of mean(a) − mean(b) (independent runs, unequal variances), with its 95 % interval."""
    stats = _scipy_stats()

    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(1 - LEVEL)
    return Result("Welch t", float(np.mean(a) - np.mean(b)), float(ci.low), float(ci.high), float(res.statistic),
                  float(res.pvalue), float(res.df), f"{len(a)} vs {len(b)} runs")


def nadeau_bengio(differences: Sequence[float], ratio: float) -> Result:
    """The paired t test of the mean of per-fold ``differences`` (A − B) with Nadeau & Bengio's corrected variance
    ``(1/J + ratio) · s²`` (``ratio`` = n_test / n_train), ``J − 1`` degrees of freedom."""
    stats = _scipy_stats()

    d = np.asarray(differences, dtype=float)
    j = len(d)
    mean = float(d.mean())
    variance = (1 / j + ratio) * float(d.var(ddof=1))
    df = j - 1
    if variance == 0:
        statistic = 0.0 if mean == 0 else math.copysign(math.inf, mean)
        p = 1.0 if mean == 0 else 0.0
        half = 0.0
    else:
        statistic = mean / math.sqrt(variance)
        p = float(2 * stats.t.sf(abs(statistic), df))
        half = float(stats.t.ppf(1 - LEVEL / 2, df)) * math.sqrt(variance)
    return Result("paired t, Nadeau–Bengio corrected", mean, mean - half, mean + half, statistic, p, float(df),
                  f"{j} paired folds", [f"n_test/n_train = {ratio:.4f}"])


def paired_bootstrap(stats_a: np.ndarray, stats_b: np.ndarray, score: Callable[[np.ndarray], float], *,
                     samples: int = 1000, seed: int = 12345) -> Result:
    """Paired bootstrap over test items (module docstring). ``stats_a`` / ``stats_b``: per-item statistics, one
    row per item (the same items, in order); ``score``: a corpus score from the column sums of the rows.
    The resampled item indices are sacreBLEU's (``default_rng(seed).choice(n, (samples, n))``), so BLEU's p
    equals ``sacrebleu.significance.PairedTest(test_type='bs')``'s with ``SACREBLEU_SEED=seed``."""
    a, b = np.asarray(stats_a, dtype=float), np.asarray(stats_b, dtype=float)
    if a.shape != b.shape or not len(a):
        raise ArgumentError(f"paired bootstrap: the two systems have {len(a)} and {len(b)} test items; they must be "
                            "the same items (and at least one)")
    n = len(a)
    indices = np.random.default_rng(seed).choice(n, size=(samples, n), replace=True)
    observed = score(a.sum(0)) - score(b.sum(0))
    deltas = np.array([score(a[i].sum(0)) - score(b[i].sum(0)) for i in indices])
    magnitudes = np.abs(deltas)
    centred = magnitudes - magnitudes.mean()
    # sacreBLEU's p; two systems with the same score (Δ = 0, e.g. one system against itself) differ in nothing
    p = (int(np.sum(centred > abs(observed))) + 1) / (samples + 1) if observed != 0 else 1.0
    low, high = np.percentile(deltas, [100 * LEVEL / 2, 100 * (1 - LEVEL / 2)])
    return Result("paired bootstrap", float(observed), float(low), float(high), float(observed), float(p), None,
                  f"{n} test items, {samples} resamples")


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
    tested = sorted({key for cell in cells for r in cell.runs for key in r.summary.get("test", {})
                     if isinstance(r.summary["test"][key], (int, float))})
    missing = [f"{cell.label} ({sum(metric not in r.summary.get('test', {}) for r in cell.runs)} runs)"
               for cell in cells if any(metric not in r.summary.get("test", {}) for r in cell.runs)]
    if missing:
        raise ArgumentError(f"--metric {metric}: " + (f"no test score of it in {', '.join(missing)}; "
                            if metric in tested else "no run was tested on it; ")
                            + f"the runs' test metrics are {', '.join(tested) or 'none'}")


def compare(cells: list[Cell], metric: str, *, samples: int = 1000, seed: int = 12345,
            references: Callable[[RunRecord], list[str]] | None = None) -> list[PairReport]:
    """Every pair of ``cells`` (in order: 1–2, 1–3, …, 2–3, …) compared on the test ``metric`` (module docstring).
    ``references(record)``: the test references of a seq2seq run (default: read from its data folder)."""
    _check_metric(cells, metric)
    reports = []
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            reports.append(_compare_pair(a, b, metric, samples, seed, references or run_references))
    return reports


def _compare_pair(a: Cell, b: Cell, metric: str, samples: int, seed: int,
                  references: Callable[[RunRecord], list[str]]) -> PairReport:
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
    report.ahead = _ahead(values_a, values_b)
    if metric in GENERATION_METRICS:
        report.results += _bootstraps(a, b, metric, samples, seed, _generation_items(metric, references), HYPOTHESES,
                                      "a seq2seq run writes them when it is tested; runs trained before that need "
                                      "retraining — or `maskattn eval -k RUN/best.safetensors --src … --ref … "
                                      f"--predictions RUN/{HYPOTHESES}` with the run's test decoding settings",
                                      report.notes)
    elif metric in PERCENT_METRICS:
        report.results += _bootstraps(a, b, metric, samples, seed, _label_items(metric), PREDICTIONS,
                                      "a classifier run writes them when it is tested; for runs trained before "
                                      "that: `maskattn eval -k RUN/best.safetensors --data TEST_FILE --predictions "
                                      f"RUN/{PREDICTIONS}`", report.notes)
    return report


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


def _label_items(metric: str) -> ItemStatistics:
    def items(run_a: RunRecord, run_b: RunRecord):
        preds_a, preds_b = read_test_predictions(run_a.folder), read_test_predictions(run_b.folder)
        if [p.label for p in preds_a] != [p.label for p in preds_b]:
            raise ArgumentError(f"{run_a.folder / PREDICTIONS} ({len(preds_a)} items) and {run_b.folder / PREDICTIONS} "
                                f"({len(preds_b)} items) do not hold the same test items in the same order (their "
                                "gold labels differ); a paired test needs one test set")
        stats_a, score = label_statistics(preds_a, metric)
        stats_b, _ = label_statistics(preds_b, metric)
        return stats_a, stats_b, score

    return items


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


def run_references(record: RunRecord) -> list[str]:
    """The references of a seq2seq run's test split, as its task scored them (its data folder must be there)."""
    from ..data.parallel import read_parallel_prefixes
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
    if data.dir is None or not Path(data.dir).is_dir() or not data.test:
        raise ArgumentError(f"the paired bootstrap reads the test references of {record.folder} from data.dir "
                            f"{data.dir}, which is not a folder here (give the data beside the repository)")
    src, tgt = data.suffixes
    return list(read_parallel_prefixes(data.dir, data.test, src, tgt).with_unknown(data.unk_tokens).target)


# --- output -------------------------------------------------------------------------------------------------------

def _number(value: float, digits: int = 2) -> str:
    return f"{value:+.{digits}f}" if math.isfinite(value) else str(value)


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


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
            statistic = f"t = {result.statistic:.2f} (df {result.df:.1f})" if result.df is not None else \
                f"Δ = {result.statistic:.2f}"
            test = f"{result.test} ({result.n})"
            lines.append(f"| {report.a} | {report.b} | {means} | {test} | {_number(result.difference)} | "
                         f"[{_number(result.low)}, {_number(result.high)}] | {statistic} | {_p(result.p)} | "
                         f"{'yes' if result.established else 'no'} |")
        if report.ahead is not None:
            pairs = "fold pairs" if report.replication == "folds" else "seed pairs"
            lead_a, lead_b, tie = report.ahead
            notes.append(f"{report.a} vs {report.b}: {report.a} ahead in {lead_a}, {report.b} in {lead_b} of "
                         f"{lead_a + lead_b + tie} {pairs}" + (f" ({tie} tied)" if tie else ""))
        notes += [f"{report.a} vs {report.b}: {note}" for result in report.results for note in result.notes]
        notes += [f"{report.a} vs {report.b}: {note}" for note in report.notes]
    return "\n".join(lines + [""] + [f"- {note}" for note in dict.fromkeys(notes)])


def json_report(reports: list[PairReport]) -> str:
    """The comparisons as JSON (a list, one object per pair of cells, its tests under ``results``)."""
    out = []
    for report in reports:
        item = asdict(report)
        for result, data in zip(report.results, item["results"]):
            data["established"] = result.established
        out.append(item)
    return json.dumps(out, indent=2)
