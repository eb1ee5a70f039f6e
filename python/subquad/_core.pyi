"""
subquad operators on CPU arrays (float32 or float64); see help(subquad).
"""

from collections.abc import Callable, Sequence
from typing import Any

from numpy.typing import NDArray

# A CPU array of dtype float32 or float64: a NumPy array, or at run time any object that
# exports DLPack or the buffer protocol. Outputs are new NumPy arrays of the inputs' dtype.
Array = NDArray[Any]


def cat_forward(z: Array, v: Array, *, convention: str = 'roll', path: str = 'automatic', threads: int = 0) -> NDArray[Any]:
    """
    CAT (circular-convolutional attention), forward.

    z [B, N, H] (scores), v [B, N, H, Dv] -> out [B, N, H, Dv]. Per (batch, head)
    s = softmax(z) over the sequence and the attention matrix is the circulant of s:
    convention "roll" A[i, j] = s[(j - i) mod N] (default), "conv" A[i, j] = s[(i - j) mod N].
    path "automatic" (direct gather below a measured N, FFT above), "direct" or "fft".
    Non-finite z or v propagates (NaN heads or columns).
    Layouts: z and v are read in place with their last or their sequence axis contiguous. The
    fastest from N = 1024 on, and for every backward, is sequence-last: v a [B, N, H, Dv] view
    of [B, H, Dv, N] memory (e.g. x.transpose(0, 3, 1, 2) of a C-contiguous [B, H, Dv, N]
    array), whose value columns the transforms run on in place (measured, one thread, H = 8:
    forward 1.13-1.79x, backward 1.28-3.02x faster than [B, N, H, Dv]); at N = 256 the float32
    forward on [B, N, H, Dv] was faster (0.76-0.88x the time). out comes back in v's layout (a
    [B, N, H, Dv] view of new [B, H, Dv, N] memory when sequence-last).
    """

def cat_backward(z: Array, v: Array, dout: Array, *, convention: str = 'roll', path: str = 'automatic', threads: int = 0) -> tuple[NDArray[Any], NDArray[Any]]:
    """
    CAT, backward: dout [B, N, H, Dv] -> (dz [B, N, H], dv [B, N, H, Dv]).

    Layouts as cat_forward's: dz comes back in z's layout, dv in v's.
    """

def cat_avgkey_forward(q: Array, k: Array, v: Array, *, scale: float | None = None, convention: str = 'roll', path: str = 'automatic', threads: int = 0) -> NDArray[Any]:
    """
    Averaged-key CAT, forward.

    q, k [B, N, H, D], v [B, N, H, Dv] -> out [B, N, H, Dv] with
    z[b, i, h] = scale * <q[b, i, h], mean_j k[b, j, h]> (scale None: 1/sqrt(D)), then CAT.
    """

