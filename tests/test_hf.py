"""maskattn.hf: convert() and register() on tiny BERT-family encoders built from a config."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AttentionMaskInterface, DistilBertConfig, DistilBertModel  # noqa: E402

import maskattn.hf as mh  # noqa: E402
from maskattn.hf.padding import key_padding_mask_function  # noqa: E402

from _hf_helpers import batch, converted, hidden, max_diff_at_tokens, tiny_model  # noqa: E402

EXACT = {
    "dman": [{"mechanism": "dman"}],
    "mtsa": [{"mechanism": "mtsa"}],
    "dman+mtsa": [{"mechanism": "dman", "layers": [0]}, {"mechanism": "mtsa", "layers": -1}],
}
MECHANISM_SPECS = {  # one layer of each, in a 4-layer model
    "dman": {"mechanism": "dman", "layers": 0},
    "mtsa": {"mechanism": "mtsa", "layers": 1},
    "csan2d": {"mechanism": "csan2d", "layers": 2, "window": 3},
    "sman": {"mechanism": "sman", "layers": 3, "radius": 2},
}


def perturb_new_parameters(model, scale: float = 0.5):
    """Move every parameter convert added away from its exact-start value."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, mh.ConvertedSelfAttention):
                for p in module.parameters(recurse=False):
                    p.add_(scale * torch.randn_like(p))


def test_import_maskattn_does_not_import_transformers():
    code = "import sys, maskattn, maskattn.functional; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------------
# exactness at initialisation
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["bert", "roberta"])
@pytest.mark.parametrize("case", sorted(EXACT))
def test_convert_equals_the_original_at_initialisation(arch, case):
    base = tiny_model(arch)
    model = converted(base, *EXACT[case])
    ids, mask = batch()
    with torch.no_grad():
        ref, out = hidden(base, ids, mask), hidden(model, ids, mask)
    assert max_diff_at_tokens(out, ref, mask) < 1e-5
    # the layers really run the new mechanism: moving its parameters moves the outputs
    perturb_new_parameters(model)
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(model, ids, mask), ref, mask) > 1e-3


@pytest.mark.parametrize("arch", ["xlm-roberta", "camembert", "electra"])
def test_other_supported_architectures_are_exact_with_dman(arch):
    base = tiny_model(arch)
    model = converted(base, {"mechanism": "dman"})
    ids, mask = batch()
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(model, ids, mask), hidden(base, ids, mask), mask) < 1e-5


def test_convert_reuses_the_pretrained_modules_and_records_itself():
    base = tiny_model()
    layer = base.encoder.layer[1]
    original, output_dense = layer.attention.self, layer.attention.output.dense
    model = mh.convert(base, "dman", layers=[-1], max_distance=16)
    assert model is base
    new = layer.attention.self
    assert isinstance(new, mh.ConvertedSelfAttention) and new.mechanism == "dman"
    assert (new.query, new.key, new.value) == (original.query, original.key, original.value)
    assert layer.attention.output.dense is output_dense
    assert new.distance_bias.shape == (33,) and new.head_bias.shape == (4,) and new.mask_query.shape == (32,)
    assert not isinstance(base.encoder.layer[0].attention.self, mh.ConvertedSelfAttention)
    assert model.config.maskattn_conversions == [
        {"mechanism": "dman", "layers": [1], "max_distance": 16, "head_bias_init": 0.0}]
    assert model.config._attn_implementation == mh.SDPA
    assert "encoder.layer.1.attention.self.query.weight" in model.state_dict()


def test_convert_takes_a_trainer_config_dict():
    spec = {"mechanism": "csan2d", "layers": [0, 1, 2], "window": 5}
    with pytest.warns(mh.ConversionWarning):
        model = mh.convert(tiny_model(layers=4), **spec)
    assert [type(layer.attention.self).__name__ for layer in model.encoder.layer] == \
        ["Csan2dSelfAttention"] * 3 + ["BertSelfAttention"]
    assert model.config.maskattn_conversions[0] == {**spec, "head_window": 3, "head_edges": "truncate"}


