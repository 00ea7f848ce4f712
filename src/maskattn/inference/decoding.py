"""Decoding for :class:`~maskattn.models.seq2seq.Seq2Seq`: greedy search and beam search over the
model's incremental :meth:`~maskattn.models.seq2seq.Seq2Seq.decode_step`.

Both run the model in eval mode without gradients (the previous mode is restored), encode the source
once, start every hypothesis with ``bos_id`` and return, per source row, token ids without BOS and EOS.
``pad_id`` and ``bos_id`` (unless it doubles as ``eos_id``) are never generated.

Output length: at most ``max_len`` tokens before EOS; by default ``floor(max_len_a · src_len + max_len_b)``
with ``src_len`` each row's own length without padding (fairseq's ``--max-len-a/--max-len-b``), capped by
the model's positional range (:attr:`Seq2Seq.max_target_tokens` = ``max_len − 1`` of the model). When a
hypothesis reaches its limit, EOS is its only allowed next token. An explicit ``max_len`` beyond the
model's range raises ValueError. ``min_len`` (fairseq's ``--min-len``, HF's ``min_length``): EOS is banned
until a hypothesis has ``min_len`` tokens (a row whose limit is lower still ends at its limit).

Repeated n-grams (``no_repeat_ngram_size`` n, fairseq's ``--no-repeat-ngram-size`` and HF's option; Paulus
et al. 2018's trigram blocking with n = 3): a token that would complete an n-gram of output tokens already in
the hypothesis is banned (its log-probability is −inf) — so no hypothesis holds an n-gram twice. The n-grams
are of the model's tokens (subwords), as in fairseq. A hypothesis left with no allowed token ends (EOS).

Beam search (Wu et al. 2016, GNMT §7; fairseq's search): all sentences × beams run as one batch. Each step
expands every live beam, takes the ``2·beam_size`` best continuations per sentence, moves those ending in
EOS among the best ``beam_size`` to the sentence's finished list and continues with the ``beam_size`` best
others. A sentence is done when it has ``beam_size`` finished hypotheses (or no live beam); done sentences
leave the batch. Finished hypotheses are ranked by ``log P(Y|X) / lp(Y)``, ``|Y|`` counting EOS, with
``length_penalty_kind``

* ``"gnmt"`` (the default): ``lp(Y) = ((5 + |Y|) / 6) ** α`` (Wu et al. 2016, Eq. 14), or
* ``"fairseq"``: ``lp(Y) = |Y| ** α`` (fairseq's ``--lenpen``, also HF ``generate``'s ``length_penalty``; MAN's
  summarization decodes with α = 1.0 on Gigaword, 2.0 on CNN/DM),

``α = length_penalty``: 0 ranks by log-probability, larger values favour longer outputs.

Memory: before the first step, both searches estimate what decoding the batch holds (:func:`decoding_memory_bytes`:
the encoder's output and every decoder layer's keys and values for ``batch × beam`` hypotheses of the longest output
allowed, and the scores over the vocabulary of each step) and refuse an estimate over the budget
(:func:`maskattn.device.check_memory`) with the :class:`~maskattn.errors.MemoryLimitError` a batch gets — never
an allocation that fails half-way (``generate --beam 100000``).

:class:`DecodingOptions` holds one choice of all these options (and runs the search it describes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, cast

import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_int_at_least, describe
from ..models.seq2seq import Seq2Seq

__all__ = ["greedy_decode", "beam_search", "Hypothesis", "length_penalty_factor", "DecodingOptions",
           "LENGTH_PENALTIES", "decoding_memory_bytes"]

#: the kinds of length penalty (module docstring)
LENGTH_PENALTIES = ("gnmt", "fairseq")


class Hypothesis(NamedTuple):
    """A finished beam-search hypothesis: ``tokens`` (without BOS/EOS), ``score`` = ``log_prob / lp``
    (the ranking key) and ``log_prob`` = ``log P(tokens, EOS | source)``."""

    tokens: list[int]
    score: float
    log_prob: float


def length_penalty_factor(length: int, alpha: float, kind: str = "gnmt") -> float:
    """The divisor of a hypothesis' log-probability: GNMT's ``((5 + length) / 6) ** alpha`` (Wu et al. 2016,
    Eq. 14) or, with ``kind="fairseq"``, ``length ** alpha`` (``length`` counts EOS)."""
    if kind == "fairseq":
        return float(length) ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def _check_search(*, length_penalty: float = 0.0, length_penalty_kind: str = "gnmt", min_len: int = 0,
                  max_len: int | None = None, no_repeat_ngram_size: int = 0) -> None:
    """The checks of the search options (``max_len`` itself is checked against the model by ``_limits``)."""
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise ArgumentTypeError(f"length_penalty must be a number >= 0 (α), got {describe(length_penalty)}")
    if not (math.isfinite(length_penalty) and length_penalty >= 0):
        raise ArgumentError(f"length_penalty must be a finite number >= 0 (α), got {length_penalty}")
    if length_penalty_kind not in LENGTH_PENALTIES:
        raise ArgumentError(f"unknown length_penalty_kind {length_penalty_kind!r}; expected one of "
                            f"{', '.join(LENGTH_PENALTIES)}")
    check_int_at_least(min_len, "min_len", 0)
    if isinstance(max_len, int) and not isinstance(max_len, bool) and 0 <= max_len < min_len:
        raise ArgumentError(f"min_len {min_len} is larger than max_len {max_len}")
    check_int_at_least(no_repeat_ngram_size, "no_repeat_ngram_size", 0)


@dataclass(frozen=True)
class DecodingOptions:
    """How a :class:`~maskattn.models.seq2seq.Seq2Seq` turns a source into an output (module docstring), with the
    names fairseq-generate and HF ``generate`` users know: ``beam`` (1 = greedy), ``length_penalty`` α and its
    ``length_penalty_kind`` (``gnmt`` or ``fairseq``), ``min_len`` and ``max_len`` (output tokens before EOS;
    ``max_len`` None: ``⌊1.2 · source length + 10⌋``, capped by the model) and ``no_repeat_ngram_size`` (0 = off).
    Checked when built; :meth:`search` runs it."""

    beam: int = 5
    length_penalty: float = 0.6
    length_penalty_kind: str = "gnmt"
    min_len: int = 0
    max_len: int | None = None
    no_repeat_ngram_size: int = 0

    def __post_init__(self) -> None:
        check_int_at_least(self.beam, "beam", 1)
        if self.max_len is not None:
            check_int_at_least(self.max_len, "max_len", 0)
        _check_search(length_penalty=self.length_penalty, length_penalty_kind=self.length_penalty_kind,
                      min_len=self.min_len, max_len=self.max_len, no_repeat_ngram_size=self.no_repeat_ngram_size)

    #: the ``train`` section's keys of each option (a run's decoding settings, saved in its checkpoints)
    CONFIG_KEYS = {"length_penalty": "length_penalty", "length_penalty_kind": "length_penalty_kind",
                   "min_len": "min_output_len", "max_len": "max_output_len",
                   "no_repeat_ngram_size": "no_repeat_ngram_size"}

    @classmethod
    def from_config(cls, train: Mapping, split: str = "test") -> DecodingOptions:
        """The options a run's ``train`` section (a mapping, e.g. a checkpoint's) sets for decoding ``split``:
        beam ``eval_beam`` on dev, ``test_beam`` otherwise; keys it lacks keep their defaults."""
        beam_key = "eval_beam" if split == "dev" else "test_beam"
        values = {field: train[key] for field, key in cls.CONFIG_KEYS.items() if key in train}
        return cls(**({"beam": train[beam_key]} if beam_key in train else {}), **values)

    def replace(self, **changes) -> DecodingOptions:
        """These options with ``changes`` (keys: the field names; a value None keeps the option, so that unset
        command-line flags change nothing); an unknown key raises ArgumentTypeError."""
        changes = {k: v for k, v in changes.items() if v is not None}
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise ArgumentTypeError(f"unknown decoding option(s) {', '.join(unknown)}; expected some of {', '.join(names)}")
        return dataclasses.replace(self, **changes)

    def search(self, model: Seq2Seq, src_ids: torch.Tensor, *, bos_id: int, eos_id: int) -> list[list[int]]:
        """The output of each source row of ``src_ids`` ``(B, S)`` as token ids without BOS/EOS: greedy search
        for ``beam`` 1, else the best hypothesis of beam search."""
        if self.beam == 1:
            return greedy_decode(model, src_ids, bos_id=bos_id, eos_id=eos_id, max_len=self.max_len,
                                 min_len=self.min_len, no_repeat_ngram_size=self.no_repeat_ngram_size)
        return cast(list[list[int]], beam_search(
            model, src_ids, beam_size=self.beam, length_penalty=self.length_penalty,
            length_penalty_kind=self.length_penalty_kind, bos_id=bos_id, eos_id=eos_id, max_len=self.max_len,
            min_len=self.min_len, no_repeat_ngram_size=self.no_repeat_ngram_size))  # the best of each beam


@contextmanager
def _inference(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _check_token(value, name: str, model: Seq2Seq) -> int:
    V = model.tgt_vocab_size
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int token id, got {describe(value)}")
    if not 0 <= value < V:
        raise ArgumentError(f"{name} must be a target id in [0, {V - 1}], got {value}")
    if value == model.pad_id:
        raise ArgumentError(f"{name} ({value}) equals the model's pad_id; padding is masked, so {name} needs its own id")
    return value


def _limits(model, src_ids: torch.Tensor, max_len, max_len_a, max_len_b) -> torch.Tensor:
    """Per-row maximum number of output tokens before EOS, ``(B,)`` long."""
    cap = model.max_target_tokens
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, int):
            raise ArgumentTypeError(f"max_len must be an int or None, got {describe(max_len)}")
        if max_len < 0:
            raise ArgumentError(f"max_len must be >= 0, got {max_len}")
        if cap is not None and max_len > cap:
            raise ArgumentError(f"max_len {max_len} exceeds what the model can decode: {cap} tokens (its positional "
                             f"max_len {model.max_len} minus the BOS position)")
        return torch.full((src_ids.shape[0],), max_len, dtype=torch.long, device=src_ids.device)
    for name, value in (("max_len_a", max_len_a), ("max_len_b", max_len_b)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ArgumentTypeError(f"{name} must be a finite number, got {describe(value)}")
    if max_len_a < 0:
        raise ArgumentError(f"max_len_a must be >= 0, got {max_len_a}")
    lengths = (src_ids != model.pad_id).sum(dim=1).to(torch.float64)  # (B,) sources without padding
    limits = torch.floor(max_len_a * lengths + max_len_b).clamp(min=0)
    if cap is not None:
        limits = limits.clamp(max=cap)
    return limits.long()


def decoding_memory_bytes(model: Seq2Seq, batch: int, source_length: int, output_length: int, *, beam: int = 1,
                          element_size: int = 4) -> int:
    """An upper estimate of the bytes a search holds for ``batch`` sources of ``source_length`` tokens, ``beam``
    hypotheses each, of up to ``output_length`` tokens: the encoder's output and, in every decoder attention
    sublayer, keys and values over the source and over the output so far (``rows × (S + T) × d`` each, rows =
    batch × beam), the hypotheses' tokens, and per step the next-token scores over the vocabulary (a few float32
    ``rows × V`` tensors; beam search's candidates ``batch × beam·V``)."""
    from ..attention import SelfAttention

    rows = batch * beam
    sublayers = sum(isinstance(m, SelfAttention) for m in model.decoder.modules()) or 1
    states = rows * (source_length + output_length) * model.d_model * element_size * 2 * sublayers
    memory = rows * source_length * model.d_model * element_size
    scores = 5 * rows * model.tgt_vocab_size * 4
    return states + memory + scores + rows * output_length * 8


