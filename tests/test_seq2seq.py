"""Seq2Seq (encoder–decoder architectures) and decoding: incremental decoding equals teacher forcing, greedy and
beam search (beam 1 = greedy, padding invariance, batch = rows, scores), length limits, embeddings, errors,
and a tiny reversal task learned end to end."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from maskattn.inference import Hypothesis, beam_search, greedy_decode, length_penalty_factor
from maskattn.layers import MANLayer
from maskattn.models.seq2seq import DecoderState, Seq2Seq

ARCHITECTURES = sorted(Seq2Seq.ARCHITECTURES)
PAD, BOS, EOS = 0, 1, 2
SMALL = dict(d_model=16, num_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0, max_len=32)


def small(architecture="transformer", src_vocab=20, tgt_vocab=23, **overrides) -> Seq2Seq:
    torch.manual_seed(0)
    return Seq2Seq.from_architecture(architecture, src_vocab, tgt_vocab, **{**SMALL, **overrides}).eval()


def sources(B=4, S=7, vocab=20, seed=0) -> torch.Tensor:
    """Rows of different lengths (7, 5, 7, 2), padded with PAD at the end."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (B, S), generator=g)
    src[1, 5:] = PAD
    src[3, 2:] = PAD
    return src


def teacher_forcing_log_prob(model, src_row, tokens) -> float:
    """log P(tokens, EOS | src) by the full forward pass."""
    tgt_in = torch.tensor([[BOS, *tokens]])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src_row[None], tgt_in).double(), dim=-1)[0]
    return float(sum(log_probs[t, y] for t, y in enumerate([*tokens, EOS])))


# --------------------------------------------------------------------------------------------------
# architectures and structure
# --------------------------------------------------------------------------------------------------


def test_architectures_follow_the_papers():
    full = {name: Seq2Seq.from_architecture(name, 11, 11, d_model=16, num_heads=4) for name in ARCHITECTURES}
    assert {n: (m.encoder_recipe, m.decoder_recipe) for n, m in full.items()} == {
        "transformer": ("mha x6", "mha x6"),
        "man": ("dman>san>ffn x6", "dman>san>ffn x6"),
        "csan": ("csan2d x3, mha x3", "mha x6"),
        "mtsa-encoder": ("mtsa x6", "mha x6"),
        "man-summarization": (f"{MANLayer.authors_recipe('summarization')} x6",
                              f"{MANLayer.authors_recipe('summarization_decoder')} x6"),
    }
    assert full["man-summarization"].decoder.layers[0].names == ["dman", "man_san", "cross", "ffn"]
    man = full["man"]
    layer = man.decoder.layers[0]
    assert layer.names == ["dman", "san", "cross", "ffn"]  # MAN decoder: DMAN -> SAN -> cross -> FFN
    assert layer.sublayers[0].causal and layer.sublayers[1].mask.name == "causal"
    assert layer.sublayers[3].fc1.out_features == 2 * 16  # MAN §3.1: FFN width 2d
    assert full["transformer"].decoder.layers[0].names == ["mha", "cross", "ffn"]
    assert full["transformer"].decoder.layers[0].sublayers[2].fc1.out_features == 4 * 16
    defaults = inspect.signature(Seq2Seq).parameters
    assert (defaults["d_model"].default, defaults["num_heads"].default) == (512, 8)


def test_layer_overrides_scale_the_recipes():
    assert small("csan").encoder_recipe == "csan2d, mha"  # CSAN in the lower half
    assert small("csan", encoder_layers=4).encoder_recipe == "csan2d x2, mha x2"
    assert small("csan", encoder_layers=1).encoder_recipe == "csan2d"
    model = small("man", encoder_layers=3, decoder_layers=1)
    assert (model.encoder_recipe, model.decoder_recipe) == ("dman>san>ffn x3", "dman>san>ffn")
    assert small("transformer", encoder="mha x1", decoder="sman(radius=2)>san>ffn x2").decoder_recipe == \
        "sman(radius=2)>san>ffn x2"  # decoder_layers=2 keeps the given recipe's 2 layers


def test_every_parameter_gets_a_gradient():
    model = small("man").train()
    src = sources()
    tgt = torch.randint(3, 23, (4, 6))
    model(src, tgt).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# --------------------------------------------------------------------------------------------------