@pytest.mark.parametrize("spec, exact_up_to", [
    ({"mechanism": "csan1d", "window": 23}, 12),  # reaches ±11: covers 12 tokens
    ({"mechanism": "sman", "radius": 11}, 12),
    ({"mechanism": "csan2d", "window": 23, "head_window": 1}, 12),
])
def test_local_mechanisms_equal_the_original_only_where_the_window_covers_the_sentence(spec, exact_up_to):
    base = tiny_model()
    with pytest.warns(mh.ConversionWarning, match="changes the model's outputs at initialisation"):
        model = mh.convert(converted(base), **spec)
    ids, mask = batch(lengths=(exact_up_to, 14))  # the second sentence is longer than the window covers
    with torch.no_grad():
        ref, out = hidden(base, ids, mask), hidden(model, ids, mask)
    assert (out - ref)[0, :exact_up_to].abs().max() < 1e-5
    assert (out - ref)[1].abs().max() > 1e-3


def test_csan2d_with_neighbouring_heads_never_equals_the_original():
    base = tiny_model()
    with pytest.warns(mh.ConversionWarning, match="never equals"):
        model = mh.convert(converted(base), "csan2d", window=41, head_window=3)
    ids, mask = batch(lengths=(5, 4))
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(model, ids, mask), hidden(base, ids, mask), mask) > 1e-3


def test_mtsa_in_the_papers_form_warns_and_changes_the_outputs():
    base = tiny_model()
    with pytest.warns(mh.ConversionWarning, match="scale='log_sigmoid'.*head_masks='directional'"):
        model = mh.convert(converted(base), "mtsa", layers=0, scale="log_sigmoid", head_masks="directional")
    ids, mask = batch()
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(model, ids, mask), hidden(base, ids, mask), mask) > 1e-3


def test_exact_conversions_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mh.convert(tiny_model(layers=3), "dman", layers=[0, 1], head_bias_init=30.0)


# ------------------------------------------------------------------------------------------------------
# training behaviour
# ------------------------------------------------------------------------------------------------------

def _new_parameter_grads(model, ids, mask):
    model.zero_grad()
    out = hidden(model, ids, mask)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * weights).sum().backward()  # not out.sum(): LayerNorm makes it independent of the input
    self_attention = model.encoder.layer[0].attention.self
    return {name: p.grad.abs().max().item() for name, p in self_attention.named_parameters(recurse=False)}


def test_dman_gradients_reach_w_p_and_u():
    model = converted(tiny_model(), {"mechanism": "dman", "layers": 0}).train()
    ids, mask = batch()
    first = _new_parameter_grads(model, ids, mask)
    # at initialisation (P = 0) x_t·W and U_h shift whole rows of log M: softmax cancels them exactly
    assert first["distance_bias"] > 1e-3
    assert first["mask_query"] < 1e-6 and first["head_bias"] < 1e-6
    with torch.no_grad():
        model.encoder.layer[0].attention.self.distance_bias.normal_()  # once P has moved, W and U learn
    assert min(_new_parameter_grads(model, ids, mask).values()) > 1e-3


def test_mtsa_gradients_reach_the_source2token_map():
    model = converted(tiny_model(), {"mechanism": "mtsa", "layers": 0}).train()
    ids, mask = batch()
    first = _new_parameter_grads(model, ids, mask)
    assert first["s2t_score_weight"] > 1e-3  # W_s2 = 0 blocks the gradient of W_s1 and b_s1 at first
    assert first["s2t_hidden_weight"] == 0 and first["s2t_hidden_bias"] == 0
    with torch.no_grad():
        model.encoder.layer[0].attention.self.s2t_score_weight.normal_()  # once W_s2 has moved, all learn
    assert min(_new_parameter_grads(model, ids, mask).values()) > 1e-3