def _start(model, src_ids, bos_id, eos_id, max_len, max_len_a, max_len_b, beam: int = 1):
    from ..device import check_memory

    if not isinstance(model, Seq2Seq):
        raise ArgumentTypeError(f"model must be a maskattn Seq2Seq, got {describe(model)}")
    bos_id = _check_token(bos_id, "bos_id", model)
    eos_id = _check_token(eos_id, "eos_id", model)
    memory, padding = model.encode(src_ids)  # validates src_ids
    limits = _limits(model, src_ids, max_len, max_len_a, max_len_b)
    batch, length = src_ids.shape
    longest = int(limits.max()) + 1 if limits.numel() else 1
    check_memory(decoding_memory_bytes(model, batch, length, longest, beam=beam, element_size=memory.element_size()),
                 what=f"decoding {batch} source(s) of {length} tokens with beam {beam} ({batch * beam:,} hypotheses of "
                      f"up to {longest} tokens)", device=memory.device,
                 advice="lower the beam (--beam) or the sources per batch (--batch-size)")
    return bos_id, eos_id, model.init_state(memory, padding), limits


def repeated_ngram_bans(tokens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The next tokens that would repeat an n-gram: for the rows ``tokens`` ``(N, t)`` (the output so far), the
    pairs ``(rows, banned)`` of 1-D tensors such that ``tokens[row, -(n-1):] + [banned]`` is an n-gram already in
    ``tokens[row]``. Vectorised: one comparison of every window with the row's last ``n − 1`` tokens."""
    N, t = tokens.shape
    if n < 1 or t < n:
        empty = torch.empty(0, dtype=torch.long, device=tokens.device)
        return empty, empty
    windows = tokens.unfold(1, n, 1)  # (N, t − n + 1, n): every n-gram of each row
    prefix = tokens[:, t - n + 1:]  # (N, n − 1): what the next token would extend
    match = (windows[:, :, :n - 1] == prefix[:, None, :]).all(dim=-1)  # (N, t − n + 1)
    rows, starts = match.nonzero(as_tuple=True)
    return rows, windows[rows, starts, n - 1]


def _next_log_probs(model, logits: torch.Tensor, bos_id: int, eos_id: int, at_limit: torch.Tensor,
                    below_min: bool = False, generated: torch.Tensor | None = None,
                    no_repeat_ngram_size: int = 0) -> torch.Tensor:
    """Log-probabilities of the next token ``(N, V)``: padding and BOS banned, EOS banned where ``below_min``,
    tokens that repeat an n-gram of ``generated`` ``(N, t)`` banned, EOS forced where ``at_limit`` (and where
    nothing else is left)."""
    log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1)
    eos = log_probs[:, eos_id].clone()
    log_probs[:, model.pad_id] = -math.inf
    if bos_id != eos_id:
        log_probs[:, bos_id] = -math.inf
    if no_repeat_ngram_size and generated is not None:
        rows, banned = repeated_ngram_bans(generated, no_repeat_ngram_size)
        log_probs[rows, banned] = -math.inf
    if below_min:
        log_probs[:, eos_id] = -math.inf
    stuck = ~torch.isfinite(log_probs).any(dim=-1)  # every token banned: the hypothesis ends
    at_limit = at_limit | stuck
    if bool(at_limit.any()):
        forced = torch.full_like(log_probs, -math.inf)
        forced[:, eos_id] = eos
        log_probs = torch.where(at_limit[:, None], forced, log_probs)
    return log_probs


