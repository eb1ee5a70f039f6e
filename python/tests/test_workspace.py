"""subquad.Workspace: scratch reused across calls inside `with ws:` (C++ Context::workspace).
Repeated same-shape calls keep the workspace's capacity (nothing regrown) and give results
bit-identical to calls without a workspace; misuse is refused."""

import threading

import numpy as np
import pytest

import subquad


def _cat_inputs(rng, B=2, N=97, H=3, Dv=11):
    return rng.standard_normal((B, N, H)), rng.standard_normal((B, N, H, Dv))


def test_repeated_calls_reuse_the_workspace_and_match():
    rng = np.random.default_rng(0)
    z, v = _cat_inputs(rng)
    dout = rng.standard_normal(v.shape)
    q = rng.standard_normal((2, 5, 7, 3, 4))
    reference = [
        subquad.cat_causal_forward(z, v, threads=1),
        subquad.cat_forward(z, v, threads=1),
        subquad.circulant2d_forward(q, q, q, threads=1)[0],
    ]
    ws = subquad.Workspace()
    assert ws.capacity_bytes == 0
    with ws as entered:
        assert entered is ws
        first = [
            subquad.cat_causal_forward(z, v, threads=1),
            subquad.cat_forward(z, v, threads=1),
            subquad.circulant2d_forward(q, q, q, threads=1)[0],
        ]
        capacity = ws.capacity_bytes
        assert capacity > 0
        assert ws.peak_bytes == capacity
        for _ in range(3):
            again = [
                subquad.cat_causal_forward(z, v, threads=1),
                subquad.cat_forward(z, v, threads=1),
                subquad.circulant2d_forward(q, q, q, threads=1)[0],
            ]
            assert ws.capacity_bytes == capacity
            for a, r in zip(again, reference):
                np.testing.assert_array_equal(a, r)
        dz, dv = subquad.cat_causal_backward(z, v, first[0], dout, threads=1)
    for a, r in zip(first, reference):
        np.testing.assert_array_equal(a, r)
        assert np.isfinite(a).all() and np.abs(a).max() > 0
    np.testing.assert_array_equal(
        dz, subquad.cat_causal_backward(z, v, first[0], dout, threads=1)[0])
    ws.release()
    assert ws.capacity_bytes == 0


def test_outside_the_block_no_workspace_is_used():
    rng = np.random.default_rng(1)
    z, v = _cat_inputs(rng)
    ws = subquad.Workspace()
    with ws:
        pass
    subquad.cat_causal_forward(z, v)
    assert ws.capacity_bytes == 0


def test_blocks_nest_and_the_innermost_is_used():
    rng = np.random.default_rng(2)
    z, v = _cat_inputs(rng)
    outer, inner = subquad.Workspace(), subquad.Workspace()
    with outer:
        with inner:
            subquad.cat_causal_forward(z, v)
        assert inner.capacity_bytes > 0 and outer.capacity_bytes == 0
        subquad.cat_causal_forward(z, v)
        assert outer.capacity_bytes > 0


def test_release_inside_the_block_and_other_threads_are_refused():
    ws = subquad.Workspace()
    errors = []
    with ws:
        with pytest.raises(ValueError, match="release"):
            ws.release()

        def enter_elsewhere():
            try:
                with ws:
                    pass
            except ValueError as error:
                errors.append(str(error))

        thread = threading.Thread(target=enter_elsewhere)
        thread.start()
        thread.join()
    assert errors and "another thread" in errors[0]
    with pytest.raises(ValueError, match="without a matching"):
        ws.__exit__(None, None, None)