def cat_avgkey_backward(q: Array, k: Array, v: Array, dout: Array, *, scale: float | None = None, convention: str = 'roll', path: str = 'automatic', threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    Averaged-key CAT, backward: -> (dq, dk [B, N, H, D], dv [B, N, H, Dv]).
    """

def cat_causal_forward(z: Array, v: Array, *, path: str = 'automatic', threads: int = 0) -> NDArray[Any]:
    """
    Causal CAT (lag convention), forward.

    z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv],
    out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]).
    path "automatic" (exact direct blocks near the diagonal, float64 FFT blocks elsewhere),
    "direct" (O(N^2 Dv)) or "fft" (FFT blocks down to single rows, no direct blocks: the test
    oracle of the FFT blocks). Non-finite z or v propagate to the rows that see them.
    Layouts as cat_forward's: sequence-last v (a [B, N, H, Dv] view of [B, H, Dv, N] memory) is
    read in place and out comes back in that layout.
    """

def cat_causal_backward(z: Array, v: Array, out: Array, dout: Array, *, path: str = 'automatic', threads: int = 0) -> tuple[NDArray[Any], NDArray[Any]]:
    """
    Causal CAT, backward from the forward's out: -> (dz [B, N, H], dv [B, N, H, Dv]).

    Layouts as cat_forward's: dz comes back in z's layout, dv in v's.
    """

def cat_causal_decode(z: Array, v: Array, *, tokens: int, threads: int = 0) -> NDArray[Any]:
    """
    Causal CAT decoding over caller-owned state: z [B, S, H], v [B, S, H, Dv] hold every
    token seen, the `tokens` new ones last -> out [B, tokens, H, Dv], rows S - tokens .. S - 1 of
    cat_causal_forward. Slices of larger buffers are read in place.
    """

def circulant2d_forward(q: Array, k: Array, v: Array, *, scale_mode: str = 'paper', scale: float | None = None, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any]]:
    """
    2D Circulant Attention (BCCB attention on a token grid), forward.

    q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> (out [B, Hg, Wg, H, Dv],
    weights [B, H, Hg, Wg]). Per (batch, head): a[m] = c * sum_n <q[n], k[n + m]> (indices
    modulo the grid), s = softmax(a) over all Hg * Wg entries (returned as weights),
    out[i] = sum_n s[n] v[i + n]. scale_mode "paper": c = 1 / (N sqrt(D)); "code":
    c = 1 / sqrt(N) (the released checkpoints, D = 1); scale: an explicit c overriding
    scale_mode. A non-finite input or overflowing logits make their head NaN.
    """

def circulant2d_backward(q: Array, k: Array, v: Array, dout: Array, *, scale_mode: str = 'paper', scale: float | None = None, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    2D Circulant Attention, backward.

    q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv], dout [B, Hg, Wg, H, Dv] -> (dq, dk, dv) of the
    shapes of q, k, v. The weights are recomputed from q and k. Options as the forward.
    """

def circulant2d_scale(tokens: int, head_dim: int, *, scale_mode: str = 'paper', scale: float | None = None) -> float:
    """
    The logit scale c for a grid of `tokens` = Hg * Wg and head dim `head_dim`.
    """

def circulant2d_grid_for_tokens(tokens: int) -> tuple[int, int]:
    """
    A grid (Hg, Wg) for `tokens`: Hg the largest divisor with Hg <= sqrt(tokens),
    Wg = tokens // Hg (4096 -> (64, 64), a prime p -> (1, p)).
    """

def check_threads(threads: int, name: str = 'threads') -> int:
    """
    The thread policy of every `threads` option: 0 (all cores) or 1 .. 1024.

    Returns `threads`, or raises ValueError naming `name` with the accepted range. An operator
    runs on min(threads, cores) threads. Front ends (subquad-llm --threads) check their thread
    counts with this once, before any work.
    """

def exact_attention_forward(q: Array, k: Array, v: Array, *, scale: float | None = None, causal: bool = False, window: int = 0, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any]]:
    """
    Exact softmax attention, forward.

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv], lse [B, H, N]).
    All float32, all float64, or all bfloat16 (through DLPack, e.g. torch.bfloat16: out comes
    back as a DLPack array for torch.from_dlpack, lse as float32).
    H % Hkv == 0 (query head h reads kv head h // (H // Hkv)).
    scale: None -> 1/sqrt(D). causal: bottom-right aligned (query i sees key j iff
    j <= i + M - N). window: 0 = none; w > 0 also requires j > i + M - N - w (implies causal).
    A row that sees no key outputs zeros and lse = -inf. threads: 0 = all cores.
    """

