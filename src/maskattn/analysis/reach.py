"""How much of a pretrained cross-encoder's attention crosses between the two sentences of a pair, and how
far it reaches.

A cross-encoder reads a pair as one sequence, ``[CLS] premise [SEP] hypothesis [SEP]``. A local mechanism
keeps each query's attention within ``reach`` positions (CSAN's window of ``M + 1`` positions: ``reach =
M / 2``, Yang et al. 2019 Eq. 4; SMAN: ``|t − s| <= radius``, Fan et al. 2021 Eq. 11), so in the layers it
replaces, most hypothesis word pieces lose sight of the premise. This module measures, in the unchanged
model, how much attention that is: per layer, the attention that second-sentence word pieces give
first-sentence word pieces (special tokens excluded on both sides), averaged over heads and queries, and the
part of it beyond ``reach`` positions. docs/results.md reads the SNLI fine-tuning results with it.

Needs the ``hf`` extra (``pip install 'maskattn[hf]'``), like :mod:`maskattn.hf`, which it uses to load the model;
``import maskattn.analysis`` does not import it.

    python -m maskattn.analysis.reach --data ../shared/data/snli/dev.jsonl --limit 400 --reach 4,5
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..data.readers import read_nli_jsonl
from ..hf import load_encoder
from ..models.pretrained import resolve_pretrained

__all__ = ["cross_attention_reach", "measure_reach", "main"]


def cross_attention_reach(probs: torch.Tensor, segments: torch.Tensor,
                          reaches: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of second-sentence queries on first-sentence keys, in all and beyond each reach.

    Args:
        probs: ``(layers, heads, n, n)`` attention probabilities of one pair (row ``i``: query ``i``).
        segments: ``(n,)`` 0 at first-sentence word pieces, 1 at second-sentence ones, -1 at special tokens.
        reaches: reaches ``R`` of local mechanisms, which keep ``|i − j| <= R``.

    Returns:
        ``(cross, beyond)``: ``(layers,)``, the attention mass second-sentence queries put on first-sentence
        keys (mean over heads and queries), and ``(len(reaches), layers)``, the part of it at ``|i − j| > R``.
    """
    if probs.dim() != 4 or probs.shape[-1] != probs.shape[-2] or probs.shape[-1] != segments.numel():
        raise ArgumentError(f"probs must be (layers, heads, n, n) with n = {segments.numel()} segment ids, "
                         f"got {tuple(probs.shape)}")
    queries, keys = segments == 1, segments == 0
    if not queries.any() or not keys.any():
        raise ArgumentError("segments must mark word pieces of both sentences (0 and 1), "
                         f"got {segments.tolist()}")
    position = torch.arange(segments.numel(), device=probs.device)
    distance = (position[:, None] - position[None, :]).abs()[queries]  # (second-sentence queries, n)
    on_first = probs[:, :, queries] * keys  # (layers, heads, second-sentence queries, n)
    cross = on_first.sum(-1).mean((1, 2))
    beyond = torch.stack([(on_first * (distance > reach)).sum(-1).mean((1, 2)) for reach in reaches])
    return cross, beyond


@torch.no_grad()
def measure_reach(model, tokenizer, pairs: Sequence[tuple[str, str]], reaches: Sequence[int], *,
                  max_len: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over ``pairs`` of :func:`cross_attention_reach`: ``(cross, beyond)``, ``(layers,)`` and
    ``(len(reaches), layers)``. ``model`` must return attention probabilities (load it with
    ``attn_implementation="eager"``); ``tokenizer`` must be a fast tokenizer (its ``sequence_ids`` tell the
    sentences apart, for BERT and for RoBERTa alike)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ArgumentTypeError(f"tokenizer must be a fast (tokenizers-backed) tokenizer, got {type(tokenizer).__name__}")
    if not pairs:
        raise ArgumentError("pairs is empty; expected at least one (premise, hypothesis) pair")
    model.eval()
    totals: list[tuple[torch.Tensor, torch.Tensor]] = []
    for premise, hypothesis in pairs:
        encoded = tokenizer(premise, hypothesis, truncation="longest_first", max_length=max_len, return_tensors="pt")
        segments = torch.tensor([-1 if s is None else s for s in encoded.sequence_ids(0)])
        attentions = model(**encoded, output_attentions=True).attentions
        if not attentions or attentions[0] is None:
            raise ArgumentError("the model returned no attention probabilities; load it with "
                             "attn_implementation='eager' (a converted layer does not return them)")
        probs = torch.cat(attentions).float()  # (layers, heads, n, n): batch of one
        cross, beyond = cross_attention_reach(probs, segments, reaches)
        totals.append((cross, beyond))
    return (torch.stack([c for c, _ in totals]).mean(0),  # (layers,)
            torch.stack([b for _, b in totals]).mean(0))  # (len(reaches), layers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m maskattn.analysis.reach", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="NLI JSON lines (premise, hypothesis, label)")
    parser.add_argument("--model", default="all-MiniLM-L6-v2",
                        help="a local model folder, or all-MiniLM-L6-v2 from the installed package")
    parser.add_argument("--limit", type=int, default=400, help="the first LIMIT pairs of the file")
    parser.add_argument("--reach", default="5", help="comma-separated reaches, e.g. 4,5")
    parser.add_argument("--max-len", type=int, default=128, help="tokens per pair, special tokens included")
    args = parser.parse_args(argv)
    try:
        reaches = [int(r) for r in args.reach.split(",")]
    except ValueError:
        parser.error(f"--reach must be comma-separated integers, got {args.reach!r}")
    if args.limit < 1 or any(r < 0 for r in reaches):
        parser.error("--limit must be >= 1 and every --reach >= 0")
    pairs = [(" ".join(e.premise), " ".join(e.hypothesis)) for e in read_nli_jsonl(args.data)[:args.limit]]
    model, tokenizer = load_encoder(resolve_pretrained(args.model), attn_implementation="eager")
    cross, beyond = measure_reach(model, tokenizer, pairs, reaches, max_len=args.max_len)
    print(f"{len(pairs)} pairs of {args.data}; attention of second-sentence word pieces (mean over heads and queries)")
    print("| layer | on first-sentence word pieces | " + " | ".join(f"of it beyond ±{r}" for r in reaches) + " |")
    print("|---:|---:|" + "---:|" * len(reaches))
    for layer, mass in enumerate(cross.tolist()):
        shares = [(beyond[i, layer].item() / mass if mass else float("nan")) for i in range(len(reaches))]
        print(f"| {layer} | {100 * mass:.1f} % | " + " | ".join(f"{100 * share:.0f} %" for share in shares) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