# incremental decoding
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_decode_step_equals_teacher_forcing(architecture):
    model = small(architecture).double()
    src = sources()
    tgt = torch.randint(3, 23, (4, 8), generator=torch.Generator().manual_seed(1))
    tgt[:, 0] = BOS
    tgt[2, 6:] = PAD
    full = model(src, tgt)
    state = model.init_state(*model.encode(src))
    assert len(state) == 0
    pieces = []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 8)]:  # several tokens at once, then one at a time
        logits, state = model.decode_step(tgt[:, start:stop], state)
        pieces.append(logits)
    assert len(state) == 8
    real = tgt != PAD
    torch.testing.assert_close(torch.cat(pieces, 1)[real], full[real], atol=1e-9, rtol=0)


def test_decode_step_equals_teacher_forcing_float32():
    model = small("man")
    src, tgt = sources(), torch.randint(3, 23, (4, 6))
    full = model(src, tgt)
    state = model.init_state(*model.encode(src))
    steps = []
    for t in range(6):
        logits, state = model.decode_step(tgt[:, t:t + 1], state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_state_reorder_selects_and_repeats_rows():
    model = small("man").double()
    src, tgt = sources(), torch.randint(3, 23, (4, 5))
    state = model.init_state(*model.encode(src))
    _, state = model.decode_step(tgt[:, :3], state)
    index = torch.tensor([2, 0, 0, 3])
    logits, _ = model.decode_step(tgt[index, 3:5], state.reorder(index))
    expected = model(src[index], tgt[index])[:, 3:5]
    torch.testing.assert_close(logits, expected, atol=1e-9, rtol=0)
    assert state.reorder(index).batch_size == 4 and len(state.reorder(index)) == 3


# --------------------------------------------------------------------------------------------------
# greedy and beam search
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_beam_size_one_equals_greedy(architecture):
    model = small(architecture)
    src = sources()
    greedy = greedy_decode(model, src, bos_id=BOS, eos_id=EOS)
    assert greedy == beam_search(model, src, beam_size=1, bos_id=BOS, eos_id=EOS)
    assert len(greedy) == 4 and all(not {PAD, BOS, EOS} & set(row) for row in greedy)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_extra_source_padding_changes_nothing(architecture):
    model = small(architecture)
    src = sources()
    padded = torch.cat([src, torch.full((4, 5), PAD)], dim=1)
    memory, padding = model.encode(src)
    memory_padded, _ = model.encode(padded)
    torch.testing.assert_close(memory_padded[:, :7], memory, atol=1e-5, rtol=1e-5)
    assert memory_padded[:, 7:].abs().max() == 0 and not padding[0].any() and padding[3, 2:].all()
    assert greedy_decode(model, padded, bos_id=BOS, eos_id=EOS) == greedy_decode(model, src, bos_id=BOS, eos_id=EOS)
    beam = dict(beam_size=3, bos_id=BOS, eos_id=EOS, return_nbest=True)
    for a, b in zip(beam_search(model, padded, **beam), beam_search(model, src, **beam)):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_beam_search_of_a_batch_equals_rows_alone():
    model = small("man")
    src = sources()
    kwargs = dict(beam_size=4, bos_id=BOS, eos_id=EOS, return_nbest=True)
    batched = beam_search(model, src, **kwargs)
    for row, hyps in zip(src, batched):
        alone = beam_search(model, row[row != PAD][None], **kwargs)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_hypotheses_are_scored_and_ordered(alpha):
    model = small("transformer", tgt_vocab=9).double()
    src = sources()
    nbest = beam_search(model, src, beam_size=4, length_penalty=alpha, bos_id=BOS, eos_id=EOS, max_len=6,
                        return_nbest=True)
    best = beam_search(model, src, beam_size=4, length_penalty=alpha, bos_id=BOS, eos_id=EOS, max_len=6)
    assert best == [hyps[0].tokens for hyps in nbest]
    for row, hyps in zip(src, nbest):
        assert 1 <= len(hyps) <= 4 and all(isinstance(h, Hypothesis) for h in hyps)
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
        for h in hyps:
            assert len(h.tokens) <= 6 and not {PAD, BOS, EOS} & set(h.tokens)
            assert h.score == pytest.approx(h.log_prob / length_penalty_factor(len(h.tokens) + 1, alpha))
            assert h.log_prob == pytest.approx(teacher_forcing_log_prob(model, row[row != PAD], h.tokens), abs=1e-5)
    assert length_penalty_factor(1, 0.6) == 1.0 and length_penalty_factor(7, 1.0) == 2.0


def test_wider_beams_find_more_probable_outputs_than_greedy():
    model = small("transformer", tgt_vocab=9).double()
    src = sources()
    greedy = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len=5)
    beams = beam_search(model, src, beam_size=6, length_penalty=0.0, bos_id=BOS, eos_id=EOS, max_len=5,
                        return_nbest=True)
    for row, g, hyps in zip(src, greedy, beams):
        assert hyps[0].log_prob >= teacher_forcing_log_prob(model, row[row != PAD], g) - 1e-9


