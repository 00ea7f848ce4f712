"""Tiny transformers encoders built from a config, and inputs with padding, for the maskattn.hf tests."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from transformers import BertConfig, BertTokenizer, CamembertConfig, ElectraConfig, RobertaConfig, XLMRobertaConfig
from transformers import AutoModel

from maskattn.hf import ConversionWarning, convert

VOCAB = 60
PAD = 1  # RoBERTa's padding id; BERT's tiny config below uses it too
CONFIGS = {"bert": BertConfig, "roberta": RobertaConfig, "xlm-roberta": XLMRobertaConfig,
           "camembert": CamembertConfig, "electra": ElectraConfig}


def tiny_config(arch: str = "bert", *, layers: int = 2, heads: int = 4, hidden: int = 32,
                attention_dropout: float = 0.0, **extra):
    return CONFIGS[arch](vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=64, max_position_embeddings=40, pad_token_id=PAD,
                         attention_probs_dropout_prob=attention_dropout, hidden_dropout_prob=0.0, **extra)


def tiny_model(arch: str = "bert", seed: int = 0, **config):
    """A randomly initialised encoder in eval mode (``AutoModel`` of ``tiny_config(arch, **config)``)."""
    torch.manual_seed(seed)
    return AutoModel.from_config(tiny_config(arch, **config)).eval()


def converted(model, *conversions: dict):
    """A deep copy of ``model`` with each ``{"mechanism": ..., "layers": ..., **options}`` applied; the
    ConversionWarnings of the local mechanisms are silenced (tests that check them ask for them)."""
    model = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)
        for spec in conversions:
            convert(model, **spec)
    return model


def batch(lengths=(12, 8, 3), seed: int = 1):
    """``(input_ids, attention_mask)`` right-padded to the longest length, ``attention_mask`` 1 = token."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), n), generator=g)
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def hidden(model, ids, mask=None) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask).last_hidden_state


def max_diff_at_tokens(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest absolute difference of two ``(B, n, d)`` outputs at the real tokens (``mask`` 1)."""
    return (a - b)[mask.bool()].abs().max().item()


def save_with_tokenizer(model, folder: Path) -> Path:
    """``model.save_pretrained(folder)`` plus a word-piece tokenizer over the tiny vocabulary."""
    model.save_pretrained(folder)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(VOCAB - 5)]) + "\n")
    BertTokenizer(str(vocab)).save_pretrained(folder)
    return folder
