"""Train / dev / test splits: k-fold cross-validation for datasets without a test split (SUBJ, CR, MPQA:
10-fold, as MTSA §4.3), a held-out dev fraction (a seeded random sample, or the end of the file), and the
label-set agreement check between splits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ArgumentError
from .examples import Example, TaggedExample

__all__ = ["Splits", "kfold_indices", "kfold", "holdout", "HOLDOUTS", "labels_of", "check_label_sets"]

HOLDOUTS = ("random", "last")  # how holdout() picks the dev examples


@dataclass
class Splits:
    """The three splits of a task (``test`` may be empty when there is none)."""

    train: list
    dev: list
    test: list


def _permutation(n: int, seed: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def kfold_indices(n: int, folds: int, fold: int, *, seed: int = 0) -> tuple[list[int], list[int]]:
    """(train, test) indices of fold ``fold`` of ``folds``: one seeded permutation cut into ``folds``
    near-equal contiguous parts; part ``fold`` is the test set."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ArgumentError(f"cv_folds must be an int >= 2, got {folds!r}")
    if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < folds:
        raise ArgumentError(f"fold must be an int in [0, {folds}), got {fold!r}")
    if n < folds:
        raise ArgumentError(f"cannot split {n} examples into {folds} folds")
    order = _permutation(n, seed)
    bounds = [n * i // folds for i in range(folds + 1)]
    test = order[bounds[fold]:bounds[fold + 1]]
    return order[:bounds[fold]] + order[bounds[fold + 1]:], test


def kfold(examples: Sequence[Example], folds: int, fold: int, *, seed: int = 0) -> tuple[list, list]:
    """Split ``examples`` into (train, test) for one cross-validation fold."""
    train, test = kfold_indices(len(examples), folds, fold, seed=seed)
    return [examples[i] for i in train], [examples[i] for i in test]


def holdout(examples: Sequence[Example], fraction: float, *, seed: int = 0, mode: str = "random") -> tuple[list, list]:
    """Hold out ``fraction`` of ``examples`` as a dev set: returns (rest, held_out). ``mode`` ``random``: a
    seeded random sample (the rest in permuted order); ``last``: the last examples, both parts in their
    original order (``seed`` unused) — examples grouped in the file, such as SNLI's three hypotheses per
    premise, then stay on one side of the cut."""
    if not 0.0 < fraction < 1.0:
        raise ArgumentError(f"dev_fraction must be in (0, 1), got {fraction!r}")
    if mode not in HOLDOUTS:
        raise ArgumentError(f"unknown data.dev_holdout {mode!r}; expected one of {', '.join(HOLDOUTS)}")
    cut = max(1, int(round(len(examples) * fraction)))
    if mode == "last":
        return list(examples[:len(examples) - cut]), list(examples[len(examples) - cut:])
    order = _permutation(len(examples), seed)
    return [examples[i] for i in order[cut:]], [examples[i] for i in order[:cut]]


def labels_of(examples: Sequence[Example]) -> set[str]:
    if examples and isinstance(examples[0], TaggedExample):
        return {tag for e in examples if isinstance(e, TaggedExample) for tag in e.tags}
    return {e.label for e in examples if not isinstance(e, TaggedExample)}


def check_label_sets(splits: Splits, names: dict[str, str] | None = None) -> None:
    """Every label of dev/test must occur in train (a model cannot predict a class it never saw)."""
    train = labels_of(splits.train)
    for split in ("dev", "test"):
        examples = getattr(splits, split)
        extra = labels_of(examples) - train if examples else set()
        if extra:
            where = (names or {}).get(split, split)
            raise ArgumentError(f"the {split} split ({where}) has label(s) {sorted(extra)} that the train split does "
                             f"not have; train labels: {sorted(train)}")
