"""One run trained to its end whatever interrupts it — what a cross-validation fold and a grid run are.

:func:`run_to_end` trains the configuration in its ``train.out_dir`` and writes the summary of :meth:`Trainer.fit`
to ``summary.json`` there: a run that has its ``summary.json`` is finished and is not trained again; one stopped
half-way continues from its ``last.safetensors`` (exactly, as ``--resume``; with ``train.keep_last`` off it starts
again); a folder that holds a run of another configuration is refused (:func:`check_same_run`): configurations are
compared after resolving their defaults (:func:`resolved_config`: ``model.embed_scale: null`` and the scale it
means are one run), without the settings that do not change what a run computes (:data:`FREE_SETTINGS`) and
without ``train.out_dir`` (the folder is the run's wherever it lies: a copied or moved grid continues).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ..data.text import read_text
from ..errors import ConfigError, DataError, MaskattnError
from ..sections import is_sections, parse_yaml
from ..files import atomic_write
from .run_folder import RunFolder

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = ["run_to_end", "check_same_run", "resolved_config", "read_summary", "write_json", "SUMMARY",
           "FREE_SETTINGS"]

SUMMARY = "summary.json"
#: settings that do not change what a run computes: a run may be continued with other values
FREE_SETTINGS = {("train", "progress"), ("train", "num_threads"), ("train", "device"), ("train", "tensorboard")}


def write_json(path: Path, data: dict) -> None:
    """``data`` as indented JSON, written atomically."""
    atomic_write(path, [(json.dumps(data, indent=2) + "\n").encode()])


def read_summary(folder: Path, metric: str | None = None, *, what: str = "run") -> dict | None:
    """The summary of the finished run in ``folder``, or ``None`` when it has not finished. A summary that is not
    a JSON object whose ``test`` holds the number ``metric`` (any test metrics without one) — a file edited or
    damaged by hand — is a :class:`~maskattn.errors.DataError` naming it (``what`` names the run: fold, …)."""
    path = Path(folder) / SUMMARY
    if not path.is_file():
        return None
    try:
        summary = json.loads(read_text(path, f"{what} summary"))
    except json.JSONDecodeError as exc:
        summary = exc
    test = summary.get("test") if isinstance(summary, dict) else None
    if not (isinstance(test, dict) and (metric is None or isinstance(test.get(metric), (int, float)))):
        wanted = f"the number {metric!r}" if metric is not None else "the test metrics"
        raise DataError(f"{path} is not a finished {what}'s summary (a JSON object whose 'test' holds {wanted}); "
                        f"delete it to train that {what} again")
    return summary


def resolved_config(config: dict) -> dict | None:
    """A run configuration (sections) as the run means it: validated into a :class:`RunConfig` (absent keys take
    their defaults, and a run with pretrained vectors its ``embed_scale`` 1), with the values that stand for
    another resolved — ``model.embed_scale: null`` to the scale the model uses, ``optim.label_smoothing: null`` to
    the task's ε. ``None`` when this version of maskattn cannot read it (an unknown key or value)."""
    from ..models.factory import embedding_scale
    from .config import RunConfig, from_dict
    from .tasks import TRANSLATION_LABEL_SMOOTHING

    try:
        cfg = from_dict(RunConfig, json.loads(json.dumps(config)))
    except (MaskattnError, ValueError, TypeError):
        return None
    resolved = cfg.to_dict()
    resolved["model"]["embed_scale"] = embedding_scale(cfg.model)
    if cfg.optim.label_smoothing is None:
        resolved["optim"]["label_smoothing"] = TRANSLATION_LABEL_SMOOTHING if cfg.model.type == "seq2seq" else 0.0
    return resolved


def check_same_run(cfg: RunConfig, folder: Path) -> None:
    """A folder already holding a run of another configuration is an error, not something to reuse (module
    docstring: compared after resolving defaults, without :data:`FREE_SETTINGS` and ``train.out_dir``)."""
    saved_path = Path(folder) / "config.yaml"
    if not saved_path.exists():
        return
    saved, wanted = parse_yaml(read_text(saved_path, "config file"), str(saved_path)), cfg.to_dict()
    if not isinstance(saved, dict) or not is_sections(saved):
        raise ConfigError(f"{saved_path} is not a run configuration (a mapping of sections); give this run a new "
                          "folder (--out)")
    saved_resolved, wanted_resolved = resolved_config(saved), resolved_config(wanted)
    if saved_resolved is not None and wanted_resolved is not None:
        saved, wanted = saved_resolved, wanted_resolved
    ignored = FREE_SETTINGS | {("train", "out_dir")}
    changed = sorted(f"{section}.{key}" for section in wanted for key in wanted[section]
                     if (section, key) not in ignored and saved.get(section, {}).get(key) != wanted[section][key])
    if changed:
        raise ConfigError(f"{folder} holds a run of another configuration (differs in {', '.join(changed[:5])}); "
                          "give this run a new folder (--out)")


def run_to_end(cfg: RunConfig, *, console: Console | None = None, what: str = "run") -> tuple[dict, bool]:
    """Train ``cfg`` in ``cfg.train.out_dir`` to its end (module docstring); returns its summary and whether it
    was trained now (False: finished earlier). ``what`` names the run in messages (fold, …)."""
    folder = Path(cfg.train.out_dir)
    check_same_run(cfg, folder)
    if (summary := read_summary(folder, cfg.train.metric, what=what)) is not None:
        return summary, False
    from .trainer import Trainer  # torch: imported by what trains, not by what reads records

    last = folder / "last.safetensors"
    if last.exists():  # interrupted earlier: continue it
        free = {key: getattr(cfg.train, key) for section, key in sorted(FREE_SETTINGS) if section == "train"}
        trainer = Trainer.resume(last, train_overrides=free, console=console)
    else:  # anything else in the folder is this run (same configuration, checked) stopped before its first
        trainer = Trainer(cfg, console=console, overwrite=True)  # checkpoint: start it again
    summary = trainer.fit()
    with RunFolder(folder) as run_folder:  # the summary joins the run's manifest: --overwrite may delete it
        run_folder.claim(SUMMARY)
        write_json(folder / SUMMARY, summary)
    return summary, True