@pytest.mark.parametrize("name", sorted(MECHANISM_SPECS))
def test_padding_does_not_change_the_outputs_at_real_tokens(name):
    model = converted(tiny_model(layers=4), MECHANISM_SPECS[name])
    perturb_new_parameters(model)
    ids, mask = batch(lengths=(9, 9))
    padded_ids = torch.cat([ids, torch.full((2, 7), 1)], 1)
    padded_mask = torch.cat([mask, torch.zeros(2, 7, dtype=torch.long)], 1)
    padded_mask[1, 9:] = 1  # the second row's extra tokens are real: it must change, the first must not
    padded_ids[1, 9:] = 5
    with torch.no_grad():
        plain, padded = hidden(model, ids, mask), hidden(model, padded_ids, padded_mask)
    assert (padded[0, :9] - plain[0]).abs().max() < 1e-5
    assert (padded[1, :9] - plain[1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", sorted(MECHANISM_SPECS))
def test_attention_dropout_follows_the_config_in_training_only(name):
    spec = MECHANISM_SPECS[name]
    model = converted(tiny_model(layers=4, attention_dropout=0.5), spec)
    ids, mask = batch()
    with torch.no_grad():
        evaluation = [hidden(model, ids, mask) for _ in range(2)]
        model.train()
        training = [hidden(model, ids, mask) for _ in range(2)]
    assert torch.equal(*evaluation)
    assert max_diff_at_tokens(*training, mask) > 1e-3
    # without attention dropout, training mode computes what evaluation mode computes
    still = converted(tiny_model(layers=4, attention_dropout=0.0), spec)
    with torch.no_grad():
        expected = hidden(still, ids, mask)
        assert max_diff_at_tokens(hidden(still.train(), ids, mask), expected, mask) < 1e-6


def test_converted_model_trains():
    model = converted(tiny_model(layers=4), *MECHANISM_SPECS.values()).train()
    head = torch.nn.Linear(32, 2)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=3e-3)
    ids, mask = batch(lengths=(12, 8, 3, 10))
    labels = torch.tensor([0, 1, 0, 1])
    losses = []
    for _ in range(15):
        logits = head(hidden(model, ids, mask)[:, 0])
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("name", sorted(MECHANISM_SPECS))
def test_cpu_bf16_autocast_forward_and_backward_are_finite(name):
    model = converted(tiny_model(layers=4), MECHANISM_SPECS[name]).train()
    ids, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = hidden(model, ids, mask)
    (out.float() * torch.randn(out.shape)).sum().backward()
    assert torch.isfinite(out).all()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_output_attentions_returns_no_maps_instead_of_failing():
    model = converted(tiny_model(layers=4), *MECHANISM_SPECS.values())
    ids, mask = batch()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert out.attentions == ()  # like transformers' sdpa: the kernels build no n × n maps


def test_torch_compile_runs_and_matches_eager():
    model = converted(tiny_model(), {"mechanism": "mtsa", "layers": 0})
    perturb_new_parameters(model)
    ids, mask = batch()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model)(input_ids=ids, attention_mask=mask).last_hidden_state
        assert max_diff_at_tokens(compiled, hidden(model, ids, mask), mask) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MECHANISM_SPECS))
def test_torch_compile_forward_and_backward_match_eager(name):
    model = converted(tiny_model(layers=4), MECHANISM_SPECS[name]).train()
    perturb_new_parameters(model)
    ids, mask = batch()
    weights = torch.randn(3, 12, 32)

    def run(forward):
        model.zero_grad()
        out = forward(input_ids=ids, attention_mask=mask).last_hidden_state
        (out * weights).sum().backward()
        # a parameter outside the output's graph (BERT's pooler) has no gradient in eager mode and a zero one
        # from a compiled graph, which returns every output: compare values, None as zeros
        return out.detach(), {name: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                              for name, p in model.named_parameters()}

    torch._dynamo.reset()
    (out, grads), (expected, expected_grads) = run(torch.compile(model)), run(model)
    assert max_diff_at_tokens(out, expected, mask) < 1e-5
    torch.testing.assert_close(grads, expected_grads, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MECHANISM_SPECS))
