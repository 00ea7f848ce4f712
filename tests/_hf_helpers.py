"""Tiny transformers encoders built from a config, and inputs with padding, for the maskattn.hf tests."""

from __future__ import annotations

import contextlib
import copy
import socket
import warnings
from pathlib import Path

import huggingface_hub.constants
import pytest
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


@contextlib.contextmanager
def offline():
    """The hub client is offline (HF_HUB_OFFLINE=1) and every connection attempt fails and is recorded in
    the yielded list, which must be empty at the end — even if the caller swallowed the error."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError(f"network access attempted: {args!r}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield attempts
    assert attempts == []


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


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def save_tiny_pretrained(folder: Path, words, *, layers: int = 2, heads: int = 4, hidden: int = 32,
                         seed: int = 0, dropout: float = 0.1) -> Path:
    """A tiny random BERT and its WordPiece tokenizer (built with ``tokenizers``: lowercasing BERT
    normaliser, BERT pre-tokeniser, ``[CLS] A [SEP] B [SEP]`` pairs with segment ids) saved to ``folder`` as a
    pretrained model folder (``config.json``, ``model.safetensors``, ``tokenizer.json``)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + sorted(set(words)))}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=2 * hidden, max_position_embeddings=40, pad_token_id=vocab["[PAD]"],
                        attention_probs_dropout_prob=dropout, hidden_dropout_prob=dropout)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
