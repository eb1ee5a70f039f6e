"""The evaluation's fast paths give the straightforward computation's results (round-off)."""

import re

import pytest
import torch
import torch.nn.functional as F

from subquad.llm import evaluation


def _naive_metrics(reference, logits, targets):
    log_ref = F.log_softmax(reference.double(), -1)
    log_p = F.log_softmax(logits.double(), -1)
    kl = (log_ref.exp() * (log_ref - log_p)).sum(-1)
    return {"nll": float(F.nll_loss(log_p, targets)), "kl": float(kl.mean()),
            "top1": float((logits.argmax(-1) == reference.argmax(-1)).double().mean())}


def test_distribution_metrics_match_the_log_softmax_form():
    generator = torch.Generator().manual_seed(0)
    tokens, vocab = 37, 1001
    reference = 8 * torch.randn(tokens, vocab, generator=generator)  # peaked, like an LM
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    cases = [reference, reference + 0.3 * torch.randn(tokens, vocab, generator=generator),
             torch.randn(tokens, vocab, generator=generator) + 40.0]
    prepared = evaluation._ReferenceDistribution(reference)
    for logits in cases:
        fast = evaluation._distribution_metrics(prepared, logits, targets)
        naive = _naive_metrics(reference, logits, targets)
        assert abs(fast["nll"] - naive["nll"]) <= 1e-10 * max(1.0, abs(naive["nll"]))
        assert abs(fast["kl"] - naive["kl"]) <= 1e-10 * max(1.0, abs(naive["kl"]))
        assert fast["top1"] == naive["top1"]
    assert evaluation._distribution_metrics(prepared, reference, targets)["kl"] < 1e-12
    assert _naive_metrics(reference, cases[1], targets)["kl"] > 1e-3  # the cases differ


