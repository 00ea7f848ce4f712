"""maskattn.analysis.reach: the attention of second-sentence word pieces on the first sentence of a pair, and how far it
reaches — by hand on a 7-token pair, on a tiny random BERT (offline), through the command, and its errors."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _hf_helpers import offline, save_tiny_pretrained  # noqa: E402
from _train_helpers import WORDS, write_nli  # noqa: E402
from maskattn.hf import load_encoder  # noqa: E402
from maskattn.analysis.reach import cross_attention_reach, main, measure_reach  # noqa: E402

VOCABULARY = WORDS + ["no"]
# [CLS] p p [SEP] h h [SEP]: positions 0..6
SEGMENTS = torch.tensor([-1, 0, 0, -1, 1, 1, -1])


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_tiny_pretrained(tmp_path_factory.mktemp("reach") / "bert", VOCABULARY, layers=2, heads=4)


def test_reach_by_hand():
    probs = torch.zeros(1, 2, 7, 7)  # (layers, heads, n, n)
    probs[0, 0, 4, [1, 2, 3]] = torch.tensor([0.5, 0.25, 0.25])  # query 4: premise at distances 3 and 2, [SEP]
    probs[0, 0, 5, [0, 1, 5]] = torch.tensor([0.5, 0.25, 0.25])  # query 5: [CLS], premise at distance 4, itself
    probs[0, 1, 4, 4] = 1.0  # head 1 stays on the hypothesis
    probs[0, 1, 5, 2] = 1.0  # ... but for query 5, whose premise key is at distance 3
    cross, beyond = cross_attention_reach(probs, SEGMENTS, reaches=[0, 2, 3, 10])
    # per (head, query) premise mass: (0.75, 0.25, 0, 1) -> mean 0.5
    assert cross.tolist() == [0.5]
    # beyond 2: 0.5 (query 4, distance 3) + 0.25 (query 5, distance 4) + 1 (head 1, distance 3), / 4
    # beyond 3: 0.25 / 4; beyond 0 is all of it (the sentences never share a position); beyond 10: none
    assert beyond[:, 0].tolist() == pytest.approx([0.5, 1.75 / 4, 0.25 / 4, 0.0])


def test_reach_refuses_shapes_and_single_sentences():
    with pytest.raises(ValueError, match=r"\(layers, heads, n, n\) with n = 7"):
        cross_attention_reach(torch.zeros(1, 2, 6, 6), SEGMENTS, [5])
    with pytest.raises(ValueError, match="both sentences"):
        cross_attention_reach(torch.zeros(1, 1, 3, 3), torch.tensor([-1, 0, -1]), [5])


def test_measure_reach_on_a_tiny_bert(bert):
    pairs = [("the film was very good", "no the film was bad"), ("music and story", "the music")]
    with offline():
        model, tokenizer = load_encoder(bert, attn_implementation="eager")
        cross, beyond = measure_reach(model, tokenizer, pairs, [0, 1, 2, 40])
    assert cross.shape == (2,) and beyond.shape == (4, 2)
    assert ((cross > 0) & (cross < 1)).all()
    # [SEP] stands between the sentences: the nearest premise piece is 2 positions from a hypothesis query
    assert torch.allclose(beyond[0], cross) and torch.allclose(beyond[1], cross)
    assert (beyond[2] < cross).all()
    assert (beyond[3] == 0).all()  # every pair is shorter than 40 tokens


def test_measure_reach_needs_attention_probabilities(bert):
    model, tokenizer = load_encoder(bert, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        measure_reach(model, tokenizer, [("the film", "the music")], [5])
    with pytest.raises(ValueError, match="pairs is empty"):
        measure_reach(model, tokenizer, [], [5])


def test_command_prints_a_row_per_layer(bert, tmp_path, capsys):
    data = write_nli(tmp_path, n=6) / "train.jsonl"
    with offline():
        assert main(["--data", str(data), "--model", str(bert), "--limit", "4", "--reach", "1,3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"4 pairs of {data}")
    assert "| layer | on first-sentence word pieces | of it beyond ±1 | of it beyond ±3 |" in out
    assert [line.split("|")[1].strip() for line in out.splitlines()[3:]] == ["0", "1"]
    with pytest.raises(SystemExit):
        main(["--data", str(data), "--model", str(bert), "--reach", "five"])
