"""subquad.ops exact attention in bfloat16 (tensors through DLPack; NumPy has no bfloat16),
forward and backward, under FlashAttention's rule: against float64 at the same bfloat16
inputs, the error is at most twice that of the same attention written in bfloat16 torch
operations (matmuls in bfloat16, softmax in bfloat16), on odd sizes, GQA, causal and
window masks."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.ops needs it")
import subquad  # noqa: E402
import subquad.ops as st  # noqa: E402


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def reference(q, k, v, causal=False, window=0):
    """Textbook attention on [B, N, H, D] tensors in q's dtype (bfloat16: the naive
    implementation; float64: the reference), GQA by repeating kv heads."""
    B, N, H, D = q.shape
    M, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=2)
    v = v.repeat_interleave(H // Hkv, dim=2)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * (1 / math.sqrt(D))
    i = torch.arange(N).view(N, 1) + (M - N)
    j = torch.arange(M).view(1, M)
    visible = torch.ones(N, M, dtype=torch.bool)
    if causal or window > 0:
        visible &= j <= i
    if window > 0:
        visible &= j > i - window
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores.float() if q.dtype == torch.bfloat16 else scores, dim=-1)
    # A row that sees no key outputs zeros (its softmax would be 0 / 0).
    seen = visible.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~seen, 0), dim=-1) * seen
    out = torch.einsum("bhnm,bmhd->bnhd", probs, v)
    return out, lse


def max_error(x, reference):
    return (x.double() - reference).abs().max().item()


def check_rule(fast, naive, exact, what):
    fast_error, naive_error = max_error(fast, exact), max_error(naive, exact)
    slack = 4 * torch.finfo(torch.float32).eps * (1 + exact.abs().max().item())
    assert fast_error <= 2 * naive_error + slack, (what, fast_error, naive_error)
    assert torch.isfinite(fast.float()).all(), what


SHAPES = [
    # B, N, M, H, Hkv, D, Dv, options
    (1, 1, 1, 1, 1, 1, 1, dict()),
    (2, 7, 7, 4, 4, 8, 8, dict(window=3)),
    (1, 97, 257, 8, 2, 59, 64, dict()),
    (1, 257, 97, 6, 3, 64, 59, dict(causal=True)),
    (1, 129, 129, 4, 1, 128, 128, dict(causal=True)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:7])) + str(s[7]))
def test_bf16_forward_and_backward_within_twice_naive_error(shape):
    B, N, M, H, Hkv, D, Dv, options = shape
    q = torch.empty(B, N, H, D).uniform_(-2, 2).bfloat16()
    k = torch.empty(B, M, Hkv, D).uniform_(-2, 2).bfloat16()
    v = torch.empty(B, M, Hkv, Dv).uniform_(-2, 2).bfloat16()
    dout = torch.empty(B, N, H, Dv).uniform_(-1, 1).bfloat16()
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    naive_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    exact_inputs = [x.double().requires_grad_() for x in (q, k, v)]

    out, lse = st.exact_attention(*inputs, **options)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    naive_out, naive_lse = reference(*naive_inputs, **options)
    exact_out, exact_lse = reference(*exact_inputs, **options)
    check_rule(out, naive_out, exact_out.detach(), "out")
    finite = torch.isfinite(exact_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    check_rule(lse[finite], naive_lse[finite], exact_lse.detach()[finite], "lse")

    out.backward(dout)
    naive_out.backward(dout)
    exact_out.backward(dout.double())
    for name, x, naive, exact in zip("qkv", inputs, naive_inputs, exact_inputs):
        assert x.grad.dtype == torch.bfloat16
        check_rule(x.grad, naive.grad, exact.grad, "d" + name)


def test_bf16_gradient_of_lse_reaches_the_inputs():
    q, k, v = (torch.randn(1, 33, 2, 16).bfloat16().requires_grad_() for _ in range(3))
    exact = [x.detach().double().requires_grad_() for x in (q, k, v)]
    st.exact_attention(q, k, v, causal=True)[1].sum().backward()
    reference(*exact, causal=True)[1].sum().backward()
    for x, e in zip((q, k), exact):
        assert max_error(x.grad, e.grad) <= 2 ** -6 * (1 + e.grad.abs().max().item())


def test_bf16_reads_strided_views_in_place():
    qkv = torch.randn(1, 65, 3, 4, 32).bfloat16()  # [B, N, 3, H, D]
    q, k, v = qkv.unbind(2)
    out, _ = st.exact_attention(q, k, v)
    expected, _ = st.exact_attention(q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.equal(out, expected)


def test_bf16_core_binding_returns_dlpack_and_float32_lse():
    q = torch.randn(1, 8, 2, 16).bfloat16()
    out, lse = subquad.exact_attention_forward(q, q, q)
    assert torch.utils.dlpack.from_dlpack(out).dtype == torch.bfloat16
    assert lse.dtype.name == "float32"


def test_bf16_mixed_dtypes_are_refused_by_name():
    q = torch.randn(1, 4, 2, 8).bfloat16()
    with pytest.raises(ValueError, match="k: expected dtype bfloat16 like q, got float32"):
        subquad.exact_attention_forward(q, q.float(), q)
    out, lse = subquad.exact_attention_forward(q, q, q)
    out = torch.utils.dlpack.from_dlpack(out)
    with pytest.raises(ValueError, match="lse: expected dtype float32"):
        subquad.exact_attention_backward(q, q, q, out, torch.from_numpy(lse).bfloat16(), out)
