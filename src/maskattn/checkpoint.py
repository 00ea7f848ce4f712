"""The checkpoint file format, and reading it: one ``.safetensors`` file per checkpoint.

Layout (the writer is :func:`maskattn.train.checkpoint.save_checkpoint`):

* tensors ``model.<name>`` — the model's ``state_dict``;
* tensors ``optim.<param>.<key>``, ``rng.*`` and ``ema.*`` — optimiser state, RNG states and the weight
  average (only in resumable checkpoints, e.g. ``last.safetensors``);
* string metadata: ``format`` (``maskattn-checkpoint/1``), ``config`` (the full resolved run configuration,
  JSON), ``vocab`` and ``labels`` (JSON lists), ``model_type``, ``step``, ``extra`` (JSON: what the task needs
  to feed the model text — for translation the subword model, base64 — and a fingerprint of the training
  data), ``trainer`` (JSON, resumable checkpoints: epoch, position in the epoch, best metric, scheduler
  state, optimiser hyper-parameters, the Python / NumPy RNG states, the train loss summed since the last train
  row) and ``sha256``.

``sha256`` is the checksum of everything else in the file: the safetensors header without the ``sha256``
entry (as canonical JSON: sorted keys, no spaces) followed by the tensor data. :func:`load_checkpoint`
recomputes it, streaming the file, before it loads anything, so a flipped bit anywhere in the tensor data,
the tensor table or the metadata is a :class:`~maskattn.errors.CheckpointError` naming the file. Checkpoints
written before checksums existed have no ``sha256``: they load with an
:class:`~maskattn.errors.UnverifiedCheckpointWarning` (once per file and process).
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file

from .errors import CheckpointError, UnverifiedCheckpointWarning
from .sections import is_sections, shown

__all__ = ["FORMAT", "CHECKSUM_KEY", "Checkpoint", "load_checkpoint", "load_weights", "content_digest",
           "read_header", "checkpoint_in_folder"]

FORMAT = "maskattn-checkpoint/1"
CHECKSUM_KEY = "sha256"  # metadata entry holding the checksum of the rest of the file
_CHUNK = 1 << 20  # bytes hashed at a time while streaming a file
_warned_unverified: set[str] = set()


@dataclass
class Checkpoint:
    """A loaded checkpoint: model weights, the run config (dict), vocabulary and labels, the step, the
    task's ``extra`` data (e.g. the subword model), and — for resumable checkpoints — the trainer state and
    its tensors."""

    path: Path
    model_state: dict[str, torch.Tensor]
    config: dict
    vocab: list[str]
    labels: list[str]
    model_type: str
    step: int
    trainer: dict | None
    extra_tensors: dict[str, torch.Tensor]
    extra: dict = field(default_factory=dict)


def content_digest(header: dict, data_chunks: Iterable[bytes | memoryview]) -> str:
    """sha256 (hex) of a safetensors file's content: its ``header`` (a parsed safetensors header; a
    ``sha256`` metadata entry is left out) as canonical JSON, then the tensor data, given in chunks."""
    metadata = {k: v for k, v in header.get("__metadata__", {}).items() if k != CHECKSUM_KEY}
    canonical = {**header, "__metadata__": metadata}
    digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode("utf-8"))
    for chunk in data_chunks:
        digest.update(chunk)
    return digest.hexdigest()


def read_header(path: Path) -> tuple[dict, int]:
    """The parsed safetensors header of ``path`` and the byte offset where its tensor data starts;
    ``CheckpointError`` when the file is not a safetensors file."""
    try:
        with path.open("rb") as f:
            prefix = f.read(8)
            size = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < size <= path.stat().st_size - 8:
                raise CheckpointError(f"checkpoint {path} is not a readable safetensors file (no valid header; "
                                      "an empty or truncated file?)")
            header = json.loads(f.read(size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file (damaged header: {exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file (its header is not a JSON object)")
    return header, 8 + size


def _file_chunks(path: Path, start: int) -> Iterable[bytes]:
    with path.open("rb") as f:
        f.seek(start)
        while chunk := f.read(_CHUNK):
            yield chunk


def _verify(path: Path, header: dict, data_start: int) -> None:
    """Compare the stored checksum with the file's content (warn once for a checkpoint without one)."""
    stored = header.get("__metadata__", {}).get(CHECKSUM_KEY)
    if stored is None:
        if str(path.resolve()) not in _warned_unverified:
            _warned_unverified.add(str(path.resolve()))
            warnings.warn(f"checkpoint {path} has no checksum (written by maskattn before checksums existed): "
                          "it loads, but damage to it cannot be detected", UnverifiedCheckpointWarning, stacklevel=3)
        return
    actual = content_digest(header, _file_chunks(path, data_start))
    if actual != stored:
        raise CheckpointError(f"checkpoint {path} is damaged: its content does not match the sha256 checksum "
                              f"stored when it was written ({stored[:12]}…, now {actual[:12]}…); use another copy "
                              "(an earlier checkpoint, or best.safetensors / last.safetensors of the run)")


def _held(folder: Path) -> str:
    """The checkpoints a folder holds (and its folds' best ones), for a message."""
    found = sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())
    found += sorted(f"{p.parent.name}/{p.name}" for p in folder.glob("*/best.safetensors"))
    if not found:
        return "it holds no .safetensors checkpoint"
    return "it holds " + ", ".join(found[:8]) + (", …" if len(found) > 8 else "") + "; pass one of them"