def greedy_decode(model: Seq2Seq, src_ids: torch.Tensor, *, bos_id: int, eos_id: int, max_len: int | None = None,
                  max_len_a: float = 1.2, max_len_b: float = 10, min_len: int = 0,
                  no_repeat_ngram_size: int = 0) -> list[list[int]]:
    """The most probable next token at every step, for each source row of ``src_ids`` ``(B, S)``; returns
    one list of token ids (without BOS/EOS) per row. Length limits and repeated n-grams: module docstring."""
    _check_search(min_len=min_len, max_len=max_len, no_repeat_ngram_size=no_repeat_ngram_size)
    with _inference(model):
        bos_id, eos_id, state, limits = _start(model, src_ids, bos_id, eos_id, max_len, max_len_a, max_len_b)
        outputs: list[list[int]] = [[] for _ in range(state.batch_size)]
        rows = torch.arange(state.batch_size)  # source row of each live row
        tokens = torch.full((state.batch_size, 1), bos_id, dtype=torch.long, device=src_ids.device)
        generated = tokens[:, :0]  # (N, step): the output so far, for the n-gram bans
        step = 0
        while rows.numel():
            logits, state = model.decode_step(tokens, state)
            next_tokens = _next_log_probs(model, logits, bos_id, eos_id, step >= limits, step < min_len, generated,
                                          no_repeat_ngram_size).argmax(dim=-1)  # (N,)
            for row, token in zip(rows.tolist(), next_tokens.tolist()):
                if token != eos_id:
                    outputs[row].append(token)
            live = next_tokens != eos_id
            if not bool(live.all()):
                keep = live.nonzero().squeeze(1)
                rows, limits, next_tokens, generated = rows[keep.cpu()], limits[keep], next_tokens[keep], generated[keep]
                state = state.reorder(keep)
            tokens = next_tokens[:, None]
            if no_repeat_ngram_size:
                generated = torch.cat([generated, tokens], dim=1)
            step += 1
        return outputs