def exact_attention_backward(q: Array, k: Array, v: Array, out: Array, lse: Array, dout: Array, *, dlse: Array | None = None, scale: float | None = None, causal: bool = False, window: int = 0, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    Exact softmax attention, backward from the forward's out and lse.

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv], out, dout [B, N, H, Dv], lse [B, H, N],
    dlse [B, H, N] or None (no gradient reaches lse) -> (dq [B, N, H, D], dk [B, M, Hkv, D],
    dv [B, M, Hkv, Dv]); GQA sums over the query heads of a group. bfloat16 calls take a float32
    lse and dlse and return bfloat16 DLPack arrays. Options as
    exact_attention_forward (pass the same ones).
    """

def merge_attention(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array, *, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any]]:
    """
    Merges attention results over two disjoint key sets.

    out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out [B, N, H, Dv], lse [B, H, N]) with
    lse = log(exp(lse_a) + exp(lse_b)) and out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
    A part whose lse is -inf contributes nothing.
    """

def merge_attention_backward(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array, out: Array, lse: Array, *, dout: Array | None = None, dlse: Array | None = None, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    Backward of merge_attention from its inputs and outputs.

    out_a, out_b, out [B, N, H, Dv], lse_a, lse_b, lse [B, H, N]; dout [B, N, H, Dv] and dlse
    [B, H, N] may be None (no gradient there) -> (dout_a, dlse_a, dout_b, dlse_b) with
    w_p = exp(lse_p - lse): dout_p = w_p dout, dlse_p = w_p (<dout, out_p - out> + dlse).
    """

def set_fft_effort(effort: str) -> None:
    """
    FFTW's planner effort for transforms planned after the call (plans are cached per shape).
    "estimate" (the default) plans at once; "measure" times candidate algorithms on first use of
    a shape (up to seconds for large grids) and gives faster transforms: at a 96 x 96 grid 1.5-3x
    (src/circulant2d/README.md). `subquad bench` uses "measure".
    """

class outputs_from:
    """
    Takes every operator output from an allocator.

    Inside `with subquad._core.outputs_from(allocate):`, on this thread, each output of an
    operator is allocate(shape, dtype) (shape a tuple of ints, dtype "float32", "float64" or
    "bfloat16"), which must return a writable C-contiguous CPU array of that shape and dtype
    (e.g. a torch.empty tensor); the operator writes it whole and returns it. Outside, outputs
    are new NumPy arrays. subquad.ops uses this to return torch-allocated tensors.
    """

    def __init__(self, allocate: Callable) -> None: ...

    def __enter__(self) -> outputs_from: ...

    def __exit__(self, exc_type: object | None, exc_value: object | None, traceback: object | None) -> None: ...

def mlr_attention_forward(q: Array, k: Array, v: Array, *, ranks: Sequence[int], causal: bool = False, block_divide: bool = False, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any]]:
    """
    MLR attention (multi-level low-rank score matrix), forward.

    q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv] -> (out [B, T, H, Dv], lse [B, H, T]).
    ranks [r_1, ..., r_L] split D (sum = D); level l splits the sequence into 2^(l-1) blocks
    and adds <q_l[i], k_l[j]> / r_l when i and j share a level-l block; block_divide divides
    each score by the number of such levels. T must be divisible by 2^(L-1).
    """

