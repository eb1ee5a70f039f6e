"""subquad: fast softmax attention beyond O(N^2) on NumPy arrays.

Every operator of the C++ library, with the C++ names and argument names:

- exact attention: exact_attention_forward, exact_attention_backward (from dout and dlse),
  merge_attention, merge_attention_backward
- CAT: cat_forward, cat_backward, cat_avgkey_forward, cat_avgkey_backward,
  cat_causal_forward, cat_causal_backward, cat_causal_decode
- 2D Circulant Attention: circulant2d_forward, circulant2d_backward, circulant2d_scale,
  circulant2d_grid_for_tokens
- FFT planner effort of CAT and Circulant Attention: set_fft_effort
- structured attention: mlr_attention_forward, mlr_attention_backward, mlr_decode,
  mlr_level_block_sizes, mlr_score_macs, mlr_key_cache_prediction; bilinear_mlr_project_forward / _backward,
  bilinear_mlr_level_scales, bilinear_mlr_output_dim, rms_cap_limit;
  btt_project_forward / _backward, btt_factors; MlbtcLevel, MlbtcMap
- WildCat (float32, forward only): wildcat_attention, lambert_w0, wildcat_temperature,
  CompressKV (select), streaming_llm_select, snapkv_select (a select returns the entries
  kept: indices, values, weights, log scales, counts), weighted_kv_entries (their arrays),
  weighted_kv_attention (attention over them)
- scratch reuse: Workspace (``with subquad.Workspace() as ws:``, C++ Context::workspace)
- where outputs come from: outputs_from (``with subquad.outputs_from(allocate):``)
- the thread policy: check_threads
Options are keyword-only; ``threads=0`` uses all cores, at most 1024 threads are accepted.
Ctrl-C stops a running kernel: the call raises KeyboardInterrupt.

Arrays
    Inputs are CPU arrays of dtype float32 or float64 (NumPy arrays, or any object
    exporting DLPack or the buffer protocol, such as CPU torch tensors without grad);
    all arrays of one call share one dtype. Strided views (slices, transposed leading
    axes) are read in place without copies as long as the last dimension is contiguous
    (stride 1) and no stride is negative; otherwise ValueError is raised: pass
    ``numpy.ascontiguousarray(x)``. Nothing is converted implicitly. Outputs are new
    C-contiguous NumPy arrays (inside ``with subquad.outputs_from(allocate):``, whatever
    allocate(shape, dtype) returns, e.g. torch tensors). The GIL is released while a kernel
    runs.

Errors
    ValueError: a bad argument (dtype, rank, shape, option), with the C++ message naming
    the argument, the expected and the actual value. RuntimeError: any other failure in
    the library. TypeError: an argument that is not an array at all.

``subquad.ops`` (imported on demand, needs PyTorch) has them as torch custom operators
(C++ kernels on CPU tensors, ``subquad.reference`` on other devices); ``subquad.layers``
has the attention layers built on them (one nn.Module per mechanism, a registry).
"""

from ._core import (
    # exact attention
    exact_attention_backward,
    exact_attention_forward,
    merge_attention,
    merge_attention_backward,
    # CAT: circular-convolutional attention
    cat_avgkey_backward,
    cat_avgkey_forward,
    cat_backward,
    cat_causal_backward,
    cat_causal_decode,
    cat_causal_forward,
    cat_forward,
    # 2D Circulant Attention
    circulant2d_backward,
    circulant2d_forward,
    circulant2d_grid_for_tokens,
    circulant2d_scale,
    # FFT planner effort (CAT, 2D Circulant Attention)
    set_fft_effort,
    # structured: MLR attention, bilinear MLR / BTT projections, MLBTC
    MlbtcLevel,
    MlbtcMap,
    bilinear_mlr_level_scales,
    bilinear_mlr_output_dim,
    bilinear_mlr_project_backward,
    bilinear_mlr_project_forward,
    btt_factors,
    btt_project_backward,
    btt_project_forward,
    mlr_attention_backward,
    mlr_attention_forward,
    mlr_decode,
    mlr_key_cache_prediction,
    mlr_level_block_sizes,
    mlr_score_macs,
    rms_cap_limit,
    # WildCat coreset attention and KV-cache compression (float32, forward only)
    CompressKV,
    lambert_w0,
    snapkv_select,
    streaming_llm_select,
    weighted_kv_attention,
    weighted_kv_entries,
    wildcat_attention,
    wildcat_temperature,
    # scratch memory reused across calls: `with subquad.Workspace() as ws:`
    Workspace,
    # where outputs come from: `with subquad.outputs_from(allocate):`
    outputs_from,
    # the thread policy of every `threads` option
    check_threads,
)

# Lazy negative / conjugate torch views are materialised before they reach C++ (_views.py).
from ._views import materialise_methods as _materialise_methods  # noqa: E402
from ._views import materialising as _materialising  # noqa: E402

for _name, _value in list(globals().items()):
    if _name.startswith("_") or not callable(_value):
        continue
    if isinstance(_value, type):
        if _value.__module__ == _core.__name__:  # decoders, caches, CompressKV
            _materialise_methods(_value)
    else:
        globals()[_name] = _materialising(_value)
del _name, _value

__version__ = "0.1.0"

__all__ = [name for name in dir() if not name.startswith("_")]