def _tiny_model(tmp_path):
    """The tiny random-weight GGUF model, float64, with its tokenizer."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    import tiny_gguf
    from subquad.llm import GgufTokenizer, LlamaModel, read_gguf

    file = read_gguf(str(tiny_gguf.write(tmp_path / "tiny.gguf")))
    return LlamaModel.from_gguf(file, GgufTokenizer(file.metadata), dtype=torch.float64)


def test_passkey_prefix_reuse_gives_the_cache_of_a_full_prefill(tmp_path):
    model = _tiny_model(tmp_path)
    prefix = evaluation.PasskeyPrefix(model, 150)  # extended by the longer prompts
    for length, depth in [(300, 0.0), (300, 0.5), (400, 1.0), (250, 0.75)]:
        context, shared = evaluation._passkey_parts(model, length, depth, 12345)
        assert 0 < shared < len(context)
        cache, logits = prefix.context_cache(context, shared)
        reference = model.new_cache(1)
        expected = model.prefill(torch.tensor([context]), reference)
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
        assert cache.seen == reference.seen == len(context)
        for mine, theirs in zip(cache.layers, reference.layers):
            torch.testing.assert_close(mine.keys, theirs.keys, rtol=0, atol=1e-10)
            torch.testing.assert_close(mine.values, theirs.values, rtol=0, atol=1e-10)
        # The prefix itself is untouched by the prompts built on it.
        assert prefix.cache.seen == len(prefix.ids) >= shared
    records = [evaluation.passkey_case(model, 300, 0.5, 3, ["nystrom", "compresskv"], [0.5],
                                       answer_tokens=3, prefix=p) for p in (None, prefix)]
    assert records[0] == records[1] and len(records[0]["runs"]) == 2


def test_passkey_answers_decoded_as_a_batch_equal_one_at_a_time(tmp_path, monkeypatch):
    from subquad.llm.presses import make_press

    model = _tiny_model(tmp_path)
    # One character per token, digits and "x": rows stop at a digit then an "x", at
    # different steps, and the others run to answer_tokens.
    monkeypatch.setattr(model, "detokenize", lambda ids, **_: "".join(
        "x" if i % 3 == 0 else str(i % 10) for i in ids))
    presses, ratios, answer_tokens = ["none", "nystrom", "compresskv"], [0.25, 0.875], 4
    record = evaluation.passkey_case(model, 300, 0.25, 2, presses, ratios,
                                     answer_tokens=answer_tokens)
    context = evaluation.passkey_prompt(model, 300, 0.25, record["key"])
    question = model.tokenize(evaluation.PASSKEY_QUESTION)
    cache = model.new_cache(1)
    model.prefill(torch.tensor([context]), cache)

    def answer_alone(press_cache):  # the plain greedy loop, one cache at a time
        logits = model.step(torch.tensor([question]), press_cache)[:, -1]
        new = []
        for _ in range(answer_tokens):
            new.append(int(logits[0].argmax()))
            if re.search(r"\d\D", model.detokenize(new)) or len(new) == answer_tokens:
                break
            logits = model.step(torch.tensor([[new[-1]]]), press_cache)[:, -1]
        return model.detokenize(new)

    assert record["full_answer"] == answer_alone(cache.clone())
    expected = []
    for name in presses:
        for ratio in ratios:
            press_cache = cache.clone()
            make_press(name, ratio, 2)(press_cache)
            expected.append((name, ratio, answer_alone(press_cache)))
    assert [(r["press"], r["ratio"], r["answer"]) for r in record["runs"]] == expected
    lengths = sorted({len(r["answer"]) for r in record["runs"]})
    assert len(lengths) > 1 and lengths[-1] == answer_tokens, lengths  # early stops and not
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="answer_tokens: expected an integer >= 1"):
            evaluation.passkey_case(model, 300, 0.25, 2, presses, ratios, answer_tokens=bad)


def _nystrom_bin_by_bin(keys, values, ratio, seed, block):
    """The uniform-Nyström press solved one bin at a time (its first form, kept as the
    reference of the batched one): keys [B, Hkv, S, D], values [B, Hkv, S, Dv] float64 ->
    (kept indices, log-weights, values)."""
    import math

    import numpy as np

    from subquad import _core
    from subquad.kv_coresets import BIN_RANK, fold, kept_entries, layout

    length, dim = keys.shape[2], keys.shape[3]
    kept = kept_entries(length, ratio)
    sinks, window, bins = layout(length, ratio)
    beta = 1.0 / math.sqrt(dim)
    generator = torch.Generator().manual_seed(seed * 1000003 + block)
    middle = torch.arange(sinks, length - window)
    edges = np.linspace(0, len(middle), bins + 1).round().astype(int)
    keep = torch.zeros(*keys.shape[:2], kept, dtype=torch.int64)
    log_weights = torch.zeros(*keys.shape[:2], kept, dtype=torch.float64)
    new_values = values.new_zeros(*keys.shape[:2], kept, values.shape[3])
    exact = torch.cat([torch.arange(sinks), torch.arange(length - window, length)])
    for b in range(keys.shape[0]):
        for h in range(keys.shape[1]):
            k, v = keys[b, h], values[b, h]
            centred = k - k.mean(0)
            keep[b, h, :len(exact)] = exact
            new_values[b, h, :len(exact)] = v[exact]
            at = len(exact)
            for c in range(bins):
                members = middle[edges[c]:edges[c + 1]]
                pick = members[torch.randperm(len(members), generator=generator)[:BIN_RANK]]
                kc = centred[members]
                radius = float(kc.norm(dim=-1).max())
                tau = _core.wildcat_temperature(beta, radius, radius, len(members))
                scaled = kc * math.sqrt(beta) / tau
                sq = (scaled * scaled).sum(-1)
                rows = torch.searchsorted(members, pick)
                gram = torch.exp(scaled[rows] @ scaled.T - sq[rows, None] / 2 - sq / 2)
                inverse = torch.linalg.pinv(gram[:, rows], hermitian=True, rtol=1e-10)
                shift = float(sq.max()) / 2
                rows_w = (inverse @ gram) * torch.exp(sq / 2 - shift)
                folded, lw, _ = fold(rows_w, shift - sq[rows] / 2, v[members])
                keep[b, h, at:at + len(pick)] = pick
                new_values[b, h, at:at + len(pick)] = folded
                log_weights[b, h, at:at + len(pick)] = lw
                at += len(pick)
    return keep, log_weights, new_values


def test_batched_nystrom_press_matches_the_bin_by_bin_solve():
    from subquad.cache import KVCache
    from subquad.llm.presses import make_press

    generator = torch.Generator().manual_seed(1)
    batch, kv_heads, length, dim = 2, 3, 709, 16  # 709: bins of two sizes
    k = 2 * torch.randn(batch, length, kv_heads, dim, generator=generator, dtype=torch.float64)
    k = k + torch.randn(dim, generator=generator, dtype=torch.float64)  # a common offset
    v = torch.randn(batch, length, kv_heads, dim, generator=generator, dtype=torch.float64)
    for ratio in (0.5, 0.875):
        layer = KVCache(batch, kv_heads, dim, dtype=torch.float64)
        layer.append(k, v)
        keep, log_weights, values = _nystrom_bin_by_bin(layer.keys, layer.values, ratio, 7, 4)
        make_press("nystrom", ratio, seed=7).compress_layer(4, layer)
        assert torch.equal(layer.positions, keep)
        finite = torch.isfinite(log_weights)
        assert finite.float().mean() > 0.9
        assert torch.equal(torch.isfinite(layer.log_weights), finite)
        torch.testing.assert_close(layer.log_weights[finite], log_weights[finite],
                                   rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(layer.values, values, rtol=1e-9, atol=1e-9)
