"""Rotary position embeddings (layers/rotary.py) and the exact layers' rope option: the
rotation keeps norms and makes q . k depend on the offset only, the C++ path equals the
reference path, finite differences prove the backward, decoding equals the full forward
(the sliding window's dropped keys do not reset positions), models without a learned
position table, and bad options raise naming the option. float64 throughout."""

import contextlib
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.layers needs it")
import subquad.layers as layers  # noqa: E402
from subquad import models, ops  # noqa: E402
from subquad.layers import rotary  # noqa: E402
from subquad.train import config as train_config  # noqa: E402
from subquad.train.tasks import model_options  # noqa: E402

EPS = torch.finfo(torch.float64).eps
F64_TOL = 1e-10  # the layer tests' float64 bound (C++ kernel vs torch math)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def assert_close(actual, expected, tol=F64_TOL, what=""):
    assert actual.shape == expected.shape, what
    assert torch.isfinite(actual).all() and torch.isfinite(expected).all(), what
    bound = tol * max(1.0, expected.abs().max().item())
    error = (actual - expected).abs().max().item()
    assert error <= bound, f"{what}: max abs error {error:.3g} > {bound:.3g}"


# ---- the rotation ----

@pytest.mark.parametrize("start", [0, 1, 37, 4093])
@pytest.mark.parametrize("head_dim", [2, 6, 64])
def test_rotation_matches_the_complex_reference_and_keeps_norms(start, head_dim):
    q = torch.randn(2, 13, 3, head_dim, dtype=torch.float64)
    k = torch.randn(2, 13, 1, head_dim, dtype=torch.float64)
    rq, rk = rotary.rotate(q, k, start)
    # angles up to ~4e3 rad: cos and sin of them are good to a few eps of the angle
    tol = 64 * EPS * max(1, start + 13)
    assert_close(rq, rotary.rotate_reference(q, start), tol, "q")
    assert_close(rk, rotary.rotate_reference(k, start), tol, "k")
    assert_close(rq.norm(dim=-1), q.norm(dim=-1), 64 * EPS, "norms")
    if start == 0:
        assert torch.equal(rq[:, 0], q[:, 0])  # position 0 turns by nothing
    assert (rq[:, 1:] - q[:, 1:]).abs().max() > 0.01


@pytest.mark.parametrize("shift", [1, 5, 1000])
def test_scores_depend_on_the_offset_only(shift):
    q = torch.randn(1, 11, 2, 8, dtype=torch.float64)
    k = torch.randn(1, 11, 2, 8, dtype=torch.float64)

    def scores(start):  # [B, H, T, T]
        rq, rk = rotary.rotate(q, k, start)
        return torch.einsum("bthd,bshd->bhts", rq, rk)

    tol = 64 * EPS * (shift + 11)
    assert_close(scores(shift), scores(0), tol, "shifted scores")
    # One query and one key vector at every position: score(i, j) is a function of i - j.
    q_same, k_same = q[:, :1].expand_as(q), k[:, :1].expand_as(k)
    rq, rk = rotary.rotate(q_same, k_same, 3)
    same = torch.einsum("bthd,bshd->bhts", rq, rk)[0, 0]  # [T, T]
    for offset in range(-10, 11):
        diagonal = torch.diagonal(same, offset)
        assert_close(diagonal, diagonal[:1].expand_as(diagonal), tol, f"offset {offset}")


def test_tables_are_shared_and_outlive_inference_mode():
    rotary._table.cache_clear()
    with torch.inference_mode():
        cos, _ = rotary.rotary_table(0, 5, 8, 10000.0, torch.float64, "cpu")
    assert not cos.is_inference()
    for start in range(5, 40):  # decoding steps read the one table
        rotary.rotary_table(start, 1, 8, 10000.0, torch.float64, "cpu")
    assert rotary._table.cache_info().currsize == 1
    layer = layers.build("exact", 16, 2, causal=True, rope=True).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64, requires_grad=True)
    layer(x)[0].sum().backward()  # saves the table made under inference_mode
    assert torch.isfinite(x.grad).all()


# ---- the layers ----