def beam_search(model: Seq2Seq, src_ids: torch.Tensor, *, beam_size: int = 5, length_penalty: float = 0.6,
                length_penalty_kind: str = "gnmt", bos_id: int, eos_id: int, max_len: int | None = None,
                max_len_a: float = 1.2, max_len_b: float = 10, min_len: int = 0, no_repeat_ngram_size: int = 0,
                return_nbest: bool = False) -> list[list[int]] | list[list[Hypothesis]]:
    """Beam search (module docstring) for each source row of ``src_ids`` ``(B, S)``.

    Returns the best hypothesis per row as token ids without BOS/EOS; with ``return_nbest`` instead every
    row's finished :class:`Hypothesis` list (up to ``beam_size``), best first. ``length_penalty`` is the
    ``alpha`` of ``length_penalty_kind`` (GNMT's 0.6 in Wu et al. 2016 and Vaswani et al. 2017; fairseq's 1.0
    in MAN's Gigaword decoding).
    """
    check_int_at_least(beam_size, "beam_size", 1)
    _check_search(length_penalty=length_penalty, length_penalty_kind=length_penalty_kind, min_len=min_len,
                  max_len=max_len, no_repeat_ngram_size=no_repeat_ngram_size)
    if not isinstance(return_nbest, bool):
        raise ArgumentTypeError(f"return_nbest must be a bool, got {describe(return_nbest)}")
    K = beam_size
    with _inference(model):
        bos_id, eos_id, state, limits = _start(model, src_ids, bos_id, eos_id, max_len, max_len_a, max_len_b, K)
        device, B, V = src_ids.device, state.batch_size, model.tgt_vocab_size
        state = state.reorder(torch.arange(B, device=device).repeat_interleave(K))  # row s·K + k: beam k of s
        sentences = torch.arange(B)  # source row of each live sentence
        finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        scores = torch.full((B, K), -math.inf, device=device)
        scores[:, 0] = 0.0  # one live beam at the start, so the first expansion has no duplicates
        hyps = torch.empty(B * K, 0, dtype=torch.long, device=device)  # generated tokens of each beam
        inputs = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        step = 0
        while sentences.numel():
            n = sentences.numel()
            logits, state = model.decode_step(inputs, state)
            log_probs = _next_log_probs(model, logits, bos_id, eos_id, (step >= limits).repeat_interleave(K),
                                        step < min_len, hyps, no_repeat_ngram_size)  # (n·K, V)
            candidates = (scores.reshape(-1, 1) + log_probs).reshape(n, K * V)
            top_scores, top = candidates.topk(min(2 * K, K * V), dim=1)  # (n, 2K), best first
            beam, token = top // V, top % V
            ends = (token == eos_id) & torch.isfinite(top_scores)
            for i, j in ends[:, :K].nonzero().tolist():  # EOS among the best K: a finished hypothesis
                hypotheses = finished[int(sentences[i])]
                if len(hypotheses) < K:
                    log_prob = float(top_scores[i, j])
                    tokens = hyps[i * K + int(beam[i, j])].tolist()
                    lp = length_penalty_factor(len(tokens) + 1, length_penalty, length_penalty_kind)
                    hypotheses.append(Hypothesis(tokens, log_prob / lp, log_prob))
            # continue with the K best candidates that do not end in EOS (ranked as before)
            rank = torch.arange(top.shape[1], device=device) + ends * top.shape[1]
            keep = rank.topk(K, dim=1, largest=False).indices  # (n, K), ascending rank
            scores, beam, token = top_scores.gather(1, keep), beam.gather(1, keep), token.gather(1, keep)
            full = torch.tensor([len(finished[int(s)]) >= K for s in sentences], device=device)
            live = ~full & torch.isfinite(scores).any(dim=1)  # (n,)
            rows = (torch.arange(n, device=device)[:, None] * K + beam)[live].reshape(-1)  # (n_live·K,)
            state = state.reorder(rows)
            inputs = token[live].reshape(-1, 1)
            hyps = torch.cat([hyps[rows], inputs], dim=1)
            scores, limits, sentences = scores[live], limits[live], sentences[live.cpu()]
            step += 1
        for hypotheses in finished:
            hypotheses.sort(key=lambda h: h.score, reverse=True)
        if return_nbest:
            return finished
        return [hypotheses[0].tokens for hypotheses in finished]  # never empty: EOS is forced at the limit