def never_ending_model(**overrides) -> Seq2Seq:
    """A model whose logits are constant: token 5 always wins and EOS is always last."""
    model = small("transformer", **overrides)
    with torch.no_grad():
        model.decoder.final_norm.weight.zero_()
        model.decoder.final_norm.bias.copy_(model.tgt_embed.weight[5] * 10)
        model.tgt_embed.weight[EOS] = -model.tgt_embed.weight[5]
    return model


def test_length_limits():
    model = never_ending_model()
    src = sources()  # lengths 7, 5, 7, 2
    assert [len(r) for r in greedy_decode(model, src, bos_id=BOS, eos_id=EOS)] == [18, 16, 18, 12]
    assert [len(r) for r in greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_a=1.0, max_len_b=0)] == \
        [7, 5, 7, 2]
    assert greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len=3) == [[5, 5, 5]] * 4
    assert beam_search(model, src, beam_size=2, bos_id=BOS, eos_id=EOS, max_len=0) == [[]] * 4
    # the default limit is capped by the positional range: max_len 32 leaves 31 tokens after BOS
    assert [len(r) for r in greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_a=10)] == [31, 31, 31, 30]
    assert [len(r) for r in beam_search(model, src, beam_size=2, bos_id=BOS, eos_id=EOS, max_len=31)] == [31] * 4
    with pytest.raises(ValueError, match="max_len 32 exceeds what the model can decode: 31 tokens"):
        greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len=32)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_all_padding_source_row_is_finite(architecture):
    model = small(architecture).train()
    src = torch.tensor([[3, 4, 5], [PAD, PAD, PAD]])
    logits = model(src, torch.tensor([[BOS, 6, 7], [BOS, 8, PAD]]))
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert all(len(r) <= 3 for r in beam_search(model, src, beam_size=2, bos_id=BOS, eos_id=EOS, max_len=3))


def test_decoding_runs_in_eval_mode_and_restores_the_mode():
    model = small("transformer", dropout=0.5).train()
    outputs = [greedy_decode(model, sources(), bos_id=BOS, eos_id=EOS) for _ in range(2)]
    assert model.training and outputs[0] == outputs[1]  # no dropout while decoding


# --------------------------------------------------------------------------------------------------
# embeddings, lengths, errors
# --------------------------------------------------------------------------------------------------


def test_shared_and_tied_embeddings():
    shared = small("transformer", src_vocab=23, share_embeddings=True)
    assert shared.src_embed is None and shared.output_projection is None
    keys = set(shared.state_dict())
    assert "tgt_embed.weight" in keys and not any(k.startswith("src_embed") for k in keys)
    src = sources(vocab=23)
    tgt = torch.randint(3, 23, (4, 5))
    shared(src, tgt).sum().backward()
    assert shared.tgt_embed.weight.grad[src.unique()[1:]].abs().sum() > 0  # source ids train the shared table
    untied = small("transformer", tie_output=False)
    assert untied.output_projection.weight.shape == (23, 16)
    tied = small("transformer")
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 23 * 16
    with pytest.raises(ValueError, match="src_vocab_size is 20 and tgt_vocab_size is 23"):
        small("transformer", share_embeddings=True)


def test_shared_model_state_dict_saves_with_safetensors():
    from safetensors.torch import save

    model = small("man", src_vocab=23, share_embeddings=True)
    assert save({k: v.contiguous() for k, v in model.state_dict().items()})