def _folder_message(folder: Path) -> str:
    """What to say when a folder is given where a checkpoint file is expected: the checkpoints inside it."""
    return f"checkpoint {folder} is a folder, not a checkpoint file: {_held(folder)}"


def checkpoint_in_folder(folder: str | Path, name: str = "best.safetensors") -> Path:
    """The checkpoint ``name`` of a run folder (``best.safetensors``: the model the run kept); a folder without
    it raises :class:`CheckpointError` naming the checkpoints it holds."""
    folder = Path(folder)
    if not (folder / name).is_file():
        raise CheckpointError(f"checkpoint {folder} is a folder without {name}: {_held(folder)}")
    return folder / name


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read and verify a checkpoint. A missing file, a file that is not safetensors, not a maskattn
    checkpoint, or whose content does not match its checksum raises :class:`CheckpointError` naming it."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(_folder_message(path))
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    header, data_start = read_header(path)
    metadata = header.get("__metadata__") or {}
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a maskattn checkpoint (format {metadata.get('format')!r}, "
                              f"expected {FORMAT!r})")
    _verify(path, header, data_start)
    try:
        tensors = load_file(str(path))
    except SafetensorError as exc:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file ({exc})") from None
    model_state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    extra_tensors = {k: v for k, v in tensors.items() if not k.startswith("model.")}
    fields = _read_metadata(path, metadata)
    return Checkpoint(path, model_state, fields["config"], fields["vocab"], fields["labels"], fields["model_type"],
                      fields["step"], fields["trainer"], extra_tensors, fields["extra"])


def _is_names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_trainer(value: object) -> bool:
    return (isinstance(value, dict) and all(_is_count(value.get(key)) for key in ("epoch", "position", "bad_evals"))
            and all(isinstance(value.get(key), dict) for key in ("rng", "optimizer", "scheduler"))
            and (value.get("best_step") is None or _is_count(value.get("best_step")))
            and (value.get("best_metric") is None or isinstance(value.get("best_metric"), (int, float)))
            and (value.get("window") is None or _is_window(value["window"])))


def _is_window(value: object) -> bool:
    """The train loss summed since the last train row, and over how many steps."""
    return isinstance(value, dict) and isinstance(value.get("loss"), (int, float)) and _is_count(value.get("steps"))


#: the metadata entries of a checkpoint: (is JSON, what the value must be, its description, default when absent)
_METADATA: dict[str, tuple[bool, Callable[[object], bool], str, str | None]] = {
    "config": (True, is_sections, "a JSON object of config sections (data, model, optim, train)", None),
    "vocab": (True, _is_names, "a JSON list of strings", None),
    "labels": (True, _is_names, "a JSON list of strings", None),
    "model_type": (False, lambda v: isinstance(v, str) and bool(v), "a model type such as sentence", None),
    "step": (False, lambda v: isinstance(v, str) and re.fullmatch(r"[0-9]{1,18}", v) is not None,
             "a step count (an int >= 0)", None),
    "extra": (True, lambda v: isinstance(v, dict), "a JSON object", "{}"),
    "trainer": (True, _is_trainer, "a JSON object with the trainer's epoch, position, best metric and step, bad "
                "evaluations, the running train loss, and its rng, optimizer and scheduler states", "null"),
}


def _read_metadata(path: Path, metadata: dict[str, str]) -> dict:
    """The checkpoint's metadata entries parsed and checked (:data:`_METADATA`): a missing, unreadable or
    misshapen one is a :class:`CheckpointError` naming the file and the entry (hand-edited metadata loses its
    checksum, so only these checks stand between it and the code that reads it)."""
    fields: dict = {}
    for key, (is_json, accepts, description, default) in _METADATA.items():
        if key not in metadata and default is None:
            raise CheckpointError(f"checkpoint {path}: its metadata has no {key!r} entry; not a checkpoint maskattn "
                                  "wrote, or one edited since")
        text = metadata.get(key, default)
        assert text is not None  # an absent entry without a default was refused above
        try:
            value: object = json.loads(text) if is_json else text
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"checkpoint {path}: metadata entry {key!r} is not JSON ({exc.msg} at character "
                                  f"{exc.pos}); the file was edited or damaged") from None
        if not (value is None and key == "trainer") and not accepts(value):
            raise CheckpointError(f"checkpoint {path}: metadata entry {key!r} must be {description}, got "
                                  f"{shown(value)}; the file was edited or damaged")
        fields[key] = int(text) if key == "step" else value
    return fields


def load_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Load a checkpoint's weights strictly; a checkpoint of another model raises :class:`CheckpointError`."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ckpt.model_state))
    unexpected = sorted(set(ckpt.model_state) - set(expected))
    shapes = [k for k in expected if k in ckpt.model_state and expected[k].shape != ckpt.model_state[k].shape]
    if missing or unexpected or shapes:
        detail = "; ".join(part for part in (
            f"missing {missing[:3]}" if missing else "", f"unexpected {unexpected[:3]}" if unexpected else "",
            f"shape mismatch {[(k, tuple(ckpt.model_state[k].shape), tuple(expected[k].shape)) for k in shapes[:3]]}"
            if shapes else "") if part)
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit this model (another model or vocabulary?): "
                              f"{detail}")
    model.load_state_dict(ckpt.model_state)
