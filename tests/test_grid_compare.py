"""``maskattn grid compare``: Welch's t against scipy and its formula, the Nadeau–Bengio corrected paired t against
its formula, the paired bootstrap against sacreBLEU's, ROUGE per item against the run's score, the cells' spelling
and every refusal (other data, an unknown metric, one run in a cell, unpaired folds), and a seq2seq run keeping
the test hypotheses it was scored on."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from maskattn.cli import app
from maskattn.errors import ArgumentError, DataError
from maskattn.metrics import rouge_scores, span_f1
from maskattn.metrics.test_outputs import Prediction, predictions_bytes
from maskattn.grid import compare as gc
from maskattn.grid.compare import compare, item_statistics, nadeau_bengio, paired_bootstrap, resolve_cells, welch

from scipy import stats

from _train_helpers import flat

runner = CliRunner()


def write_grid(folder, cells: dict[str, dict], *, preset="trec", data="data/trec", cv_folds=0, metric="accuracy",
               hypotheses: dict | None = None, predictions: dict | None = None, root=None):
    """A grid folder of finished runs without training: ``cells`` maps a cell to ``{replicate: test value}`` where a
    replicate is a seed, or ``(fold, seed)`` with ``cv_folds``; ``root``: the grid's working directory (default: the
    folder above it), what its relative ``data`` means; ``hypotheses`` / ``predictions``: a run's test.hyp.txt lines /
    test.pred.jsonl items by ``(cell, seed)``."""
    runs = []
    for cell, values in cells.items():
        for replicate, value in values.items():
            fold, seed = replicate if isinstance(replicate, tuple) else (0, replicate)
            name = f"{cell}/fold{fold}-seed{seed}" if cv_folds else f"{cell}/seed{seed}"
            run = folder / name
            run.mkdir(parents=True)
            config = {"data": {"dir": data, "format": "tsv", "cv_folds": cv_folds, "fold": fold, "dev_fraction": 0.1},
                      "model": {"encoder": cell}, "train": {"seed": seed, "out_dir": str(run), "metric": metric}}
            (run / "config.yaml").write_text(yaml.safe_dump(config))
            (run / "summary.json").write_text(json.dumps({"metric": metric, "best_dev": value, "test": {metric: value}}))
            if hypotheses and (cell, seed) in hypotheses:
                (run / gc.HYPOTHESES).write_text("".join(h + "\n" for h in hypotheses[cell, seed]))
            if predictions and (cell, seed) in predictions:
                (run / gc.PREDICTIONS).write_bytes(predictions_bytes(predictions[cell, seed]))
            runs.append({"name": name, "cell": cell, "settings": {"variant": cell},
                         "replicate": {"train.seed": str(seed)}, "overrides": []})
    (folder / "grid.json").write_text(json.dumps({"format": "maskattn-grid/1", "base": {"preset": preset},
                                                  "fixed": [], "cwd": os.path.relpath(root or folder.parent, folder),
                                                  "runs": runs}))
    return folder


# --- the tests themselves -------------------------------------------------------------------------------------

def test_welch_matches_scipy_and_its_formula():
    a, b = [91.2, 92.4, 89.6, 90.8, 92.0], [92.4, 92.0, 92.6, 92.2, 92.6]
    result = welch(a, b)
    reference = stats.ttest_ind(a, b, equal_var=False)
    assert result.statistic == pytest.approx(reference.statistic) and result.p == pytest.approx(reference.pvalue)
    va, vb = np.var(a, ddof=1) / 5, np.var(b, ddof=1) / 5
    df = (va + vb) ** 2 / (va ** 2 / 4 + vb ** 2 / 4)  # Welch–Satterthwaite
    assert result.df == pytest.approx(df)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    assert (result.low, result.high) == pytest.approx((np.mean(a) - np.mean(b) - half, np.mean(a) - np.mean(b) + half))
    assert result.established is (result.p < 0.05)


def test_nadeau_bengio_is_the_corrected_formula_and_wider_than_the_plain_paired_t():
    d = [1.0, -0.5, 2.0, 0.5, 1.5, 0.0, 1.0, 2.5, -1.0, 1.0]  # mean 0.8, sample variance 1.1222…
    ratio = 0.1 / (0.9 * 0.9)
    result = nadeau_bengio(d, ratio)
    variance = (1 / 10 + ratio) * np.var(d, ddof=1)
    t = 0.8 / math.sqrt(variance)
    assert result.difference == pytest.approx(0.8) and result.statistic == pytest.approx(t)
    assert result.p == pytest.approx(2 * stats.t.sf(abs(t), 9)) and result.df == 9
    assert result.high - 0.8 == pytest.approx(stats.t.ppf(0.975, 9) * math.sqrt(variance))
    plain = stats.ttest_rel(np.array(d), np.zeros(10))
    assert plain.pvalue < 0.05 < result.p  # the plain paired t would call it established; the corrected one does not


def _percentile_rule(deltas: np.ndarray) -> tuple[float, float, float]:
    """The interval and p the one rule gives for resampled differences (module docstring of grid.compare)."""
    k = math.ceil(len(deltas) / 40)
    ordered = np.sort(deltas)
    p = min(1.0, 2 * min(np.sum(deltas <= 0), np.sum(deltas >= 0)) / len(deltas))
    return float(ordered[k - 1]), float(ordered[len(deltas) - k]), p


def test_paired_bootstrap_of_bleu_resamples_as_sacrebleu_does():
    import sacrebleu

    refs = [f"the cat number {i} sat on the mat today" for i in range(40)]
    hyps_a = [r if i % 3 else r.replace("mat", "rug") for i, r in enumerate(refs)]
    hyps_b = [r if i % 2 else r.replace("sat", "stood") for i, r in enumerate(refs)]
    stats_a, score = item_statistics(hyps_a, refs, "bleu")
    stats_b, _ = item_statistics(hyps_b, refs, "bleu")
    ours = paired_bootstrap(stats_a, stats_b, score, samples=200, seed=7)
    assert score(stats_a.sum(0)) == pytest.approx(sacrebleu.corpus_bleu(hyps_a, [refs]).score)
    # sacreBLEU's paired_bs draws default_rng(SACREBLEU_SEED).choice(n, (samples, n)); BLEU of each resample
    indices = np.random.default_rng(7).choice(40, size=(200, 40), replace=True)
    deltas = np.array([sacrebleu.corpus_bleu([hyps_a[i] for i in row], [[refs[i] for i in row]]).score
                       - sacrebleu.corpus_bleu([hyps_b[i] for i in row], [[refs[i] for i in row]]).score
                       for row in indices])
    assert (ours.low, ours.high, ours.p) == pytest.approx(_percentile_rule(deltas))
    assert ours.low <= ours.difference <= ours.high and ours.p_resolution == 0.01


def test_the_bootstraps_verdict_p_and_interval_agree():
    """One rule: established ⟺ p < 0.05 ⟺ the 95 % interval excludes 0 — also where sacreBLEU's p said
    "established" beside an interval holding 0 (Gigaword ROUGE-2, seed 2: p 0.024 with [−0.02, +0.96])."""
    rng = np.random.default_rng(0)
    disagreed = 0
    for case in range(60):
        n = int(rng.integers(20, 300))
        a = rng.random((n, 1))
        b = a - rng.normal(0.02 * (case % 6), 0.3, (n, 1))  # from no difference to a clear one
        samples = [40, 41, 999, 1000, 1001][case % 5]
        result = paired_bootstrap(a, b, lambda t: float(t[0]), samples=samples, seed=case)
        assert result.established == (result.low > 0 or result.high < 0), (case, result)
        # what sacreBLEU's p said on the same resamples
        deltas = np.array([float(a[i].sum() - b[i].sum()) for i in
                           np.random.default_rng(case).choice(n, size=(samples, n), replace=True)])
        old_p = (np.sum(np.abs(deltas) - np.abs(deltas).mean() > abs(result.difference)) + 1) / (samples + 1)
        disagreed += bool(old_p < 0.05) and result.low <= 0 <= result.high
        assert (result.low, result.high, result.p) == pytest.approx(_percentile_rule(deltas))
    assert disagreed  # the cases the old p got wrong are among these, and the rule now agrees with itself there


def test_rouge_per_item_recomposes_the_runs_score_and_a_system_against_itself_is_not_established():
    refs = ["police said the minister", "china and japan agreed", "talks on monday", "rain after two days"]
    hyps = ["police said minister", "china japan agreed to cut", "talks monday", "two days rain"]
    for metric in ("rouge", "rouge1", "rouge2", "rougeL"):
        values, score = item_statistics(hyps, refs, metric)
        assert score(values.sum(0)) == pytest.approx(rouge_scores(hyps, refs, bootstrap=0)[metric])
    values, score = item_statistics(hyps, refs, "rouge")
    same = paired_bootstrap(values, values, score, samples=100)
    assert same.difference == 0 and not same.established


# --- cells, the choice of the test, refusals ---------------------------------------------------------------------

def test_seeds_get_welch_and_seed_pairs_ahead(tmp_path):
    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.90, 1: 0.92, 2: 0.91}, "cnn": {0: 0.89, 1: 0.93, 2: 0.88}})
    [report] = compare(resolve_cells(["mtsa", "cnn"], [grid]), "accuracy")
    reference = stats.ttest_ind([90, 92, 91], [89, 93, 88], equal_var=False)
    assert report.replication == "seeds" and report.results[0].test == "Welch t"
    assert report.results[0].p == pytest.approx(reference.pvalue) and report.ahead == (2, 1, 0)
    result = runner.invoke(app, ["grid", "compare", str(grid), "--metric", "accuracy", "mtsa", "cnn"])
    assert result.exit_code == 0, result.output
    assert "| mtsa | cnn |" in result.output and "Welch t (3 vs 3 runs)" in result.output
    assert "mtsa ahead in 2, cnn in 1 of 3 seed pairs" in result.output
    data = json.loads(runner.invoke(app, ["grid", "compare", str(grid), "--metric", "accuracy", "mtsa", "cnn",
                                          "--format", "json"]).output)
    assert data[0]["results"][0]["established"] is False and data[0]["a"] == "mtsa"


def test_folds_get_the_corrected_paired_t_with_the_records_ratio(tmp_path):
    a = {(f, 0): 0.80 + 0.01 * f for f in range(10)}
    b = {(f, 0): 0.79 + 0.01 * f + (0.005 if f % 2 else -0.002) for f in range(10)}
    grid = write_grid(tmp_path / "g", {"mtsa": a, "mha": b}, preset="cr", cv_folds=10)
    [report] = compare(resolve_cells(["mtsa", "mha"], [grid]), "accuracy")
    d = [100 * (a[f, 0] - b[f, 0]) for f in range(10)]
    expected = nadeau_bengio(d, 0.1 / (0.9 * 0.9))
    assert report.replication == "folds" and report.results[0].p == pytest.approx(expected.p, rel=1e-4)
    assert "n_test/n_train = 0.1235" in report.results[0].notes[0]


def test_cells_of_two_grids_are_named_by_their_folder(tmp_path):
    vectors = write_grid(tmp_path / "table5_vectors" / "trec", {"mtsa": {0: 0.91, 1: 0.92}}, root=tmp_path)
    random = write_grid(tmp_path / "table5_random50" / "trec", {"mtsa": {0: 0.88, 1: 0.90}}, root=tmp_path)
    [report] = compare(resolve_cells(["table5_vectors/trec:mtsa", "table5_random50/trec:mtsa"], [vectors, random]),
                       "accuracy")
    assert (report.a, report.b) == ("table5_vectors/trec:mtsa", "table5_random50/trec:mtsa")
    assert report.mean_a - report.mean_b == pytest.approx(2.5)
    # a GRID:CELL whose GRID is a folder needs no separate grid argument
    result = runner.invoke(app, ["grid", "compare", f"{vectors}:mtsa", f"{random}:mtsa", "--metric", "accuracy"])
    assert result.exit_code == 0 and "+2.50" in result.output
    with pytest.raises(ArgumentError, match="cell 'mtsa' is in 2 grids .*qualify it: GRID:mtsa"):
        resolve_cells(["mtsa", "mtsa"], [vectors, random])


def test_bad_input_is_one_line_naming_the_problem(tmp_path):
    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.9, 1: 0.91}, "one": {0: 0.8}})
    other = write_grid(tmp_path / "h", {"mtsa": {0: 0.5, 1: 0.6}}, preset="sst5", data="data/sst5")
    cases = [
        ([str(grid), "mtsa", "one"], "cell 'one' has 1 finished run; a comparison needs at least 2"),
        ([str(grid), "mtsa", "nope"], "cell 'nope' is not a cell of the grids"),
        ([f"{grid}:mtsa", f"{other}:mtsa"], "are of different presets or data"),
        ([str(grid), "mtsa"], "compare needs at least two cells"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["grid", "compare", *args, "--metric", "accuracy"])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    two = write_grid(tmp_path / "two", {"a": {0: 0.9, 1: 0.91}, "b": {0: 0.8, 1: 0.85}})
    with pytest.raises(ArgumentError, match="--metric bleu: no run was tested on it; the runs' test metrics are "
                                            "accuracy"):
        compare(resolve_cells(["a", "b"], [two]), "bleu")
    folds = write_grid(tmp_path / "f", {"a": {(0, 0): 0.9, (1, 0): 0.8}, "b": {(0, 0): 0.7, (2, 0): 0.8}},
                       preset="cr", cv_folds=10)
    with pytest.raises(ArgumentError, match=r"unpaired folds: a and b must have the same \(fold, seed\) runs"):
        compare(resolve_cells(["a", "b"], [folds]), "accuracy")


def test_generation_metrics_get_a_paired_bootstrap_per_seed_pair(tmp_path):
    refs = ["police said the minister", "china and japan agreed", "talks on monday", "rain after two days"] * 5
    good = [" ".join(r.split()[:3]) for r in refs]
    bad = [r.split()[0] for r in refs]
    score = {name: rouge_scores(h, refs, bootstrap=0)["rouge"] for name, h in (("good", good), ("bad", bad))}
    hyps = {(cell, seed): (good if cell == "man" else bad) for cell in ("man", "transformer") for seed in (0, 1)}
    grid = write_grid(tmp_path / "g", {"man": {0: score["good"], 1: score["good"] + 1e-9},
                                       "transformer": {0: score["bad"], 1: score["bad"]}},
                      preset="gigaword-transformer", metric="rouge", hypotheses=hyps)
    [report] = compare(resolve_cells(["man", "transformer"], [grid]), "rouge", samples=200,
                       references=lambda record: refs)
    tests = [r.test for r in report.results]
    assert tests == ["Welch t", "paired bootstrap, seed 0", "paired bootstrap, seed 1"]
    assert all(r.established and r.difference > 0 for r in report.results[1:])
    (grid / "man" / "seed0" / gc.HYPOTHESES).write_text("".join(h + "\n" for h in bad))
    with pytest.raises(DataError, match="the file does not hold what that run was scored on"):
        compare(resolve_cells(["man", "transformer"], [grid]), "rouge", samples=40, references=lambda record: refs)
    (grid / "man" / "seed0" / gc.HYPOTHESES).unlink()
    [report] = compare(resolve_cells(["man", "transformer"], [grid]), "rouge", references=lambda record: refs)
    assert [r.test for r in report.results] == ["Welch t"]
    assert "paired bootstrap not run: 1 of 4 runs of the seed pairs lack test.hyp.txt" in report.notes[0]


def test_a_seq2seq_run_keeps_the_hypotheses_it_was_scored_on(tmp_path):
    from _train_helpers import write_summaries
    from test_summarization import summarization_config

    from maskattn.train import Trainer
    from maskattn.grid.records import RunRecord, _flatten

    data = write_summaries(tmp_path)
    cfg = summarization_config(data, tmp_path / "run", train={"max_steps": 4, "eval_every": 4})
    summary = Trainer(cfg).fit()
    record = RunRecord(tmp_path / "run", _flatten(cfg.to_dict()), summary)
    hyps = (tmp_path / "run" / gc.HYPOTHESES).read_text(encoding="utf-8").split("\n")[:-1]
    refs = gc.run_references(record)
    assert len(hyps) == len(refs) == 12
    assert rouge_scores(hyps, refs, bootstrap=0)["rouge"] == pytest.approx(summary["test"]["rouge"])
    assert gc.HYPOTHESES in json.loads((tmp_path / "run" / ".run-files.json").read_text())["files"]


def test_classifiers_get_a_paired_bootstrap_per_seed_pair_from_their_predictions(tmp_path, monkeypatch):
    gold = ["pos", "neg"] * 50
    def system(wrong: int, shift: int = 0):  # `wrong` items (from `shift` on) predicted wrong
        flip = {"pos": "neg", "neg": "pos"}
        return [Prediction(flip[g] if shift <= i < shift + wrong else g, g) for i, g in enumerate(gold)]
    preds = {("mtsa", 0): system(8), ("mtsa", 1): system(10), ("cnn", 0): system(30), ("cnn", 1): system(9, 5)}
    grid = write_grid(tmp_path / "g", {"mtsa": {0: 0.92, 1: 0.90}, "cnn": {0: 0.70, 1: 0.91}}, predictions=preds)
    [report] = compare(resolve_cells(["mtsa", "cnn"], [grid]), "accuracy", samples=300, labels=lambda run: gold)
    assert [r.test for r in report.results] == ["Welch t", "paired bootstrap, seed 0", "paired bootstrap, seed 1"]
    seed0, seed1 = report.results[1:]
    assert seed0.difference == pytest.approx(22.0) and seed0.established and seed0.low > 0
    assert seed1.difference == pytest.approx(-1.0) and not seed1.established  # 6 items differ, 5 of them for cnn
    monkeypatch.setattr(gc, "run_labels", lambda run: gold)  # the CLI reads them from the runs' test split
    cli = runner.invoke(app, ["grid", "compare", str(grid), "--metric", "accuracy", "mtsa", "cnn", "--samples", "300"])
    assert cli.exit_code == 0 and "paired bootstrap, seed 0 (100 test items, 300 resamples)" in cli.output

    (grid / "cnn" / "seed1" / gc.PREDICTIONS).write_bytes(predictions_bytes(system(9)[:-1]))
    with pytest.raises(DataError, match="holds 99 items, the run's test split 100"):
        compare(resolve_cells(["mtsa", "cnn"], [grid]), "accuracy", samples=40)
    (grid / "cnn" / "seed1" / gc.PREDICTIONS).write_bytes(predictions_bytes(system(20)))
    with pytest.raises(DataError, match=r"cnn/seed1/test.pred.jsonl scores accuracy 80.0000, its summary.json 91.0000"):
        compare(resolve_cells(["mtsa", "cnn"], [grid]), "accuracy", samples=40)
    (grid / "cnn" / "seed1" / gc.PREDICTIONS).unlink()
    [report] = compare(resolve_cells(["mtsa", "cnn"], [grid]), "accuracy")
    assert [r.test for r in report.results] == ["Welch t"]
    assert "1 of 4 runs of the seed pairs lack test.pred.jsonl" in report.notes[0]
    assert "maskattn eval -k RUN/best.safetensors --data TEST_FILE --predictions RUN/test.pred.jsonl" in report.notes[0]


def test_a_taggers_items_recompose_its_token_accuracy_and_chunk_f1():
    gold = [["B-LOC", "I-LOC", "O"], ["O", "B-PER", "O"], ["B-ORG", "O", "O"]]
    predicted = [["B-LOC", "I-LOC", "O"], ["O", "B-PER", "I-PER"], ["O", "O", "B-ORG"]]
    items = [Prediction(p, g) for p, g in zip(predicted, gold)]
    rows, score = gc.label_statistics(items, "f1")
    assert rows.shape == (3, 3) and score(rows.sum(0)) == pytest.approx(100 * span_f1(predicted, gold))
    rows, score = gc.label_statistics(items, "accuracy")
    assert score(rows.sum(0)) == pytest.approx(100 * 6 / 9)
    with pytest.raises(ArgumentError, match="--metric f1 is a tagger's chunk F1"):
        gc.label_statistics([Prediction("pos", "pos")], "f1")


# --- statistics that agree with themselves, records that cannot break them -----------------------------------------

def test_zero_variance_is_said_in_words_and_nothing_warns(tmp_path):
    import warnings

    grid = write_grid(tmp_path / "g", {"same": {0: 0.9, 1: 0.9, 2: 0.9}, "twin": {0: 0.9, 1: 0.9, 2: 0.9},
                                       "low": {0: 0.8, 1: 0.8, 2: 0.8}, "near": {0: 0.9, 1: 0.9 + 1e-15, 2: 0.9}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a scipy / numpy RuntimeWarning fails the test
        same, different, near = (compare(resolve_cells(pair, [grid]), "accuracy")[0]
                                 for pair in (["same", "twin"], ["same", "low"], ["near", "same"]))
    welch_same, welch_different = same.results[0], different.results[0]
    assert (welch_same.difference, welch_same.p, welch_same.established) == (0.0, 1.0, False)
    assert "every run of each cell scored the same (90 and 90) and the cells do not differ" in welch_same.notes[0]
    assert welch_different.established is None and math.isnan(welch_different.p)
    assert welch_different.difference == pytest.approx(10.0)
    assert "Welch t is undefined: every run of each cell scored the same (90 and 80)" in welch_different.notes[0]
    assert near.results[0].established is False and math.isfinite(near.results[0].p)
    text = gc.markdown_report([same, different])
    assert "nan" not in text and "inf" not in text
    assert "| – | – | undefined (no spread: see the note) |" in text and "[+0.00, +0.00]" in text
    data = json.loads(gc.json_report([different]))  # JSON has no NaN: null
    assert data[0]["results"][0]["p"] is None and data[0]["results"][0]["established"] is None
    # folds that all differ by the same; two runs that score every item alike
    folds = nadeau_bengio([1.5, 1.5, 1.5], 0.1)
    assert folds.established is None and "every fold's difference is the same (+1.5)" in folds.notes[1]
    alike = paired_bootstrap(np.ones((5, 1)), np.ones((5, 1)), lambda t: float(t[0]), samples=40)
    assert (alike.p, alike.established, alike.low, alike.high) == (1.0, False, 0.0, 0.0)
    assert "the two runs score every test item the same" in alike.notes[0]


def test_cells_that_share_no_seed_say_so(tmp_path):
    grid = write_grid(tmp_path / "g", {"a": {0: 0.9, 1: 0.92}, "b": {2: 0.8, 3: 0.85}})
    result = runner.invoke(app, ["grid", "compare", str(grid), "--metric", "accuracy", "a", "b"])
    assert result.exit_code == 0, result.output
    assert "0 of 0" not in result.output
    assert ("the cells share no seed (a: seeds 0, 1; b: seeds 2, 3): no seed pairs to count or to test item by item"
            in flat(result.output))


def test_bad_options_and_bounds_are_one_line(tmp_path):
    grid = write_grid(tmp_path / "g", {"a": {0: 0.9, 1: 0.92}, "b": {0: 0.8, 1: 0.85}}, metric="rouge1")
    for folder in (grid / "a" / "seed0", grid / "a" / "seed1", grid / "b" / "seed0", grid / "b" / "seed1"):
        summary = json.loads((folder / "summary.json").read_text())
        summary["test"] |= {"rouge1_low": 0.5, "rouge1_high": 0.95}
        (folder / "summary.json").write_text(json.dumps(summary))
    cases = [(["--metric", "rouge1_low"], "--metric rouge1_low: a bound of rouge1's 95 % interval, not a metric; "
              "the runs' test metrics are rouge1"),
             (["--metric", "rouge1", "--seed", "-1"], "--seed must be an int >= 0"),
             (["--metric", "rouge1", "--samples", "1000000"], "--samples must be an int from 40 to 100,000"),
             (["--metric", "rouge1", "--samples", "10"], "--samples must be an int from 40 to 100,000")]
    for options, message in cases:
        result = runner.invoke(app, ["grid", "compare", str(grid), "a", "b", *options])
        assert result.exit_code == 2 and message in flat(result.output), result.output
        assert len(result.output.strip().splitlines()) == 1
    table = runner.invoke(app, ["grid", "table", str(grid), "--metric", "rouge1_high"])
    assert table.exit_code == 2 and "a bound of rouge1's 95 % interval, not a metric" in table.output


def test_a_metric_outside_its_range_fails_the_record_check(tmp_path):
    """An accuracy of 1e308 is finite, but 100 × it is not: it broke grid table's mean and compare's test."""
    grid = write_grid(tmp_path / "g", {"a": {0: 0.9, 1: 1e308}, "b": {0: 0.8, 1: 0.85}})
    for command in (["table", str(grid)], ["compare", str(grid), "--metric", "accuracy", "a", "b"]):
        result = runner.invoke(app, ["grid", *command])
        assert result.exit_code == 2, result.output
        assert "a/seed1/summary.json: test 'accuracy' must be in [0, 1] (accuracy's range), got 1e+308" in \
            flat(result.output)
        assert len(result.output.strip().splitlines()) == 1


def test_forged_gold_labels_are_caught_item_by_item(tmp_path):
    """90 gold labels forged in both runs' files so that both accuracies stay what their summaries say: the
    aggregate checks pass, the test split's labels do not."""
    gold = ["pos", "neg"] * 100
    flip = {"pos": "neg", "neg": "pos"}
    right = [Prediction(g, g) for g in gold]  # every item right: accuracy 1.0
    forged = [Prediction(flip[g], flip[g]) if i < 90 else p for i, (g, p) in enumerate(zip(gold, right))]
    grid = write_grid(tmp_path / "g", {"a": {0: 1.0, 1: 1.0}, "b": {0: 1.0, 1: 1.0 - 1e-9}},
                      predictions={(c, s): forged for c in ("a", "b") for s in (0, 1)})
    with pytest.raises(DataError, match=r"a/seed0/test.pred.jsonl:1: gold label 'neg', the test split's item 1 is "
                                        r"'pos': the file does not hold what that run was scored on"):
        compare(resolve_cells(["a", "b"], [grid]), "accuracy", samples=40, labels=lambda run: gold)