def test_lengths_beyond_positional_range_raise():
    model = small("transformer", max_len=8)
    with pytest.raises(ValueError, match="src_ids has length 9 but the model's max_len is 8"):
        model.encode(torch.randint(3, 20, (2, 9)))
    with pytest.raises(ValueError, match="tgt_in_ids has length 10 but the model's max_len is 8"):
        model(torch.randint(3, 20, (2, 4)), torch.randint(3, 23, (2, 10)))
    state = model.init_state(*model.encode(torch.randint(3, 20, (2, 4))))
    _, state = model.decode_step(torch.randint(3, 23, (2, 6)), state)
    with pytest.raises(ValueError, match=r"positions 6 … 8 but the model's max_len is 8"):
        model.decode_step(torch.randint(3, 23, (2, 3)), state)
    unbounded = small("transformer", max_len=8, positional="none")
    assert unbounded(torch.randint(3, 20, (1, 12)), torch.randint(3, 23, (1, 12))).shape == (1, 12, 23)
    assert unbounded.max_target_tokens is None


@pytest.mark.parametrize("ids, error, match", [
    (torch.randn(2, 5), TypeError, "src_ids must hold integer token ids"),
    ([[3, 4]], TypeError, "src_ids must be a 2-D integer tensor"),
    (torch.tensor([3, 4, 5]), ValueError, r"src_ids must have shape \(batch, length\), got \(3,\)"),
    (torch.zeros(0, 4, dtype=torch.long), ValueError, r"src_ids is empty \(shape \(0, 4\)\)"),
    (torch.tensor([[3, 20]]), ValueError, r"src_ids holds ids in \[3, 20\] but the vocabulary has 20 entries"),
    (torch.tensor([[3, -1]]), ValueError, r"ids in \[-1, 3\]"),
])
def test_bad_ids(ids, error, match):
    model = small()
    with pytest.raises(error, match=match):
        model.encode(ids)
    with pytest.raises(error, match=match):
        greedy_decode(model, ids, bos_id=BOS, eos_id=EOS)


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="unknown architecture 'bert'; expected one of 'transformer', 'man', 'csan', "
                                         "'mtsa-encoder'"):
        Seq2Seq.from_architecture("bert", 10, 10)
    with pytest.raises(TypeError, match="encoder_layers must be an int"):
        Seq2Seq.from_architecture("man", 10, 10, encoder_layers=2.0)
    with pytest.raises(ValueError, match="sublayer 'mtsa' cannot be a decoder self-attention"):
        Seq2Seq(10, 10, d_model=16, num_heads=4, decoder="mtsa")
    with pytest.raises(ValueError, match="has no self-attention sublayer"):
        Seq2Seq(10, 10, d_model=16, num_heads=4, decoder="ffn")
    with pytest.raises(ValueError, match="decoder self-attention is always causal"):
        Seq2Seq(10, 10, d_model=16, num_heads=4, decoder="dman(causal=false)>san>ffn")
    with pytest.raises(ValueError, match="radius='sqrt'.*cannot be decoded incrementally"):
        Seq2Seq(10, 10, d_model=16, num_heads=4, decoder="sman(radius=sqrt)>san>ffn")
    with pytest.raises(ValueError, match=r"pad_id must be an int id in both vocabularies \[0, 10\)"):
        Seq2Seq(10, 12, d_model=16, num_heads=4, pad_id=10)
    with pytest.raises(ValueError, match="d_model \\(18\\) must be divisible by num_heads \\(4\\)"):
        Seq2Seq(10, 10, d_model=18, num_heads=4)