LAYERS = {  # name -> (options of layers.build, T)
    "exact-causal": (dict(attention="exact", dim=24, heads=4, kv_heads=2, causal=True), 13),
    "exact-bidirectional": (dict(attention="exact", dim=16, heads=2, causal=False), 7),
    "sliding-window": (dict(attention="sliding-window", dim=24, heads=4, kv_heads=1,
                            window=4), 13),
}


def build(case, **overrides):
    options, tokens = LAYERS[case]
    options = {**options, "rope": True, **overrides}
    return layers.build(options.pop("attention"), **options).double(), tokens


def values_and_gradients(layer, x, dy):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    y, _ = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_cpp_path_matches_the_reference_path(case):
    layer, tokens = build(case)
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    dy = torch.randn_like(x)
    y, dx, grads = values_and_gradients(layer, x, dy)
    with ops.reference_on_cpu():
        y_ref, dx_ref, grads_ref = values_and_gradients(layer, x, dy)
    assert y.abs().max() > 0 and dx.abs().max() > 0
    assert_close(y, y_ref, what="y")
    assert_close(dx, dx_ref, what="dx")
    for name in grads_ref:
        assert grads[name].abs().max() > 0, name
        assert_close(grads[name], grads_ref[name], what=name)


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_rope_changes_the_output(case):
    layer, tokens = build(case)
    plain, _ = build(case, rope=False)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(1, tokens, layer.dim, dtype=torch.float64)
    with torch.no_grad():
        with_rope, without = layer(x)[0], plain(x)[0]
    if layer.causal:  # token 0 sees itself alone, at position 0: no turn
        assert_close(with_rope[:, 0], without[:, 0], what="position 0")
    assert (with_rope - without).abs().max() > 1e-3


def test_finite_differences_prove_the_rotation_backward():
    q = torch.randn(2, 5, 2, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 1, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: rotary.rotate(q, k, 3), (q, k))


@pytest.mark.parametrize("case", ["exact-causal", "exact-bidirectional", "sliding-window"])
def test_finite_differences_prove_the_layer_backward(case):
    # Through x the check crosses W_q and W_k, the rotation and the attention; the weights'
    # gradients are the C++ = torch test's.
    options, _ = LAYERS[case]
    options = {**options, "dim": 8, "heads": 2, "rope": True}
    if "window" in options:
        options["window"] = 2
    layer = layers.build(options.pop("attention"), **options).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    with ops.reference_on_cpu():
        assert torch.autograd.gradcheck(lambda x: layer(x)[0], (x,))


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("tokens", [7, 13])
@pytest.mark.parametrize("case", ["exact-causal", "sliding-window"])
def test_prefill_then_decoding_equals_the_full_forward(case, tokens, reference):
    layer, _ = build(case)
    layer.eval()
    assert layer.window < tokens  # the window drops keys before the end
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    prefill = tokens // 2
    with torch.no_grad(), (ops.reference_on_cpu() if reference else contextlib.nullcontext()):
        full, _ = layer(x)
        cache = layer.init_cache(2)
        steps = [layer(x[:, :prefill], cache=cache)[0]]
        steps += [layer(x[:, t:t + 1], cache=cache)[0] for t in range(prefill, tokens)]
    assert cache.seen == tokens
    if layer.window:
        assert cache.length <= layer.window + 1
    assert_close(torch.cat(steps, dim=1), full, what="decoded")


def test_a_padded_batch_puts_each_sequence_at_position_zero():
    layer, tokens = build("exact-causal")
    mask = torch.ones(2, tokens, dtype=torch.long)
    mask[0, :4] = 0  # left padding: its tokens still start at position 0
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    with torch.no_grad():
        y, _ = layer(x, attention_mask=mask)
        alone, _ = layer(x[:1, 4:])
    assert_close(y[0, 4:], alone[0], what="left-padded row")


# ---- models ----

SMALL = dict(dim=32, heads=2, layers=2)
ROPE = {"exact": {"rope": True}, "sliding-window": {"rope": True, "window": 4}}