def test_the_bootstrap_streams_its_resamples_within_the_memory_budget(monkeypatch):
    """1,000,000 items: the resamples' indices are drawn a chunk at a time (was one (samples, n) array: 8 GB at
    1,000 resamples), and what cannot fit one resample at a time is refused with the estimate."""
    import tracemalloc

    from maskattn.errors import MemoryLimitError

    n = 1_000_000
    rng = np.random.default_rng(0)
    a = (rng.random((n, 1)) < 0.7).astype(float)
    b = (rng.random((n, 1)) < 0.7).astype(float)
    tracemalloc.start()
    result = paired_bootstrap(a, b, lambda totals: float(100 * totals[0] / n), samples=40)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100 * 2**20, peak  # one (40, 10⁶) draw of indices alone is 320 MB
    assert result.low <= result.difference <= result.high
    monkeypatch.setenv("MASKATTN_MEMORY_LIMIT", "20M")
    with pytest.raises(MemoryLimitError, match=r"the paired bootstrap over 1,000,000 test items \(40 resamples\) "
                                               r"would need about 38 MiB, more than the 20 MiB budget"):
        paired_bootstrap(a, b, lambda totals: float(totals[0]), samples=40)


def test_a_copy_of_a_grid_inside_the_folders_is_refused_not_counted_twice(tmp_path):
    """A folder holding gc/ and its backup gc.bak/: grid table showed six runs for a three-seed cell, grid compare
    each seed pair twice."""
    import shutil

    grid = write_grid(tmp_path / "runs" / "gc", {"a": {0: 0.9, 1: 0.92, 2: 0.91}, "b": {0: 0.8, 1: 0.85, 2: 0.83}})
    shutil.copytree(grid, tmp_path / "runs" / "gc.bak")
    for command in (["table", str(tmp_path / "runs")],
                    ["compare", str(tmp_path / "runs"), "--metric", "accuracy", "a", "b"],
                    ["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "curves")]):
        result = runner.invoke(app, ["grid", *command])
        assert result.exit_code == 2, result.output
        said = flat(result.output)
        assert f"{grid / 'a' / 'seed0'} " in said and f"{tmp_path / 'runs' / 'gc.bak' / 'a' / 'seed0'} " in said
        assert ("are the same run of cell a (seed 0), counted twice: a copy of a run or of a grid (a backup?) among "
                "the folders given") in said
        assert len(result.output.strip().splitlines()) == 1
    assert runner.invoke(app, ["grid", "table", str(grid)]).exit_code == 0  # the grid itself is whole
