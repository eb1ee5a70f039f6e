"""The Performer-style baseline of the WildCat swap (subquad.experiments.performer): the
linear-time FAVOR+ form against its plain quadratic reference, the estimate against exact
softmax attention within its own Monte-Carlo error as the features grow, the orthogonal
Gaussian projection, the equal-memory rule and the layer that takes an exact layer's
weights."""

import math
from statistics import NormalDist

import pytest

torch = pytest.importorskip("torch")
from subquad.experiments import performer  # noqa: E402
from subquad.layers.exact import ExactAttention  # noqa: E402
from subquad.reference import exact_attention  # noqa: E402

# Chance that any element of a correct estimate lands outside its bound (Bonferroni over
# the elements; the seeds are fixed, so this is the chance the chosen draw is unlucky).
FAMILY_FAILURE = 1e-6
# The same multiple of a naive implementation's float32 error as flash-attention's tests.
NAIVE_ERROR_MULTIPLE = 2.0


def inputs(dtype=torch.float64, spread=0.5, seed=0):
    """q [2, 7, 4, 5], k [2, 11, 2, 5], v [2, 11, 2, 3]: odd sizes, grouped queries."""
    generator = torch.Generator().manual_seed(seed)
    q = spread * torch.randn(2, 7, 4, 5, generator=generator, dtype=torch.float64)
    k = spread * torch.randn(2, 11, 2, 5, generator=generator, dtype=torch.float64)
    v = torch.randn(2, 11, 2, 3, generator=generator, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def projection(features, dim=5, seed=1):
    return performer.orthogonal_gaussian(features, dim, torch.Generator().manual_seed(seed))


def test_the_linear_form_is_the_plain_reference_within_float32_round_off():
    w = projection(64)
    truth = performer.performer_attention_reference(*inputs(), w)
    fast = performer.performer_attention(*inputs(torch.float32), w)
    naive = performer.performer_attention_reference(*inputs(torch.float32), w)
    assert fast.dtype == torch.float32 and fast.shape == (2, 7, 4, 3)
    assert torch.isfinite(fast).all() and fast.abs().max() > 0
    naive_error = float((naive.double() - truth).abs().max())
    assert 0 < naive_error < 1e-4
    assert float((fast.double() - truth).abs().max()) <= NAIVE_ERROR_MULTIPLE * naive_error


def monte_carlo_bound(q, k, v, w, scale):
    """Per output element: the delta-method standard error of the ratio estimate
    mean_i(a_i) / mean_i(b_i) over the m features, a_i = phi_i(q) sum_j phi_i(k_j) v_j,
    b_i = phi_i(q) sum_j phi_i(k_j), from the features' own spread. It treats the features
    as independent; orthogonal ones have no more variance, so it bounds theirs."""
    heads = q.shape[2]
    phi_q = performer.positive_features(q, w, scale)  # [B, N, H, m]
    phi_k = performer.repeat_kv(performer.positive_features(k, w, scale), heads)
    b = phi_q * phi_k.sum(1, keepdim=True)  # [B, N, H, m]
    state = torch.einsum("bjhm,bjhe->bhme", phi_k, performer.repeat_kv(v, heads))
    a = phi_q.unsqueeze(-1) * state.unsqueeze(1)  # [B, N, H, m, Dv]
    estimate = a.mean(3) / b.mean(3).unsqueeze(-1)  # [B, N, H, Dv]
    residual = a - estimate.unsqueeze(3) * b.unsqueeze(-1)  # [B, N, H, m, Dv]
    return residual.std(3) / (math.sqrt(w.shape[0]) * b.mean(3).unsqueeze(-1))


def test_many_features_estimate_softmax_attention_within_the_monte_carlo_error():
    q, k, v = inputs()
    exact, _ = exact_attention(q, k, v)
    scale = 1 / math.sqrt(q.shape[-1])
    z = NormalDist().inv_cdf(1 - FAMILY_FAILURE / (2 * exact.numel()))
    errors = {}
    for features in (16, 16384):
        w = projection(features)
        estimate = performer.performer_attention(q, k, v, w)
        errors[features] = (estimate - exact).abs()
    bound = z * monte_carlo_bound(q, k, v, w, scale)
    assert (errors[16384] <= bound).all()
    # The bound is tight enough to tell softmax attention at another scale (1/D instead
    # of 1/sqrt(D)) apart, and the error shrinks as the features grow.
    other_scale, _ = exact_attention(q, k, v, scale=1 / q.shape[-1])
    assert ((other_scale - exact).abs() > bound).any()
    assert errors[16384].max() < errors[16].max() / 4


def test_the_projection_is_orthogonal_in_blocks_with_gaussian_row_norms():
    w = projection(13, dim=5)
    assert w.shape == (13, 5) and w.dtype == torch.float64
    for start in (0, 5, 10):
        block = w[start:start + 5]
        gram = block @ block.T
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() < 64 * torch.finfo(torch.float64).eps * gram.max()
    norms = w.norm(dim=1)
    assert norms.std() > 0  # independent chi norms, not unit rows
    assert torch.equal(w, projection(13, dim=5)) and not torch.equal(w, projection(13, 5, 2))
    # Each row is N(0, I): the mean squared norm of many rows is the dimension.
    many = projection(4000, dim=5).norm(dim=1).square()  # chi-square, 5 degrees, var 10
    z = NormalDist().inv_cdf(1 - FAMILY_FAILURE / 2)
    assert float(many.mean()) == pytest.approx(5, abs=z * math.sqrt(2 * 5 / 4000))


@pytest.mark.parametrize("rank, key_dim, value_dim", [(8, 16, 16), (1, 1, 1), (48, 16, 16),
                                                      (5, 59, 7)])
def test_equal_memory_features_fit_the_coreset_memory(rank, key_dim, value_dim):
    m = performer.equal_memory_features(rank, key_dim, value_dim)
    coreset = rank * (key_dim + value_dim + 1)  # keys, values and weights
    assert m * (value_dim + 1) <= coreset < (m + 1) * (value_dim + 1)


def test_equal_memory_features_by_hand_and_bad_sizes():
    assert performer.equal_memory_features(8, 16, 16) == 15  # 8 * 33 // 17
    with pytest.raises(ValueError, match="rank 0"):
        performer.equal_memory_features(0, 16, 16)


def test_the_layer_takes_an_exact_layer_weights_and_draws_its_features_from_the_seed():
    exact = ExactAttention(24, 4, kv_heads=2, bias=True)
    x = torch.randn(2, 9, 24, generator=torch.Generator().manual_seed(3))

    def layer(seed):
        new = performer.PerformerAttention(24, 4, kv_heads=2, features=40, seed=seed,
                                           scale=exact.scale)
        new.load_state_dict(exact.state_dict())  # strict: the projection is not state
        return new.eval()

    with torch.no_grad():
        y, _ = layer(0)(x)
        q, k, v = exact.project(x)
        expected = exact.w_o(performer.performer_attention(
            q, k, v, layer(0).projection, scale=exact.scale).flatten(-2))
        assert torch.isfinite(y).all() and y.abs().max() > 0
        assert torch.equal(y, expected)
        assert not torch.equal(y, layer(1)(x)[0])
        # Padding: each sequence as its tokens alone.
        mask = torch.ones(2, 9, dtype=torch.bool)
        mask[1, 6:] = False
        padded, _ = layer(0)(x, attention_mask=mask)
        alone, _ = layer(0)(x[1:, :6])
        assert torch.equal(padded[1, :6], alone[0])
        assert padded[1, 6:].abs().max() == 0
