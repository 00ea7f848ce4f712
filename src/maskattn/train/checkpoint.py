"""Checkpoints: one safetensors file per checkpoint, written atomically.

Layout of ``*.safetensors``:

* tensors ``model.<name>`` — the model's ``state_dict``;
* tensors ``optim.<param>.<key>`` and ``rng.*`` — optimiser state and RNG states (only in resumable
  checkpoints, e.g. ``last.safetensors``);
* string metadata: ``format`` (``maskattn-checkpoint/1``), ``config`` (the full resolved run
  configuration, JSON), ``vocab`` and ``labels`` (JSON lists), ``model_type``, ``step``, ``extra`` (JSON:
  what the task needs to feed the model text — for translation the subword model, base64 — and a
  fingerprint of the training data) and ``trainer`` (JSON: epoch, position in the epoch, best metric,
  scheduler state, optimiser hyper-parameters, the Python / NumPy RNG states).

Writing goes to a temporary file in the same directory, which is flushed and ``fsync``-ed and then
``os.replace``-d over the target (and the directory is ``fsync``-ed), so a kill at any moment leaves either
the previous checkpoint or the new one, never a partial file.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

__all__ = ["FORMAT", "Checkpoint", "atomic_write_bytes", "save_checkpoint", "load_checkpoint", "capture_rng",
           "restore_rng", "optimizer_to_flat", "optimizer_from_flat"]

FORMAT = "maskattn-checkpoint/1"


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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --- RNG and optimiser state ------------------------------------------------------------------------

def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, JSON) holding the torch (CPU and CUDA), Python and NumPy RNG states."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(keys.astype(np.int64))
    return tensors, {"python": [version, list(mt), gauss], "numpy": [kind, int(pos), int(has_gauss), float(cached)]}


def restore_rng(tensors: dict[str, torch.Tensor], state: dict) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimiser ``state_dict`` into safetensors tensors and a JSON structure."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# --- save / load --------------------------------------------------------------------------------------

def save_checkpoint(path: str | Path, *, model: torch.nn.Module, config: dict, vocab: list[str], labels: list[str],
                    model_type: str, step: int, trainer: dict | None = None,
                    extra_tensors: dict[str, torch.Tensor] | None = None, extra: dict | None = None) -> Path:
    """Write a checkpoint atomically; ``trainer`` / ``extra_tensors`` make it resumable; ``extra``: JSON data
    of the task (stored as metadata)."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update(extra_tensors or {})
    metadata = {"format": FORMAT, "config": json.dumps(config), "vocab": json.dumps(vocab),
                "labels": json.dumps(labels), "model_type": model_type, "step": str(step),
                "extra": json.dumps(extra or {})}
    if trainer is not None:
        metadata["trainer"] = json.dumps(trainer)
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata=metadata))
    return Path(path)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint; a missing file, a file that is not safetensors or not a maskattn checkpoint
    raise ``ValueError`` saying so."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"checkpoint {path} is not a readable safetensors file ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path} is not a maskattn checkpoint (format {metadata.get('format')!r}, expected {FORMAT!r})")
    model_state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    extra_tensors = {k: v for k, v in tensors.items() if not k.startswith("model.")}
    trainer = json.loads(metadata["trainer"]) if "trainer" in metadata else None
    return Checkpoint(path, model_state, json.loads(metadata["config"]), json.loads(metadata["vocab"]),
                      json.loads(metadata["labels"]), metadata["model_type"], int(metadata["step"]), trainer,
                      extra_tensors, json.loads(metadata.get("extra", "{}")))