def mlr_attention_backward(q: Array, k: Array, v: Array, out: Array, lse: Array, dout: Array, *, ranks: Sequence[int], causal: bool = False, block_divide: bool = False, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    MLR attention, backward from the forward's out and lse.

    -> (dq [B, T, H, D], dk [B, T, Hkv, D], dv [B, T, Hkv, Dv]). Options as the forward.
    """

def mlr_score_macs(tokens: int, ranks: Sequence[int]) -> float:
    """
    Multiply-adds of forming one head's scores, non-causal: T^2 sum_l r_l / 2^(l-1).
    """

def mlr_key_cache_prediction(context: int, ranks: Sequence[int]) -> int:
    """
    Level-cache floats of one kv head after `context` tokens: context sum_l r_l / 2^(l-1).
    """

def mlr_decode(q: Array, level_keys: Sequence[Array], v: Array, *, ranks: Sequence[int], block_divide: bool = False, context: int, threads: int = 0) -> NDArray[Any]:
    """
    Causal decoding of MLR attention over caller-owned state (blocks on the absolute
    positions 0 .. context-1, context divisible by 2^(L-1)).

    q [B, T, H, D]: the queries of positions S - T .. S - 1, in one block of the finest level;
    level_keys[l] [B, Hkv, s_l, r_l] (s_l = mlr_level_block_sizes(ranks, context)[l]): level l's
    columns of position p's key in slot p mod s_l, the T new keys stored; v [B, S, Hkv, Dv]: every
    value seen -> out [B, T, H, Dv], rows S - T .. S - 1 of the causal mlr_attention_forward.
    """

def mlr_level_block_sizes(ranks: Sequence[int], context: int) -> list[int]:
    """The block sizes context / 2^(l-1) of MLR decoding's level caches."""

def rms_cap_limit(fan_in: int, fan_out: int) -> float:
    """The RMS cap c = sqrt(min(fan_in, fan_out)) / fan_in of a weight block."""

def bilinear_mlr_project_forward(x: Array, weights: Sequence[Array], *, ranks: Sequence[int], heads: int = 1, level_scale: Sequence[float] = ..., layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> NDArray[Any]:
    """
    Bilinear MLR projection (one side of the bilinear MLR score).

    x [B, N, Dm], weights[l] [p_l, Dm / p_l, heads * r_l] (p_l = 2^(l-1)) -> y [B, N, heads, E],
    E = sum_l r_l p_l (bilinear_mlr_output_dim). Level l: per feature block a projection to r_l
    features per head, LayerNorm over the level's r_l p_l features (layer_norm), times
    level_scale[l] (empty: 1). rms_cap caps each level's weight RMS inside the forward.
    """

def bilinear_mlr_project_backward(x: Array, weights: Sequence[Array], dy: Array, *, ranks: Sequence[int], heads: int = 1, level_scale: Sequence[float] = ..., layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> tuple[NDArray[Any], list[NDArray[Any]]]:
    """
    Bilinear MLR projection, backward: dy [B, N, heads, E] -> (dx [B, N, Dm],
    [dweights[l] of the shapes of weights[l]]). Options as the forward.
    """

def bilinear_mlr_level_scales(ranks: Sequence[int], mup: bool = False) -> list[float]:
    """Level scales c_l = 1/sqrt(r_l p_l), or 8/(r_l p_l) under muP."""

def bilinear_mlr_output_dim(ranks: Sequence[int]) -> int:
    """E = sum_l r_l 2^(l-1)."""

def btt_project_forward(x: Array, w1: Array, w2: Array, *, heads: int = 1, rank: int = 1, layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> NDArray[Any]:
    """
    BTT projection (key side of the bilinear BTT score).

    x [B, N, D], w1 [a, b, heads b rank], w2 [heads b, a, a rank] -> y [B, N, heads, D] with
    (a, b) = btt_factors(D); LayerNorm over D (layer_norm), RMS-capped weights (rms_cap).
    """

def btt_project_backward(x: Array, w1: Array, w2: Array, dy: Array, *, heads: int = 1, rank: int = 1, layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    BTT projection, backward: dy [B, N, heads, D] -> (dx [B, N, D], dw1, dw2).
    """

def btt_factors(dim: int) -> tuple[int, int]:
    """
    D = a * b with b the smallest divisor of D greater than sqrt(D): (a, b).
    """

class MlbtcLevel:
    """
    One level of an MLBTC map (all arrays row-major, flattened).

    alpha; right R [right_blocks, n / right_blocks, right_cols]; right_perm (gather, length
    right_blocks * right_cols; empty: identity); left L [left_blocks, m / left_blocks,
    right_blocks * right_cols / left_blocks]; left_perm (length m; empty: identity).
    """

    def __init__(self, *, alpha: float = 1.0, right: Sequence[float], right_blocks: int = 1, right_cols: int = 1, right_perm: Sequence[int] = ..., left: Sequence[float], left_blocks: int = 1, left_perm: Sequence[int] = ...) -> None: ...

    @property
    def alpha(self) -> float: ...

    @alpha.setter
    def alpha(self, arg: float, /) -> None: ...

    @property
    def right(self) -> list[float]: ...

    @right.setter
    def right(self, arg: Sequence[float], /) -> None: ...

    @property
    def right_blocks(self) -> int: ...

    @right_blocks.setter
    def right_blocks(self, arg: int, /) -> None: ...

    @property
    def right_cols(self) -> int: ...

    @right_cols.setter
    def right_cols(self, arg: int, /) -> None: ...

    @property
    def right_perm(self) -> list[int]: ...

    @right_perm.setter
    def right_perm(self, arg: Sequence[int], /) -> None: ...

    @property
    def left(self) -> list[float]: ...

    @left.setter
    def left(self, arg: Sequence[float], /) -> None: ...

    @property
    def left_blocks(self) -> int: ...

    @left_blocks.setter
    def left_blocks(self, arg: int, /) -> None: ...

    @property
    def left_perm(self) -> list[int]: ...

    @left_perm.setter
    def left_perm(self, arg: Sequence[int], /) -> None: ...

class MlbtcMap:
    """
    An MLBTC linear map R^n -> R^m: y = sum_l alpha_l P_L blockdiag(L_l)
    P_R blockdiag(R_l^T) x. MlbtcMap(in_dim, out_dim, levels) validates every level.
    """

    def __init__(self, in_dim: int, out_dim: int, levels: Sequence[MlbtcLevel]) -> None: ...

    @property
    def in_dim(self) -> int: ...

    @property
    def out_dim(self) -> int: ...

    def apply(self, x: Array) -> NDArray[Any]:
        """x [in_dim] float64 -> y [out_dim]."""

    def dense(self) -> NDArray[Any]:
        """The dense [out_dim, in_dim] matrix."""

def wildcat_attention(q: Array, k: Array, v: Array, *, rank: int = 128, bins: int = 1, seed: int = 0, scale: float | None = None, method: str = 'wildcat', query_radius: str = 'keys', threads: int = 0) -> NDArray[Any]:
    """
    WildCat: softmax attention over a weighted coreset of keys (float32, no grad).

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] approximating
    softmax(scale q k^T) v (scale None: 1/sqrt(D)). rank: coreset points per (batch, kv head)
    over all bins; bins: contiguous key bins compressed independently (1 <= bins <= rank);
    seed: same seed, inputs and threads give identical output. method "wildcat" (randomly
    pivoted Cholesky + Nystrom weights), "uniform_nystrom" or "uniform_subsample" (also
    spelled with "-" as on the command line). query_radius: the R_Q of the kernel
    temperature, "keys" (R_Q = R_K, the bin's key radius, as CompressKV: the coreset depends on
    the keys alone) or "queries" (max ||q|| over the kv group's queries).
    rank >= M with one bin reproduces exact attention.
    """

def lambert_w0(x: float) -> float:
    """Principal branch W0 of the Lambert W function, x >= 0."""

def wildcat_temperature(beta: float, query_radius: float, key_radius: float, n: int) -> float:
    """
    The kernel temperature tau for n keys of radius key_radius and queries of radius query_radius under softmax scale beta.
    """

def weighted_kv_attention(q: Array, keys: Array, values: Array, log_scales: Array, lengths: Array | None = None, value_min: Array | None = None, value_max: Array | None = None, *, scale: float | None = None, threads: int = 0) -> NDArray[Any]:
    """
    Attention over weighted key-value entries the caller holds (float32, no grad).

    q [B, N, H, D]; keys [B, Hkv, L, D]; values [B, Hkv, L, Dv + 1] (the entry's value row, then
    its weight w); log_scales [B, Hkv, L] (finite, or -inf: never contributes); lengths
    [B, Hkv] int64 (None: every head holds L); value_min, value_max [B, Hkv, Dv] (None: no clamp)
    -> out [B, N, H, Dv] = clamp(sum_j p_j v_j / sum_j p_j w_j, value range) with
    p_j = exp(scale q.k_j + log_scale_j - max) (scale None: 1/sqrt(D)); every query sees every
    entry of its kv head. weighted_kv_entries(k, v, *selection) gives these arrays in order.
    """

def weighted_kv_entries(k: Array, v: Array, indices: Array, values: Array, weights: Array, log_scales: Array, counts: Array) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    The entries of a selection (what CompressKV.select, streaming_llm_select or
    snapkv_select return, passed as *selection) of k [B, M, Hkv, D], v [B, M, Hkv, Dv]:
    (keys [B, Hkv, L, D], values [B, Hkv, L, Dv + 1], log_scales [B, Hkv, L], lengths [B, Hkv]
    int64, value_min, value_max [B, Hkv, Dv]), padded to the longest head (keys and values 0, log
    scale -inf); the value range is that of all of v. The arguments of weighted_kv_attention.
    """

class CompressKV:
    """
    CompressKV: keeps `sink` first and `window` last tokens exactly and
    compresses the middle bin by bin to WildCat coresets built without queries.

    CompressKV(*, sink=32, window=32, compression_ratio=0.75, bin_rank=16, seed=0, scale=None);
    compression_ratio is the fraction of the middle removed (0.75 keeps 25%).
    """

    def __init__(self, *, sink: int = 32, window: int = 32, compression_ratio: float = 0.75, bin_rank: int = 16, seed: int = 0, scale: float | None = None) -> None: ...

    def select(self, k: Array, v: Array, *, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]:
        """
        k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> the entries kept: (indices [B, Hkv, L] int64, values [B, Hkv, L, Dv], weights [B, Hkv, L], log_scales [B, Hkv, L], counts [B, Hkv] int64): the entries kept per (batch, kv head), padded to the longest head L (index -1, value 0, weight 0, log scale -inf past a head's count); an entry counts as exp(log_scale) [value, weight] for the token at its index. Coreset entries carry W V and W (weights may be negative).
        """

    def bins(self, M: int) -> int:
        """Coreset bins the middle of M tokens is split into."""

def streaming_llm_select(k: Array, v: Array, *, sink: int = 32, window: int = 32) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    The first `sink` and last `window` tokens of k [B, M, Hkv, D], v [B, M, Hkv, Dv] (all of them when M <= sink + window), weight 1: (indices [B, Hkv, L] int64, values [B, Hkv, L, Dv], weights [B, Hkv, L], log_scales [B, Hkv, L], counts [B, Hkv] int64): the entries kept per (batch, kv head), padded to the longest head L (index -1, value 0, weight 0, log scale -inf past a head's count); an entry counts as exp(log_scale) [value, weight] for the token at its index.
    """

def snapkv_select(q_obs: Array, k: Array, v: Array, *, capacity: int = 256, pool_kernel: int = 7, scale: float | None = None, threads: int = 0) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    SnapKV: the prefix tokens the observation queries q_obs [B, W, H, D] vote for most, then the W window tokens, weight 1: (indices [B, Hkv, L] int64, values [B, Hkv, L, Dv], weights [B, Hkv, L], log_scales [B, Hkv, L], counts [B, Hkv] int64): the entries kept per (batch, kv head), padded to the longest head L (index -1, value 0, weight 0, log scale -inf past a head's count); an entry counts as exp(log_scale) [value, weight] for the token at its index.
    """

class Workspace:
    """
    Scratch memory reused across operator calls (C++ Context::workspace).

        ws = subquad.Workspace()
        with ws:
            out = subquad.cat_forward(z, v)   # the first call grows ws to what it needs
            out = subquad.cat_forward(z, v)   # same shapes: scratch taken from ws, no allocation

    Every subquad function called on this thread inside the `with` block takes its scratch from
    the workspace; outputs are new arrays as always, and results are bit-identical to calls
    without one. Blocks nest (the innermost workspace is used). One thread at a time: entering a
    workspace held by another thread raises ValueError. Operators that take their scratch from
    a workspace are listed in docs/conventions.md.
    """

    def __init__(self) -> None: ...

    def __enter__(self) -> Workspace: ...

    def __exit__(self, exc_type: object | None, exc_value: object | None, traceback: object | None) -> bool: ...

    @property
    def capacity_bytes(self) -> int:
        """Bytes held between calls."""

    @property
    def peak_bytes(self) -> int:
        """The most bytes one call has needed."""

    def release(self) -> None:
        """Frees the memory held (not inside the workspace's `with` block)."""