def test_bad_decoding_arguments():
    model, src = small(), sources()
    cases = [
        (dict(beam_size=0), ValueError, "beam_size must be >= 1, got 0"),
        (dict(beam_size=2.5), TypeError, "beam_size must be an int"),
        (dict(length_penalty=-0.5), ValueError, "length_penalty must be a finite number >= 0"),
        (dict(length_penalty=math.nan), ValueError, "length_penalty must be a finite number >= 0"),
        (dict(length_penalty="0.6"), TypeError, "length_penalty must be a number"),
        (dict(bos_id=PAD), ValueError, "bos_id \\(0\\) equals the model's pad_id"),
        (dict(eos_id=23), ValueError, r"eos_id must be a target id in \[0, 22\], got 23"),
        (dict(max_len=-1), ValueError, "max_len must be >= 0"),
        (dict(max_len_a=-1.0), ValueError, "max_len_a must be >= 0"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            beam_search(model, src, **{"bos_id": BOS, "eos_id": EOS, **kwargs})
    with pytest.raises(TypeError, match="model must be a maskattn Seq2Seq"):
        greedy_decode(torch.nn.Linear(2, 2), src, bos_id=BOS, eos_id=EOS)


def test_bad_state_use():
    model, src = small(), sources()
    state = model.init_state(*model.encode(src))
    with pytest.raises(ValueError, match="tgt_ids_new has batch size 2 but the state has 4"):
        model.decode_step(torch.full((2, 1), BOS), state)
    with pytest.raises(TypeError, match="state must be a DecoderState"):
        model.decode_step(torch.full((4, 1), BOS), {"memory": None})
    with pytest.raises(ValueError, match=r"index must hold rows in \[0, 3\]"):
        state.reorder(torch.tensor([0, 4]))
    with pytest.raises(TypeError, match="index must be a 1-D integer tensor"):
        state.reorder(torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="memory must be a float tensor of shape"):
        model.init_state(torch.zeros(4, 7, 8), torch.zeros(4, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"src_padding_mask must be a bool tensor of shape \(4, 7\)"):
        model.init_state(torch.zeros(4, 7, 16), torch.zeros(4, 6, dtype=torch.bool))
    assert isinstance(state, DecoderState)


# --------------------------------------------------------------------------------------------------
# learning: copy and reverse a sequence
# --------------------------------------------------------------------------------------------------

V = 13  # PAD, BOS, EOS and 10 symbols


def task_batch(g: torch.Generator, B: int, reverse: bool):
    lengths = torch.randint(2, 8, (B,), generator=g)
    S = int(lengths.max())
    src, tgt_in, tgt_out = (torch.full((B, n), PAD) for n in (S, S + 1, S + 1))
    for i, n in enumerate(lengths.tolist()):
        seq = torch.randint(3, V, (n,), generator=g)
        target = seq.flip(0) if reverse else seq
        src[i, :n] = seq
        tgt_in[i, 0], tgt_in[i, 1:n + 1] = BOS, target
        tgt_out[i, :n], tgt_out[i, n] = target, EOS
    return src, tgt_in, tgt_out


def check_learns(architecture: str, steps: int, reverse: bool):
    """Train a 2 + 2-layer model with Adam (one-cycle schedule); greedy and beam search must solve >= 95 of
    100 held-out sequences exactly."""
    torch.manual_seed(0)
    model = Seq2Seq.from_architecture(architecture, V, V, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2,
                                dropout=0.0, max_len=16, share_embeddings=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src, tgt_in, tgt_out = task_batch(g, 32, reverse)
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, V), tgt_out.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    src, _, tgt_out = task_batch(torch.Generator().manual_seed(1), 100, reverse)
    expected = [[t for t in row.tolist() if t > EOS] for row in tgt_out]
    greedy = greedy_decode(model, src, bos_id=BOS, eos_id=EOS)
    assert sum(g == e for g, e in zip(greedy, expected)) >= 95
    beam = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS)
    assert sum(b == e for b, e in zip(beam, expected)) >= 95


def test_learns_to_copy():
    check_learns("transformer", steps=200, reverse=False)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_learns_to_reverse(architecture):
    # MTSA's encoder needs more steps: at 600 it solved 94, 100 and 97 of 100 with seeds 0, 1, 2 (its kernel's
    # float32 rounding since the fp32-work-dtype change moved seed 0 from just above the bar to just below);
    # at 800, 100 with each
    check_learns(architecture, steps=800 if architecture == "mtsa-encoder" else 300, reverse=True)


def test_the_old_preset_names_still_work_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"Seq2Seq.from_preset is now Seq2Seq.from_architecture"):
        model = Seq2Seq.from_preset("man", 11, 11, d_model=16, num_heads=4, encoder_layers=1, decoder_layers=1)
    assert model.encoder_recipe == "dman>san>ffn"
    with pytest.warns(DeprecationWarning, match=r"Seq2Seq.PRESETS is now Seq2Seq.ARCHITECTURES"):
        assert Seq2Seq.PRESETS is Seq2Seq.ARCHITECTURES