def test_torch_compile_fullgraph_of_converted_layers(name):
    """The converted layers compile into one graph (no value-dependent branch in maskattn's kernels under
    compile) and give eager mode's outputs."""
    model = converted(tiny_model(layers=4), MECHANISM_SPECS[name]).eval()
    ids, mask = batch()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(input_ids=ids, attention_mask=mask).last_hidden_state
        eager = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert max_diff_at_tokens(compiled, eager, mask) < 1e-5


def test_torch_compile_fullgraph_runs_the_key_padding_implementation():
    plain = tiny_model()
    mh.register()
    plain.set_attn_implementation(mh.SDPA)
    ids, mask = batch()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(plain, fullgraph=True)(input_ids=ids, attention_mask=mask).last_hidden_state
        assert max_diff_at_tokens(compiled, hidden(tiny_model(), ids, mask), mask) < 1e-5


# ------------------------------------------------------------------------------------------------------
# register(): the parameter-free mechanisms as attention implementations
# ------------------------------------------------------------------------------------------------------

def test_register_names_every_mechanism_with_its_mask_function_and_is_idempotent():
    names = mh.register()
    assert names == ("maskattn_csan1d", "maskattn_csan2d", "maskattn_sman", "maskattn_sdpa")
    assert mh.register() == names
    for name in names:
        assert AttentionMaskInterface()[name] is key_padding_mask_function
    assert mh.register("csan2d", window=7) == "maskattn_csan2d_window_7"
    assert mh.register("sman", radius=4) == "maskattn_sman"
    assert mh.register("csan2d", head_edges="circular") == "maskattn_csan2d_head_edges_circular"


@pytest.mark.parametrize("mechanism, options", [("csan1d", {"window": 5}), ("csan2d", {"window": 3}),
                                                ("sman", {"radius": 1})])
def test_registered_implementation_equals_converting_every_layer(mechanism, options):
    base = tiny_model()
    by_implementation = converted(base)
    by_implementation.set_attn_implementation(mh.register(mechanism, **options))
    by_convert = converted(base, {"mechanism": mechanism, **options})
    ids, mask = batch()
    with torch.no_grad():
        out, expected = hidden(by_implementation, ids, mask), hidden(by_convert, ids, mask)
        assert max_diff_at_tokens(out, expected, mask) < 1e-6
        assert max_diff_at_tokens(out, hidden(base, ids, mask), mask) > 1e-3


@pytest.mark.parametrize("name", ["maskattn_csan2d", "maskattn_sman", "maskattn_sdpa"])
def test_registered_implementations_honour_padding(name):
    model = tiny_model()
    mh.register()
    model.set_attn_implementation(name)
    ids, mask = batch(lengths=(6, 6))
    padded_ids = torch.cat([ids, torch.full((2, 5), 7)], 1)  # real-looking ids: only the mask hides them
    padded_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.long)], 1)
    with torch.no_grad():
        assert max_diff_at_tokens(hidden(model, padded_ids, padded_mask)[:, :6], hidden(model, ids, mask), mask) < 1e-5
        assert (hidden(model, padded_ids)[:, :6] - hidden(model, ids, mask)).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------

def test_unsupported_architecture_lists_the_supported_ones():
    distil = DistilBertModel(DistilBertConfig(vocab_size=30, dim=16, n_layers=1, n_heads=2, hidden_dim=32))
    with pytest.raises(ValueError, match="model_type 'distilbert'.*supported: bert, roberta, xlm-roberta"):
        mh.convert(distil, "dman")
    with pytest.raises(TypeError, match="PreTrainedModel.*got Linear"):
        mh.convert(torch.nn.Linear(2, 2), "dman")
    decoder = tiny_model(is_decoder=True)
    with pytest.raises(ValueError, match="encoders only.*is_decoder=True"):
        mh.convert(decoder, "dman")


