"""From a data configuration to train / dev / test example lists.

Sources: ``files`` (the readers in :mod:`.readers` on ``dir/train`` etc.), ``hf`` (Hugging Face
``datasets``) and ``order`` (the synthetic task). Without a test file, ``cv_folds`` > 1 selects fold
``fold`` of k-fold cross-validation as the test split (SUBJ, CR, MPQA); without a dev file,
``dev_fraction`` of the train split is held out for model selection — a seeded random sample, or with
``dev_holdout: last`` the end of the train file.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ArgumentError, ConfigError
from .hf import load_hf_splits
from .readers import READERS
from .splits import Splits, check_label_sets, holdout, kfold
from .synthetic import order_splits

__all__ = ["load_splits", "SOURCES"]

SOURCES = ("files", "hf", "order")


def _files(cfg) -> tuple[Splits, dict[str, str]]:
    if cfg.dir is None:
        raise ArgumentError("data.dir is not set; pass the dataset folder, e.g. --data ../shared/data/trec")
    if cfg.format not in READERS:
        raise ArgumentError(f"unknown data.format {cfg.format!r}; expected one of {', '.join(READERS)}")
    if not cfg.train:
        raise ArgumentError("data.train (the train file name inside data.dir) is not set")
    read = READERS[cfg.format]
    root = Path(cfg.dir)
    if not root.is_dir():
        raise ArgumentError(f"data.dir {root} is not a directory")
    paths = {split: str(root / getattr(cfg, split)) for split in ("train", "dev", "test") if getattr(cfg, split)}
    options = {"skip_empty": True} if cfg.skip_empty and cfg.format in ("tsv", "trec", "trec_fine") else {}
    loaded = {split: read(path, **cfg.token_options, **options) for split, path in paths.items()}
    return Splits(loaded["train"], loaded.get("dev", []), loaded.get("test", [])), paths


def _hf(cfg) -> tuple[Splits, dict[str, str]]:
    if not cfg.hf_name:
        raise ConfigError("data.source 'hf' needs data.hf_name (a hub dataset, or a builder such as 'csv' with "
                          "data.hf_data_files)")
    pair = tuple(cfg.pair_fields) if cfg.pair_fields else None
    loaded = load_hf_splits(cfg.hf_name, config=cfg.hf_config, data_files=cfg.hf_data_files, text_field=cfg.text_field,
                            label_field=cfg.label_field, pair_fields=pair, **cfg.token_options)
    if "train" not in loaded:
        raise ArgumentError(f"dataset {cfg.hf_name!r} has no 'train' split; splits: {sorted(loaded)}")
    dev = loaded.get("validation", loaded.get("dev", []))
    names = {split: f"{cfg.hf_name}[{split}]" for split in loaded}
    return Splits(loaded["train"], dev, loaded.get("test", [])), names


def load_splits(cfg) -> Splits:
    """Load, split and check a dataset described by a :class:`maskattn.train.config.DataConfig`."""
    if cfg.source not in SOURCES:
        raise ArgumentError(f"unknown data.source {cfg.source!r}; expected one of {', '.join(SOURCES)}")
    if cfg.source == "order":
        train, dev, test = order_splits(*cfg.order_sizes, min_len=cfg.order_lengths[0], max_len=cfg.order_lengths[1],
                                        seed=cfg.split_seed)
        return Splits(train, dev, test)
    splits, names = _files(cfg) if cfg.source == "files" else _hf(cfg)
    if cfg.cv_folds:
        if splits.test:
            raise ArgumentError("data.cv_folds is set but the dataset has a test split; use one or the other")
        splits.train, splits.test = kfold(splits.train, cfg.cv_folds, cfg.fold, seed=cfg.split_seed)
        names["test"] = f"fold {cfg.fold} of {cfg.cv_folds} of {names.get('train', 'train')}"
    if not splits.dev:
        splits.train, splits.dev = holdout(splits.train, cfg.dev_fraction, seed=cfg.split_seed, mode=cfg.dev_holdout)
        names["dev"] = f"{'the last ' if cfg.dev_holdout == 'last' else ''}{cfg.dev_fraction:g} of " \
                       f"{names.get('train', 'train')}"
    check_label_sets(splits, names)
    return splits
