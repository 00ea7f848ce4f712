"""The decoding options of summarization (MAN §3.1.2): n-gram blocking, minimum length and fairseq's length penalty,
checked against brute force — every output sequence of a small vocabulary enumerated and scored by the
teacher-forced forward pass, so the incremental decoding cache is checked along with the search."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskattn.errors import ArgumentError, ArgumentTypeError
from maskattn.inference import DecodingOptions, beam_search, greedy_decode, length_penalty_factor
from maskattn.inference.decoding import repeated_ngram_bans
from maskattn.models.seq2seq import Seq2Seq

PAD, BOS, EOS = 0, 1, 2
TOKENS = (3, 4, 5)  # what a model of 6 target ids can generate (PAD and BOS never are)


def small(architecture: str = "transformer", tgt_vocab: int = 6, seed: int = 0) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq.from_architecture(architecture, 20, tgt_vocab, d_model=16, num_heads=4, encoder_layers=1,
                                     decoder_layers=2, dropout=0.0, max_len=32).double().eval()


def has_repeat(tokens, n: int) -> bool:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def log_probs(model, src, outputs) -> dict[tuple, float]:
    """log P(tokens, EOS | src) of every output by one teacher-forced pass over all of them (no cache)."""
    width = max(len(tokens) for tokens in outputs) + 1
    tgt = torch.full((len(outputs), width + 1), PAD)  # (N, width + 1): BOS, tokens, EOS, padding
    for i, tokens in enumerate(outputs):
        tgt[i, :len(tokens) + 2] = torch.tensor([BOS, *tokens, EOS])
    with torch.no_grad():
        scores = torch.log_softmax(model(src.expand(len(outputs), -1), tgt[:, :-1]), dim=-1)  # (N, width, V)
    picked = scores.gather(2, tgt[:, 1:, None])[..., 0].masked_fill(tgt[:, 1:] == PAD, 0.0)
    return {tuple(tokens): float(total) for tokens, total in zip(outputs, picked.sum(dim=1))}


def log_prob(model, src, tokens) -> float:
    return log_probs(model, src, [tuple(tokens)])[tuple(tokens)]


@pytest.mark.parametrize("architecture", ["transformer", "man"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_exhaustive_beam_search_equals_brute_force_over_every_output(architecture, n):
    """A beam wide enough to prune nothing returns every allowed output — exactly the sequences of 1 … 5 tokens
    without a repeated n-gram — scored log P / |Y|^α (fairseq), whatever the search and the cache did."""
    model, src, alpha = small(architecture), torch.tensor([[5, 9, 4, 7]]), 1.0
    nbest = beam_search(model, src, beam_size=400, length_penalty=alpha, length_penalty_kind="fairseq", bos_id=BOS,
                        eos_id=EOS, max_len=5, min_len=1, no_repeat_ngram_size=n, return_nbest=True)[0]
    allowed = [seq for length in range(1, 6) for seq in itertools.product(TOKENS, repeat=length)
               if not has_repeat(seq, n)]
    assert sorted(tuple(h.tokens) for h in nbest) == sorted(allowed)
    brute = log_probs(model, src, allowed)
    for h in nbest:
        assert h.log_prob == pytest.approx(brute[tuple(h.tokens)], abs=1e-5)  # the search runs in float32
        assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + 1) ** alpha)
    best = max(allowed, key=lambda seq: brute[seq] / (len(seq) + 1) ** alpha)
    assert tuple(nbest[0].tokens) == best


def greedy_brute_force(model, src, *, n: int, min_len: int, max_len: int) -> list[int]:
    """Greedy decoding by the full forward pass at every step, with the bans computed from a set of n-grams."""
    out: list[int] = []
    while True:
        with torch.no_grad():
            scores = torch.log_softmax(model(src, torch.tensor([[BOS, *out]]))[0, -1], dim=-1)
        scores[[PAD, BOS]] = -math.inf
        if len(out) >= n - 1 and n:
            seen = {tuple(out[i:i + n]) for i in range(len(out) - n + 1)}
            for token in range(len(scores)):
                if tuple(out[len(out) - n + 1:] + [token]) in seen:
                    scores[token] = -math.inf
        if len(out) < min_len:
            scores[EOS] = -math.inf
        token = EOS if len(out) == max_len else int(scores.argmax())
        if token == EOS:
            return out
        out.append(token)


@pytest.mark.parametrize("n", [2, 3])
def test_greedy_blocking_equals_a_step_by_step_brute_force(n):
    model = small("man", tgt_vocab=9, seed=1)
    src = torch.tensor([[5, 9, 4, 7, 3, 8], [6, 6, 3, 0, 0, 0]])
    got = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len=12, min_len=3, no_repeat_ngram_size=n)
    for row, tokens in zip(src, got):
        expected = greedy_brute_force(model, row[row != PAD][None], n=n, min_len=3, max_len=12)
        assert tokens == expected and not has_repeat(tokens, n) and len(tokens) >= 3


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(3, 6), min_size=5, max_size=5), min_size=1, max_size=4),
       n=st.integers(1, 4))
def test_repeated_ngram_bans_equal_brute_force(rows, n):
    tokens = torch.tensor(rows)
    banned_rows, banned = repeated_ngram_bans(tokens, n)
    got = {(int(r), int(t)) for r, t in zip(banned_rows, banned)}
    expected = {(r, t) for r, row in enumerate(rows) for t in range(3, 7)
                if tuple(row[len(row) - n + 1:] + [t]) in {tuple(row[i:i + n]) for i in range(len(row) - n + 1)}}
    assert got == expected


def test_trigram_blocking_in_a_real_beam_and_the_cache_left_intact():
    """Beam 5 with trigram blocking on a model that loves to repeat: no hypothesis repeats a trigram, every score is
    the teacher-forced one (the cache followed the beams), and blocking off lets the repeats back in."""
    model = small("transformer", tgt_vocab=7)
    with torch.no_grad():  # logits favour token 3 strongly whatever came before
        model.tgt_embed.weight[3] *= 4
    src = torch.tensor([[5, 9, 4, 7]])
    plain = beam_search(model, src, beam_size=5, bos_id=BOS, eos_id=EOS, max_len=12, min_len=12)[0]
    assert has_repeat(plain, 3)
    nbest = beam_search(model, src, beam_size=5, bos_id=BOS, eos_id=EOS, max_len=12, no_repeat_ngram_size=3,
                        return_nbest=True)[0]
    for h in nbest:
        assert not has_repeat(h.tokens, 3)
        assert h.log_prob == pytest.approx(log_prob(model, src, h.tokens), abs=1e-5)  # search in float32


def test_min_len_and_length_penalties():
    model = small("transformer", tgt_vocab=7)
    src = torch.tensor([[5, 9, 4, 7], [3, 3, 0, 0]])
    for min_len in (0, 4, 9):
        assert all(len(t) >= min_len for t in greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len=9,
                                                            min_len=min_len))
        assert all(len(t) >= min_len for t in beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len=9,
                                                          min_len=min_len))
    assert length_penalty_factor(4, 1.0, "fairseq") == 4.0 and length_penalty_factor(4, 2.0, "fairseq") == 16.0
    assert length_penalty_factor(7, 1.0) == 2.0  # GNMT, the default kind
    # a longer output ranks higher under a stronger penalty (both scores are negative)
    weak = beam_search(model, src, beam_size=4, length_penalty=0.0, length_penalty_kind="fairseq", bos_id=BOS,
                       eos_id=EOS, max_len=9)
    strong = beam_search(model, src, beam_size=4, length_penalty=2.0, length_penalty_kind="fairseq", bos_id=BOS,
                         eos_id=EOS, max_len=9)
    assert all(len(s) >= len(w) for s, w in zip(strong, weak))


def test_decoding_options_check_and_run():
    model, src = small(), torch.tensor([[5, 9, 4, 7]])
    options = DecodingOptions(beam=3, length_penalty=1.0, length_penalty_kind="fairseq", min_len=1, max_len=6,
                              no_repeat_ngram_size=2)
    assert options.search(model, src, bos_id=BOS, eos_id=EOS) == beam_search(
        model, src, beam_size=3, length_penalty=1.0, length_penalty_kind="fairseq", bos_id=BOS, eos_id=EOS, max_len=6,
        min_len=1, no_repeat_ngram_size=2)
    assert options.replace(beam=1, max_len=None).search(model, src, bos_id=BOS, eos_id=EOS) == greedy_decode(
        model, src, bos_id=BOS, eos_id=EOS, max_len=6, min_len=1, no_repeat_ngram_size=2)
    train = {"eval_beam": 1, "test_beam": 4, "length_penalty": 2.0, "length_penalty_kind": "fairseq",
             "min_output_len": 2, "max_output_len": 50, "no_repeat_ngram_size": 3, "seed": 0}
    assert DecodingOptions.from_config(train) == DecodingOptions(4, 2.0, "fairseq", 2, 50, 3)
    assert DecodingOptions.from_config(train, "dev").beam == 1
    assert DecodingOptions.from_config({}) == DecodingOptions()
    cases = [(dict(beam=0), ArgumentError, "beam must be >= 1"),
             (dict(length_penalty_kind="wu"), ArgumentError, "unknown length_penalty_kind 'wu'; expected one of gnmt, "
                                                              "fairseq"),
             (dict(min_len=5, max_len=3), ArgumentError, "min_len 5 is larger than max_len 3"),
             (dict(no_repeat_ngram_size=-1), ArgumentError, "no_repeat_ngram_size must be >= 0"),
             (dict(no_repeat_ngram_size=2.5), ArgumentTypeError, "no_repeat_ngram_size must be an int")]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            DecodingOptions(**kwargs)
    with pytest.raises(ArgumentTypeError, match="unknown decoding option.*beam_size; expected some of beam"):
        options.replace(beam_size=2)
    with pytest.raises(ArgumentError, match="min_len 4 is larger than max_len 2"):
        greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len=2, min_len=4)
