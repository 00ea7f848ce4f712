"""What a classification preset costs before anyone starts it (README, "What a preset costs before you start it").

Trains each named preset for ``--steps`` steps at its default settings, times one dev evaluation, and extrapolates
the full run: the preset's steps × batch ÷ the measured examples/s, plus its dev evaluations and the setup. Prints
one JSON line per preset. Figures are extrapolations on the machine that runs this, not measured full runs.

    python scripts/preset_costs.py --data ../shared/data --steps 200 trec sst5 cr subj mpqa \
        trec-mtsa-authors sst5-mtsa-authors
    python scripts/preset_costs.py --data ../shared/data --steps 100 trec-minilm sst5-minilm
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from rich.console import Console

from maskattn.train import Trainer
from maskattn.train.config import load_config, preset_path


def preset_cost(name: str, data_root: Path, steps: int, out_dir: Path) -> dict[str, object]:
    """Measure ``steps`` training steps of preset ``name`` on ``data_root/<task>`` and extrapolate its full run."""
    data = f"data.dir={data_root / name.split('-')[0]}"
    preset = load_config(preset_path(name), [data])
    short = load_config(preset_path(name), [data, f"train.max_steps={steps}", "train.eval_every=1000000",
                                            "train.progress=false", "train.keep_last=false",
                                            f"train.out_dir={out_dir / name}"])
    started = time.perf_counter()
    trainer = Trainer(short, console=Console(quiet=True), overwrite=True)
    setup_s = time.perf_counter() - started
    rate = trainer.fit()["examples_per_s"]
    started = time.perf_counter()
    trainer.task.evaluate(trainer.eval_model, "dev")
    dev_eval_s = time.perf_counter() - started

    train = preset.train
    epoch_steps = math.ceil(len(trainer.task.data.train) / train.batch_size)
    full_steps = min(s for s in (train.max_steps, train.max_epochs * epoch_steps if train.max_epochs else 0) if s)
    evals = full_steps // train.eval_every
    total_s = setup_s + full_steps * train.batch_size / rate + evals * dev_eval_s
    return {"preset": name, "measured_steps": steps, "examples_per_s": rate, "setup_s": round(setup_s, 1),
            "dev_eval_s": round(dev_eval_s, 2), "full_steps": full_steps, "batch": train.batch_size, "evals": evals,
            "total_h": round(total_s / 3600, 2), "folds": preset.data.cv_folds or 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="+", help="classification preset names (maskattn train --preset NAME)")
    parser.add_argument("--data", type=Path, required=True, help="folder holding one data folder per task")
    parser.add_argument("--steps", type=int, default=200, help="training steps to measure (default 200)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        for name in args.presets:
            print(json.dumps(preset_cost(name, args.data, args.steps, Path(out_dir))), flush=True)


if __name__ == "__main__":
    main()