@pytest.mark.parametrize("family", [models.CausalLM, models.MaskedLM])
def test_models_without_a_position_table(family):
    default = family(64, 16, **SMALL)
    assert isinstance(default.positions, torch.nn.Embedding)
    assert any(name.startswith("positions.") for name, _ in default.named_parameters())
    model = family(64, 16, attention="exact", attention_options=ROPE,
                   position_embedding="none", **SMALL)
    assert model.positions is None
    assert not any(name.startswith("positions.") for name, _ in model.named_parameters())
    assert all(block.attention.rope for block in model.blocks)
    ids = torch.randint(64, (2, 9))
    out = model(ids)
    logits = out[0] if isinstance(out, tuple) else out
    assert logits.shape[:2] == (2, 9) and torch.isfinite(logits).all()


@pytest.mark.parametrize("attention", ["exact", "sliding-window"])
def test_cached_generation_with_rope_matches_the_full_forward(attention):
    model = models.CausalLM(64, 24, attention=attention, attention_options=ROPE,
                            position_embedding="none", **SMALL).double().eval()
    prompt = torch.randint(64, (2, 7))
    generated = model.generate(prompt, 9)
    logits, _ = model(generated[:, :-1])
    assert torch.equal(logits[:, 6:].argmax(-1), generated[:, 7:])


def test_the_config_reaches_the_model():
    raw = {"run": {"family": "lm"},
           "model": {"attention": "exact", "position_embedding": "none", "dim": 32,
                     "attention_options": {"exact": {"rope": True, "rope_base": 500.0}}}}
    config = train_config.resolve(raw)
    assert config["model"]["position_embedding"] == "none"
    model = models.CausalLM(64, 16, position_embedding=config["model"]["position_embedding"],
                            **model_options(config))
    attention = model.blocks[0].attention
    assert model.positions is None and attention.rope and attention.rope_base == 500.0
    default = train_config.resolve({"run": {"family": "mlm"}})
    assert default["model"]["position_embedding"] == "learned"


# ---- bad options ----

@pytest.mark.parametrize("options, message", [
    (dict(rope=True, rope_base=0.0), "rope_base: expected a positive"),
    (dict(rope=True, rope_base=-2), "rope_base: expected a positive"),
    (dict(rope=False, rope_base=math.nan), "rope_base: expected a positive"),
    (dict(rope=True, rope_base=math.inf), "rope_base: expected a positive"),
    (dict(rope=True, rope_base=True), "rope_base: expected a positive"),
    (dict(rope=1), "rope: expected a bool"),
    (dict(rope=True, dim=6, heads=2), "rope: .* head dim .* must be even, got 3"),
])
@pytest.mark.parametrize("attention", ["exact", "sliding-window"])
def test_bad_options_name_the_option(attention, options, message):
    options = {"dim": 16, "heads": 2, **options}
    if attention == "sliding-window":
        options["window"] = 3
    with pytest.raises(ValueError, match=message):
        layers.build(attention, **options)


def test_odd_head_dims_are_fine_without_rope_and_bad_rotations_raise():
    layers.build("exact", 6, 2)  # D = 3
    q = torch.randn(1, 4, 2, 6)
    with pytest.raises(ValueError, match="rope: .* must be even, got 5"):
        rotary.rotate(q[..., :5], q[..., :5])
    with pytest.raises(ValueError, match="start: expected an int >= 0"):
        rotary.rotate(q, q, -1)
    with pytest.raises(ValueError, match="k: expected"):
        rotary.rotate(q, q[:, :3])


def test_bad_position_embeddings_name_the_option():
    with pytest.raises(ValueError, match="position_embedding: expected one of"):
        models.CausalLM(64, 16, position_embedding="sinusoidal", **SMALL)
    with pytest.raises(ValueError, match="position_embedding: expected one of"):
        models.MaskedLM(64, 16, position_embedding=None, **SMALL)
    with pytest.raises(train_config.ConfigError, match="model.position_embedding: expected"):
        train_config.resolve({"run": {"family": "lm"}, "model": {"position_embedding": "rope"}})
    with pytest.raises(train_config.ConfigError, match="does not apply to family 'vit'"):
        train_config.resolve({"run": {"family": "vit"},
                              "model": {"position_embedding": "none"}})
