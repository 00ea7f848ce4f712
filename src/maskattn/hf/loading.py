"""``load_encoder``: a local transformers model folder, offline, with its maskattn conversions restored."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoTokenizer

from ..errors import ArgumentError, ArgumentTypeError
from .convert import CONVERSIONS_KEY, ConversionWarning, convert
from .options import describe

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")


def check_model_folder(path) -> Path:
    """``path`` as a Path after checking it holds ``config.json``, weights and a tokenizer; the error names
    everything that is missing."""
    if not isinstance(path, (str, Path)):
        raise ArgumentTypeError(f"path must be a str or Path of a local model folder, got {describe(path)}")
    folder = Path(path)
    if not folder.is_dir():
        raise ArgumentError(f"{str(path)!r} is not a folder; expected a local model folder (config.json, weights, "
                         "tokenizer) — maskattn.hf never downloads")
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        missing.append(f"weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"a tokenizer (one of {', '.join(TOKENIZER_FILES)})")
    if missing:
        raise ArgumentError(f"{str(folder)!r} is not a model folder: missing {'; '.join(missing)}")
    return folder


#: a parameter held by ``attention.self`` itself — the original modules hold theirs in ``query``/``key``/``value``,
#: so these are exactly the parameters the conversions added
_CONVERTED_PARAMETER = re.compile(r"(^|\.)attention\.self\.[^.]+$")


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ArgumentError(f"{str(folder)!r} records maskattn conversions but has no safetensors weights "
                         "(model.safetensors or model.safetensors.index.json); save it with save_pretrained")
    return {name: tensor for file in files for name, tensor in load_file(folder / file).items()}


def _load_converted(model_class, folder: Path, records: list[dict], kwargs: dict):
    """Load the plain architecture from the weights without the conversions' parameters, replay the
    conversions and load their parameters (so transformers never reports them as unexpected keys)."""
    config, model_kwargs = AutoConfig.from_pretrained(folder, local_files_only=True, return_unused_kwargs=True,
                                                      **kwargs)
    with torch.device("meta"):  # the concrete class an Auto class builds for this config, without weights
        concrete = type(model_class.from_config(config))
    state = _read_safetensors(folder)
    added = {name: state.pop(name) for name in list(state) if _CONVERTED_PARAMETER.search(name)}
    model = concrete.from_pretrained(None, config=config, state_dict=state, **model_kwargs)
    setattr(model.config, CONVERSIONS_KEY, [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)  # the outputs were meant to change when converted
        for record in records:
            convert(model, **record)
    prefix = model.base_model_prefix
    for name, param in model.named_parameters():
        if not _CONVERTED_PARAMETER.search(name):
            continue
        stored = next((c for c in (name, name.removeprefix(f"{prefix}."), f"{prefix}.{name}") if c in added), None)
        if stored is None:
            raise ArgumentError(f"{str(folder)!r} records maskattn conversions but its weights lack {name!r}; was the "
                             "model saved after convert?")
        with torch.no_grad():
            param.copy_(added.pop(stored))
    if added:
        raise ArgumentError(f"{str(folder)!r} holds maskattn parameters that its recorded conversions do not create: "
                         f"{sorted(added)}")
    return model


def load_encoder(path, model_class=None, **from_pretrained_kwargs):
    """Load a transformers encoder and its tokenizer from a local folder, offline.

    Args:
        path: a folder holding ``config.json``, weights and a tokenizer (checked first; nothing is
            downloaded: ``local_files_only=True``).
        model_class: the transformers class to load (default ``AutoModel``; e.g.
            ``AutoModelForSequenceClassification``).
        **from_pretrained_kwargs: passed to ``model_class.from_pretrained`` (e.g. ``num_labels=2``).

    Returns:
        ``(model, tokenizer)``. If the folder was saved from a converted model (``config.json`` lists
        ``maskattn_conversions``), the conversions are replayed and their parameters loaded from the
        safetensors weights, so the model is the one that was saved (a plain ``from_pretrained`` would drop
        them as unexpected keys).
    """
    folder = check_model_folder(path)
    model_class = AutoModel if model_class is None else model_class
    records = getattr(AutoConfig.from_pretrained(folder, local_files_only=True), CONVERSIONS_KEY, None)
    if records:
        model = _load_converted(model_class, folder, records, from_pretrained_kwargs)
    else:
        model = model_class.from_pretrained(folder, local_files_only=True, **from_pretrained_kwargs)
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)
