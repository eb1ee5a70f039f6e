"""The model invariants of subquad.layers, for every registry entry that has the feature:
a padded batch equals each sequence run alone (padding left, right, inside, a fully padded
row); prefill then token-by-token decoding equals the full forward. float64, NaN-poisoned
allocations, both the C++ path and the reference path."""

import contextlib

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.layers needs it")
import subquad  # noqa: E402
import subquad.layers as layers  # noqa: E402
from subquad import ops  # noqa: E402
from layer_cases import CASES, build, entry, nan_poisoned_allocations  # noqa: E402

F64_TOL = 1e-10


@pytest.fixture(autouse=True)
def poisoned_and_seeded():
    torch.manual_seed(0)
    with nan_poisoned_allocations():
        yield


# Entries whose kernels compute in float32 only (WildCat) get a float32 bound.
F32_TOL = 1e-5


def assert_close(actual, expected, what="", tol=F64_TOL):
    assert actual.shape == expected.shape, what
    assert torch.isfinite(actual).all() and torch.isfinite(expected).all(), what
    bound = tol * max(1.0, expected.abs().max().item())
    error = (actual - expected).abs().max().item()
    assert error <= bound, f"{what}: max abs error {error:.3g} > {bound:.3g}"


def padding_masks(tokens, multiple=1):
    """[5, T] masks: right padding, left padding, holes, no padding, all padding; token
    counts are multiples of `multiple` (trailing tokens of a row become padding)."""
    mask = torch.ones(5, tokens, dtype=torch.long)
    mask[0, tokens // 2 + 1:] = 0
    mask[1, :tokens // 3 + 1] = 0
    mask[2, 1::3] = 0
    mask[4] = 0
    for row in mask:
        extra = int(row.sum()) % multiple
        if extra:
            row[row.nonzero().squeeze(1)[-extra:]] = 0
    return mask


def reference_if(on: bool):
    """subquad.ops.reference_on_cpu() when `on`: the layer runs subquad.reference."""
    return ops.reference_on_cpu() if on else contextlib.nullcontext()


def cases_with(feature):
    return sorted(c for c in CASES if getattr(layers.capabilities(entry(c)), feature))


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", cases_with("padding_mask"))
def test_a_padded_batch_equals_each_sequence_alone(case, reference):
    layer, tokens = build(case)
    layer = layer.double().eval()
    mask = padding_masks(tokens, layer.length_multiple)
    x = torch.randn(mask.shape[0], tokens, layer.dim, dtype=torch.float64)
    with torch.no_grad(), reference_if(reference):
        y, _ = layer(x, attention_mask=mask)
        for b in range(mask.shape[0]):
            tokens_of_b = mask[b].nonzero().squeeze(1)
            padding_of_b = (mask[b] == 0).nonzero().squeeze(1)
            assert (y[b, padding_of_b] == 0).all(), f"row {b}: padding is not zero"
            if len(tokens_of_b):
                alone, _ = layer(x[b:b + 1, tokens_of_b])
                assert_close(y[b, tokens_of_b], alone[0], what=f"row {b}",
                             tol=F64_TOL if "float64" in layer.capabilities.dtypes else F32_TOL)


@pytest.mark.parametrize("case", cases_with("padding_mask"))
def test_padding_gradients_reach_tokens_only(case):
    if not layers.capabilities(entry(case)).backward:
        pytest.skip("inference-only entry")
    layer, tokens = build(case)
    layer = layer.double()
    mask = padding_masks(tokens, layer.length_multiple)[:3]
    x = torch.randn(3, tokens, layer.dim, dtype=torch.float64, requires_grad=True)
    y, _ = layer(x, attention_mask=mask)
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[mask == 0] == 0).all() and x.grad[mask == 1].abs().max() > 0


def causal_cached_cases():
    return sorted(c for c in cases_with("decoding_cache") if build(c)[0].causal)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", causal_cached_cases())
def test_prefill_then_decoding_equals_the_full_forward(case, reference):
    layer, tokens = build(case)
    layer = layer.double().eval()
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    prefill = tokens // 2 + 1
    with torch.no_grad(), reference_if(reference):
        full, _ = layer(x)
        cache = layer.init_cache(2, context=tokens)
        steps = [layer(x[:, :prefill], cache=cache)[0]]
        for t in range(prefill, tokens):
            y, returned = layer(x[:, t:t + 1], cache=cache)
            assert returned is cache
            steps.append(y)
    assert cache.seen == tokens
    assert_close(torch.cat(steps, dim=1), full, what="decoded")


def test_mlr_without_context_rejects_other_lengths():
    layer = layers.build("mlr", 16, 2, ranks=[2, 2], causal=False).eval()
    mask = torch.ones(1, 8)
    mask[0, 5:] = 0
    with pytest.raises(ValueError, match="not a multiple of 2"):
        layer(torch.randn(1, 8, 16), attention_mask=mask)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", causal_cached_cases())
def test_a_cache_rolls_back_and_copies(case, reference):
    # One token back: inside MLR's newest finest block, whose keys its level caches hold.
    layer, tokens = build(case)
    layer = layer.double().eval()
    x = torch.randn(1, tokens, layer.dim, dtype=torch.float64)
    with torch.no_grad(), reference_if(reference):
        full, _ = layer(x)
        cache = layer.init_cache(1, context=tokens)
        layer(x[:, :tokens - 1], cache=cache)
        assert cache.nbytes > 0
        copy = cache.clone()
        layer(torch.randn(1, 1, layer.dim, dtype=torch.float64), cache=cache)
        cache.truncate(tokens - 1)
        assert cache.seen == tokens - 1
        redone, _ = layer(x[:, tokens - 1:], cache=cache)
        from_copy, _ = layer(x[:, tokens - 1:], cache=copy)
    assert_close(redone, full[:, tokens - 1:], what="after truncate")
    assert_close(from_copy, full[:, tokens - 1:], what="from the copy")


def test_mlr_cache_keeps_only_the_current_blocks_keys():
    # ranks 2|1|1 over 16 tokens: level caches of 16 x 2, 8 x 1 and 4 x 1 keys per kv head.
    layer = layers.build("mlr", 8, 2, ranks=[2, 1, 1], context=16).double().eval()
    cache = layer.init_cache(1)
    with torch.no_grad():
        layer(torch.randn(1, 14, 8, dtype=torch.float64), cache=cache)
    keys = sum(t.numel() for t in cache._level_keys)
    assert keys == 2 * subquad.mlr_key_cache_prediction(16, [2, 1, 1])  # 2 kv heads
    cache.truncate(13)  # tokens 12 .. 13 share the finest block
    with pytest.raises(ValueError, match="rolls back past the start"):
        cache.truncate(11)


def test_a_cache_with_padding_raises():
    layer = layers.build("exact", 16, 4, causal=True)
    cache = layer.init_cache(2)
    mask = torch.ones(2, 3)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="cannot be combined with a cache"):
        layer(torch.randn(2, 3, 16), attention_mask=mask, cache=cache)


def test_bidirectional_layers_refuse_a_cache():
    layer = layers.build("exact", 16, 4, causal=False)
    with pytest.raises(ValueError, match="needs causal=True"):
        layer.init_cache(1)


@pytest.mark.parametrize("name, options, tokens", [
    ("sliding-window", dict(dim=16, heads=4, kv_heads=2, window=29), 120),
    ("cat-causal", dict(dim=12, heads=3), 120),
    ("mlr", dict(dim=16, heads=2, ranks=[2, 2, 2, 2], context=128), 120),
])
def test_long_prefill_then_decoding_equals_the_full_forward(name, options, tokens):
    layer = layers.build(name, **options).double().eval()
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    with torch.no_grad():
        full, _ = layer(x)
        cache = layer.init_cache(2)
        steps = [layer(x[:, :100], cache=cache)[0]]
        steps += [layer(x[:, t:t + 1], cache=cache)[0] for t in range(100, tokens)]
    assert_close(torch.cat(steps, dim=1), full, what="decoded")
