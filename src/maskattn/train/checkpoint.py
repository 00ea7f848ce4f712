"""Writing checkpoints (the format and the reader: :mod:`maskattn.checkpoint`), and the trainer state a
resumable checkpoint carries: RNG states and the optimiser state as safetensors tensors plus JSON.

A checkpoint is written once, with its ``sha256`` checksum in the metadata, through
:func:`~maskattn.files.atomic_write`: a kill at any moment leaves the previous file or the new one, and
a failed write (disk full) leaves the previous file and raises ``OSError`` naming the path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import cast

import numpy as np
import torch
from safetensors.torch import save as safetensors_bytes

from ..checkpoint import CHECKSUM_KEY, FORMAT, content_digest
from ..files import atomic_write

__all__ = ["save_checkpoint", "capture_rng", "restore_rng", "optimizer_to_flat", "optimizer_from_flat"]


# --- RNG and optimiser state ------------------------------------------------------------------------

def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, JSON) holding the torch (CPU and CUDA), Python and NumPy RNG states."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
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


# --- save ------------------------------------------------------------------------------------------

def _with_checksum(serialized: bytes) -> list[bytes | memoryview]:
    """The chunks of a safetensors file whose header carries the ``sha256`` of the rest of the file (see
    :mod:`maskattn.checkpoint`). The tensor data is passed through unchanged; the header is padded with
    spaces to a multiple of 8 bytes, as safetensors aligns it."""
    size = int.from_bytes(serialized[:8], "little")
    header = json.loads(serialized[8:8 + size])
    data = memoryview(serialized)[8 + size:]
    header.setdefault("__metadata__", {})[CHECKSUM_KEY] = content_digest(header, [data])
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    return [len(encoded).to_bytes(8, "little"), encoded, data]


def save_checkpoint(path: str | Path, *, model: torch.nn.Module, config: dict, vocab: list[str], labels: list[str],
                    model_type: str, step: int, trainer: dict | None = None,
                    extra_tensors: dict[str, torch.Tensor] | None = None, extra: dict | None = None) -> Path:
    """Write a checkpoint atomically, with its checksum; ``trainer`` / ``extra_tensors`` make it resumable;
    ``extra``: JSON data of the task (stored as metadata)."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update(extra_tensors or {})
    metadata = {"format": FORMAT, "config": json.dumps(config), "vocab": json.dumps(vocab),
                "labels": json.dumps(labels), "model_type": model_type, "step": str(step),
                "extra": json.dumps(extra or {})}
    if trainer is not None:
        metadata["trainer"] = json.dumps(trainer)
    return atomic_write(path, _with_checksum(safetensors_bytes(tensors, metadata=metadata)))