@pytest.mark.parametrize("layers, error, message", [
    (2, ValueError, r"layer index 2 is out of range: layers must be ints in 0\.\.1 \(or -2\.\.-1"),
    ([0, -3], ValueError, r"layer index -3 is out of range"),
    ([0, -2], ValueError, r"name a layer twice"),
    ([], TypeError, r"non-empty list"),
    ("0", TypeError, r"got str '0'"),
    ([0.0], TypeError, r"must hold ints.*got float 0.0"),
])
def test_bad_layers_name_the_valid_range(layers, error, message):
    with pytest.raises(error, match=message):
        mh.convert(tiny_model(), "dman", layers=layers)


@pytest.mark.parametrize("mechanism, options, error, message", [
    ("dmann", {}, ValueError, r"unknown mechanism 'dmann'; expected one of 'dman', 'mtsa', 'csan1d', 'csan2d', 'sman'"),
    ("csan2d", {"windw": 5}, ValueError, r"unknown option 'windw' for mechanism 'csan2d'; valid options: window, "
                                         r"head_window, head_edges"),
    ("dman", {"radius": 2}, ValueError, r"valid options: max_distance, head_bias_init"),
    ("csan1d", {"window": 4}, ValueError, r"window must be odd .*got 4"),
    ("csan2d", {"head_window": 5}, ValueError, r"head_window must not exceed the model's 4 heads, got 5"),
    ("csan2d", {"head_edges": "wrap"}, ValueError,
     r"unknown head_edges 'wrap'; expected one of 'truncate', 'circular'"),
    ("sman", {"radius": -1}, ValueError, r"radius must be an int >= 0 .*got -1"),
    ("sman", {"radius": 1.5}, TypeError, r"radius must be an int >= 0 .*got float 1.5"),
    ("mtsa", {"scale": "tanh"}, ValueError, r"unknown scale 'tanh'; expected one of 'log_sigmoid', 'identity'"),
    ("mtsa", {"head_masks": ["full"]}, ValueError, r"head_masks has 1 entries; expected one per head \(4\)"),
    ("mtsa", {"head_masks": ["full", "full", "sideways", "full"]}, ValueError, r"unknown mask name 'sideways'"),
    ("dman", {"max_distance": 0}, ValueError, r"max_distance must be an int >= 1"),
])
def test_bad_mechanism_or_options_list_the_valid_ones(mechanism, options, error, message):
    model = tiny_model()
    with pytest.raises(error, match=message):
        mh.convert(model, mechanism, **options)
    assert not hasattr(model.config, "maskattn_conversions")  # nothing was changed


def test_directional_masks_need_an_even_number_of_heads():
    with pytest.raises(ValueError, match="even number of heads.*got 3 heads"):
        mh.convert(tiny_model(heads=3, hidden=33), "mtsa", head_masks="directional")


def test_a_layer_is_converted_once():
    model = mh.convert(tiny_model(), "dman", layers=0)
    with pytest.raises(ValueError, match="layer 0 is already converted to 'dman'"):
        mh.convert(model, "mtsa", layers=[1, 0])
    assert not isinstance(model.encoder.layer[1].attention.self, mh.ConvertedSelfAttention)


def test_register_rejects_unknown_mechanisms_and_stray_options():
    with pytest.raises(ValueError, match="unknown mechanism 'dman' for register.*use maskattn.hf.convert"):
        mh.register("dman")
    with pytest.raises(ValueError, match=r"options \['window'\] need a mechanism"):
        mh.register(window=5)
    with pytest.raises(ValueError, match="unknown option 'radius' for mechanism 'csan1d'"):
        mh.register("csan1d", radius=3)


def test_masks_other_than_maskattn_key_padding_are_refused_with_the_remedy():
    model = converted(tiny_model(), {"mechanism": "dman", "layers": 0})
    ids, mask = batch()
    four_d = mask[:, None, None, :].expand(-1, 1, 12, -1).bool()
    with pytest.raises(ValueError, match=r"attention_mask reached a maskattn attention layer as a torch.bool "
                                         r"tensor of shape \(3, 1, 12, 12\).*pass a 2-D attention_mask"):
        model(input_ids=ids, attention_mask=four_d)
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="attention implementation is 'eager'"):
        model(input_ids=ids, attention_mask=mask)
