"""subquad-llm as a careless or hostile user drives it: every case ends in one clear line,
`subquad-llm: error: ...`, and exit status 2, never a traceback, a hang or a silent wrong
answer; and corrupt GGUF files end in `subquad-llm: error: <file>: ...`.

The cases are a table (CASES, CORRUPT_GGUFS) run in-process on a tiny model (tiny_gguf.py,
context length 512); `python tests/test_llm_cli_hostile.py` runs the same table as
subprocesses and counts the cases that end in a traceback (the count issue 29 asks for).
"""

import io
import json
import os
import re
import struct
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import tiny_gguf  # noqa: E402

CONTEXT = 512  # the tiny model's llama.context_length
TEXT = ("Anne Elliot walked along the shore. The sea was grey and the wind was cold. " * 60)
OK = "ok"  # the case must succeed (exit 0): a limit that is legal must stay legal

# (case id, argv, what the error line must match, or OK). --model {model} is prepended
# unless the case names its own model. Placeholders are paths made by `fixtures`.
CASES = [
    # the global options
    ("threads-negative", ["--threads", "-1", "generate", "hi"],
     r"--threads.*0 \(all cores\) to 1024.*-1"),
    ("threads-huge", ["--threads", "100000", "generate", "hi"], r"--threads.*to 1024.*100000"),
    ("threads-text", ["--threads", "two", "generate", "hi"], r"--threads.*'two'"),
    ("threads-all-cores", ["--threads", "0", "generate", "hi", "--tokens", "2"], OK),
    ("model-missing", ["--model", "{missing}", "generate", "hi"], r"{missing}: no such file"),
    ("model-directory", ["--model", "{dir}", "generate", "hi"], r"{dir}: is a directory"),
    ("model-text-file", ["--model", "{text}", "generate", "hi"], r"{text}: not a readable GGUF"),
    # generate
    ("generate-empty-prompt", ["generate", ""], r"prompt: .*no tokens"),
    ("generate-non-utf8-prompt", ["generate", "caf\udce9"], r"prompt.*not valid UTF-8"),
    ("generate-tokens-negative", ["generate", "hi", "--tokens", "-1"], r"--tokens.*>= 0.*-1"),
    ("generate-tokens-zero", ["generate", "hi", "--tokens", "0"], OK),
    ("generate-ratio-one", ["generate", "hi", "--press", "compresskv", "--ratio", "1"],
     r"--ratio.*\[0, 1\).*1"),
    ("generate-ratio-negative", ["generate", "hi", "--ratio", "-0.5"], r"--ratio.*\[0, 1\)"),
    ("generate-ratio-nan", ["generate", "hi", "--ratio", "nan"], r"--ratio.*nan"),
    ("generate-past-context", ["generate", "hi", "--tokens", "1000"],
     r"--tokens.*context length 512"),
    ("generate-long-prompt", ["generate", "x" * 600], r"context length 512"),
    ("generate-press-unknown", ["generate", "hi", "--press", "h2o"],
     r"--press: invalid choice: 'h2o'"),
    ("generate-press-retired", ["generate", "hi", "--press", "snapkv", "--ratio", "0.5"],
     r"--press: snapkv: retired; use kvpress's SnapKVPress \(subquad.kvstudy runs kvpress's "
     r"presses\)$"),
    ("generate-compresskv-keeps-nothing",
     ["generate", "Hi", "--press", "compresskv", "--ratio", "0.9", "--tokens", "3"],
     OK),
    ("generate-compresskv-short",
     ["generate", "Hi", "--chat", "--press", "compresskv", "--ratio", "0.5", "--tokens", "3"],
     OK),
    # perplexity
    ("perplexity-n-ctx-zero", ["perplexity", "--text", "{text}", "--n-ctx", "0"],
     r"--n-ctx.*>= 2.*0"),
    ("perplexity-n-ctx-one", ["perplexity", "--text", "{text}", "--n-ctx", "1"], r"--n-ctx.*>= 2"),
    ("perplexity-n-ctx-past-context", ["perplexity", "--text", "{text}", "--n-ctx", "600"],
     r"--n-ctx.*context length 512"),
    ("perplexity-n-ctx-at-context",
     ["perplexity", "--text", "{text}", "--n-ctx", "512", "--max-chunks", "1"],
     OK),
    ("perplexity-max-chunks-zero",
     ["perplexity", "--text", "{text}", "--n-ctx", "64", "--max-chunks", "0"],
     r"--max-chunks.*>= 1"),
    ("perplexity-max-chunks-negative", ["perplexity", "--text", "{text}", "--max-chunks", "-2"],
     r"--max-chunks.*>= 1"),
    ("perplexity-text-missing", ["perplexity", "--text", "{missing}", "--n-ctx", "64"],
     r"{missing}: no such file"),
    ("perplexity-text-directory", ["perplexity", "--text", "{dir}", "--n-ctx", "64"],
     r"{dir}: is a directory"),
    ("perplexity-text-not-utf8", ["perplexity", "--text", "{latin1}", "--n-ctx", "64"],
     r"{latin1}: not UTF-8"),
    ("perplexity-text-empty", ["perplexity", "--text", "{empty}", "--n-ctx", "64"],
     r"fewer than one chunk"),
    ("perplexity-out-directory",
     ["perplexity", "--text", "{text}", "--n-ctx", "64", "--out", "{dir}"],
     r"--out.*{dir}.*is a directory"),
    ("perplexity-out-under-file",
     ["perplexity", "--text", "{text}", "--n-ctx", "64", "--out", "{text}/x.jsonl"],
     r"--out.*not a directory"),
    # eval-press
    ("eval-press-context-zero",
     ["eval-press", "--text", "{text}", "--context", "0", "--out", "{fresh}"],
     r"--context.*>= 1"),
    ("eval-press-continuation-zero",
     ["eval-press", "--text", "{text}", "--continuation", "0", "--out", "{fresh}"],
     r"--continuation.*>= 1"),
    ("eval-press-docs-zero", ["eval-press", "--text", "{text}", "--docs", "0", "--out", "{fresh}"],
     r"--docs.*>= 1"),
    ("eval-press-ratio-one",
     ["eval-press", "--text", "{text}", "--ratio", "1.0", "--out", "{fresh}"],
     r"--ratio.*\[0, 1\)"),
    ("eval-press-past-context",
     ["eval-press", "--text", "{text}", "--context", "500", "--continuation", "100", "--out",
      "{fresh}"],
     r"--context.*--continuation.*context length 512"),
    ("eval-press-no-document",
     ["eval-press", "--text", "{short}", "--context", "64", "--continuation", "8", "--out",
      "{fresh}"],
     r"--text.*fewer than one document"),
    ("eval-press-out-corrupt",
     ["eval-press", "--text", "{text}", "--context", "32", "--continuation", "4", "--docs", "1",
      "--press", "compresskv", "--ratio", "0.5", "--out", "{garbage}"],
     r"{garbage}: line 1: not a JSON record"),
    ("eval-press-out-other-records",
     ["eval-press", "--text", "{text}", "--context", "32", "--continuation", "4", "--docs", "1",
      "--out", "{otherjsonl}"],
     r"{otherjsonl}: line 1: .*'context'"),
    ("eval-press-press-retired",
     ["eval-press", "--text", "{text}", "--press", "compresskv", "knorm", "--out", "{fresh}"],
     r"--press: knorm: retired; use kvpress's KnormPress"),
    ("eval-press-deadline-nan",
     ["eval-press", "--text", "{text}", "--deadline", "nan", "--out", "{fresh}"],
     r"--deadline.*nan"),
    ("eval-press-ok",
     ["eval-press", "--text", "{text}", "--context", "32", "--continuation", "4", "--docs", "1",
      "--press", "nystrom", "--ratio", "0.5", "--out", "{fresh}"],
     OK),
    # passkey
    ("passkey-depth-negative", ["passkey", "--depths", "-1", "--out", "{fresh}"],
     r"--depths.*\[0, 1\].*-1"),
    ("passkey-depth-two", ["passkey", "--depths", "2", "--out", "{fresh}"],
     r"--depths.*\[0, 1\].*2"),
    ("passkey-depth-nan", ["passkey", "--depths", "nan", "--out", "{fresh}"], r"--depths.*nan"),
    ("passkey-length-zero", ["passkey", "--lengths", "0", "--out", "{fresh}"], r"--lengths.*>= 1"),
    ("passkey-length-too-short",
     ["passkey", "--lengths", "50", "--depths", "0.5", "--seeds", "1", "--full-only", "--out",
      "{fresh}"],
     r"--lengths.*50.*cannot hold the template"),
    ("passkey-length-huge", ["passkey", "--lengths", "100000", "--out", "{fresh}"],
     r"--lengths.*100000.*context length 512"),
    ("passkey-length-past-context", ["passkey", "--lengths", "510", "--out", "{fresh}"],
     r"--lengths.*510.*context length 512"),
    ("passkey-seeds-zero", ["passkey", "--seeds", "0", "--out", "{fresh}"], r"--seeds.*>= 1"),
    ("passkey-first-seed-negative", ["passkey", "--first-seed", "-1", "--out", "{fresh}"],
     r"--first-seed.*>= 0"),
    ("passkey-first-seed-past-seeds",
     ["passkey", "--first-seed", "5", "--seeds", "3", "--out", "{fresh}"],
     r"--first-seed 5.*--seeds 3"),
    ("passkey-cells-from-missing",
     ["passkey", "--lengths", "300", "--cells-from", "{missing}", "--out", "{fresh}"],
     r"{missing}: no such file"),
    ("passkey-cells-from-corrupt",
     ["passkey", "--lengths", "300", "--cells-from", "{garbage}", "--out", "{fresh}"],
     r"{garbage}: line 1: not a JSON record"),
    ("passkey-press-retired", ["passkey", "--press", "random", "--out", "{fresh}"],
     r"--press: random: retired; use kvpress's RandomPress"),
    ("passkey-ratio-above-one", ["passkey", "--ratio", "1.5", "--out", "{fresh}"],
     r"--ratio.*\[0, 1\)"),
    ("passkey-out-directory", ["passkey", "--lengths", "300", "--out", "{dir}"],
     r"--out.*is a directory"),
    ("passkey-ok",
     ["passkey", "--lengths", "300", "--depths", "0", "1", "--seeds", "1", "--full-only", "--out",
      "{fresh}"],
     OK),
    # timing
    ("timing-context-zero", ["timing", "--text", "{text}", "--context", "0"], r"--context.*>= 1"),
    ("timing-decode-zero", ["timing", "--text", "{text}", "--decode", "0"], r"--decode.*>= 1"),
    ("timing-decode-negative", ["timing", "--text", "{text}", "--decode", "-4"], r"--decode.*>= 1"),
    ("timing-past-context", ["timing", "--text", "{text}", "--context", "500", "--decode", "100"],
     r"--context.*--decode.*context length 512"),
    ("timing-text-too-short", ["timing", "--text", "{short}", "--context", "200", "--decode", "2"],
     r"--text.*tokens.*--context 200"),
    ("timing-press-retired", ["timing", "--text", "{text}", "--press", "streaming"],
     r"--press: streaming: retired; use kvpress's StreamingLLMPress"),
    ("timing-ratio-one", ["timing", "--text", "{text}", "--ratio", "1"], r"--ratio.*\[0, 1\)"),
    ("timing-out-directory",
     ["timing", "--text", "{text}", "--context", "16", "--decode", "1", "--press", "compresskv",
      "--out", "{dir}"],
     r"--out.*is a directory"),
    # capture
    ("capture-tokens-zero", ["capture", "--text", "{text}", "--tokens", "0", "--out", "{freshdir}"],
     r"--tokens.*>= 1"),
    ("capture-offset-negative",
     ["capture", "--text", "{text}", "--offset", "-5", "--tokens", "8", "--out", "{freshdir}"],
     r"--offset.*>= 0"),
    ("capture-block-out-of-range",
     ["capture", "--text", "{text}", "--offset", "0", "--tokens", "8", "--blocks", "9", "--out",
      "{freshdir}"],
     r"--blocks: expected 0 .. 1, got \[9\]"),
    ("capture-block-negative",
     ["capture", "--text", "{text}", "--offset", "0", "--tokens", "8", "--blocks", "-1", "--out",
      "{freshdir}"],
     r"--blocks: expected 0 .. 1"),
    ("capture-past-context",
     ["capture", "--text", "{text}", "--offset", "0", "--tokens", "600", "--out", "{freshdir}"],
     r"--tokens.*context length 512"),
    ("capture-offset-past-text",
     ["capture", "--text", "{text}", "--offset", "1000000", "--tokens", "8", "--out", "{freshdir}"],
     r"--offset 1000000.*exceeds"),
    ("capture-out-is-file",
     ["capture", "--text", "{text}", "--offset", "0", "--tokens", "8", "--blocks", "0", "--out",
      "{text}"],
     r"--out.*not a directory"),
    # attention-workload
    ("workload-missing", ["attention-workload", "--workload", "{missing}", "--ranks", "4"],
     r"{missing}: no captured workload"),
    ("workload-empty-dir", ["attention-workload", "--workload", "{dir}", "--ranks", "4"],
     r"{dir}: no captured workload"),
    ("workload-mixed", ["attention-workload", "--workload", "{mixed}", "--ranks", "4"],
     r"{mixed}.*k.npy.*manifest"),
    ("workload-no-manifest", ["attention-workload", "--workload", "{unlisted}", "--ranks", "4"],
     r"{unlisted}.*manifest"),
    ("workload-ranks-zero", ["attention-workload", "--workload", "{workload}", "--ranks", "0"],
     r"--ranks.*>= 1"),
    ("workload-seeds-zero", ["attention-workload", "--workload", "{workload}", "--seeds", "0"],
     r"--seeds.*>= 1"),
    ("workload-ok",
     ["attention-workload", "--workload", "{workload}", "--ranks", "4", "--seeds", "1"],
     OK),
    # report
    ("report-results-missing", ["report", "--results", "{missing}", "--out", "{page}"],
     r"--results.*{missing}.*no such directory"),
    ("report-results-empty", ["report", "--results", "{dir}", "--out", "{page}"],
     r"--results.*{dir}.*no result files"),
    ("report-results-is-file", ["report", "--results", "{text}", "--out", "{page}"],
     r"--results.*no such directory"),
    ("report-results-corrupt", ["report", "--results", "{badresults}", "--out", "{page}"],
     r"perplexity.jsonl: line 1: not a JSON record"),
    ("report-out-directory", ["report", "--results", "{results}", "--out", "{dir}"],
     r"--out.*is a directory"),
]


def _gguf_header_field(data: bytes, key: str) -> int:
    """The byte offset of metadata key `key`'s value in a GGUF file (after its type)."""
    encoded = key.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return at + 8 + len(encoded) + 4


# Corrupt GGUF files: name -> (how to make it from the good file's bytes and a directory,
# what the message after "<file>: " must match). Each is loaded through `generate`.
def _corrupt_ggufs():
    def cut(fraction):
        return lambda base, path: path.write_bytes(base[:int(len(base) * fraction)])

    def patch(function):
        return lambda base, path: path.write_bytes(function(base))

    def written(**options):
        return lambda base, path: tiny_gguf.write(path, **options)

    u64 = "<Q"
    readable = r"not a readable GGUF"
    positive = r"must be a positive integer"
    return {
        "empty": (cut(0.0), readable),
        "cut-4-bytes": (lambda base, path: path.write_bytes(base[:4]), readable),
        "cut-0.1%": (cut(0.001), readable),
        "cut-1%": (cut(0.01), readable + r"|truncated"),
        "cut-10%": (cut(0.1), r"truncated|corrupt"),
        "cut-50%": (cut(0.5), r"truncated|corrupt"),
        "cut-99.9%": (cut(0.999), r"truncated|corrupt"),
        "magic": (patch(lambda b: b"GGUX" + b[4:]), readable),
        "version-99": (patch(lambda b: b[:4] + struct.pack("<I", 99) + b[8:]), readable),
        "tensor-count-huge": (patch(lambda b: b[:8] + struct.pack(u64, 2**62) + b[16:]),
                              readable + r"|tensor"),
        "kv-count-huge": (patch(lambda b: b[:16] + struct.pack(u64, 2**62) + b[24:]), readable),
        "token-list-count-huge": (
            patch(lambda b: _array_count(b, "tokenizer.ggml.tokens", 2**60)), readable),
        "random-bytes": (
            lambda base, path: path.write_bytes(np.random.default_rng(0).bytes(4096)), readable),
        "tensor-offset-past-end": (
            patch(lambda b: _tensor_offset(b, "blk.1.ffn_down.weight", 2**40)),
            readable + r"|truncated"),
        "tensor-offset-misaligned": (
            patch(lambda b: _tensor_offset(b, "output_norm.weight", 3)), r"alignment: corrupt"),
        "architecture-gpt2": (written(architecture="gpt2"), r"general.architecture"),
        "missing-tensor": (written(skip_tensor="blk.0.ffn_gate.weight"),
                           r"missing .*blk.0.ffn_gate.weight"),
        "bad-shape": (written(bad_shape="blk.1.attn_v.weight"), r"blk.1.attn_v.weight has shape"),
        "heads-not-dividing": (written(heads=3), r"head_count|head dim"),
        "block-count-2^31": (written(metadata={"llama.block_count": 2**31}),
                             r"block_count 2147483648.*tensors"),
        "block-count-zero": (written(metadata={"llama.block_count": 0}), "block_count " + positive),
        "block-count-missing": (written(metadata={"llama.block_count": None}),
                                r"llama.block_count.*missing"),
        "block-count-text": (written(metadata={"llama.block_count": "two"}),
                             "block_count " + positive),
        "context-length-zero": (written(context_length=0), "context_length " + positive),
        "head-count-kv-zero": (written(metadata={"llama.attention.head_count_kv": 0}),
                               "head_count_kv " + positive),
        "vocab-size-mismatch": (written(metadata={"llama.vocab_size": 300}), r"vocab|token_embd"),
        "rope-base-nan": (written(metadata={"llama.rope.freq_base": float("nan")}),
                          r"freq_base must be a positive float"),
        "norm-eps-negative": (
            written(metadata={"llama.attention.layer_norm_rms_epsilon": -1.0}),
            r"layer_norm_rms_epsilon must be a positive float"),
        "tokenizer-model-llama": (written(metadata={"tokenizer.ggml.model": "llama"}),
                                  r"tokenizer.ggml.model must be 'gpt2'"),
        "tokenizer-pre-unknown": (written(metadata={"tokenizer.ggml.pre": "qwen2"}),
                                  r"tokenizer.ggml.pre"),
        "merges-bad": (written(metadata={"tokenizer.ggml.merges": ["x y z"]}), r"merge 'x y z'"),
        "token-types-missing": (written(metadata={"tokenizer.ggml.token_type": None}),
                                r"token types"),
        "nan-weights": (written(nan_tensor="blk.1.attn_q.weight"),
                        r"blk.1.attn_q.weight holds non-finite"),
        "eos-id-out-of-range": (written(metadata={"tokenizer.ggml.eos_token_id": 10**6}),
                                r"eos_token_id"),
    }


def _tensor_offset(base: bytes, name: str, offset: int) -> bytes:
    """`base` with the data offset of tensor `name` replaced by `offset` (tensor info: name,
    n_dims u32, dims u64 each, type u32, offset u64)."""
    encoded = name.encode()
    at = base.index(struct.pack("<Q", len(encoded)) + encoded) + 8 + len(encoded)
    dims = struct.unpack_from("<I", base, at)[0]
    at += 4 + 8 * dims + 4
    data = bytearray(base)
    data[at:at + 8] = struct.pack("<Q", offset)
    return bytes(data)


def _array_count(base: bytes, key: str, count: int) -> bytes:
    """`base` with the element count of array field `key` replaced by `count`."""
    data = bytearray(base)
    at = _gguf_header_field(base, key) + 4  # after the element type
    data[at:at + 8] = struct.pack("<Q", count)
    return bytes(data)


def fixtures(tmp):
    """Placeholder -> path: the files and folders the cases name (made in `tmp`)."""
    tmp = tmp if hasattr(tmp, "joinpath") else __import__("pathlib").Path(tmp)
    paths = {"model": tiny_gguf.write(tmp / "tiny.gguf"), "missing": tmp / "absent",
             "dir": tmp / "empty-dir", "text": tmp / "text.txt", "short": tmp / "short.txt",
             "empty": tmp / "empty.txt", "latin1": tmp / "latin1.txt",
             "garbage": tmp / "garbage.jsonl", "otherjsonl": tmp / "other.jsonl",
             "fresh": tmp / "out" / "fresh.jsonl", "freshdir": tmp / "capture",
             "page": tmp / "docs" / "page.md", "results": tmp / "results",
             "badresults": tmp / "bad-results", "workload": tmp / "workload",
             "mixed": tmp / "mixed", "unlisted": tmp / "unlisted"}
    paths["dir"].mkdir()
    paths["text"].write_text(TEXT, encoding="utf-8")
    paths["short"].write_text("Too short.", encoding="utf-8")
    paths["empty"].write_text("")
    paths["latin1"].write_bytes("Caf\u00e9 au lait.\n".encode("latin-1") * 20)
    paths["garbage"].write_text("{not json\n")
    paths["otherjsonl"].write_text(json.dumps({"length": 1}) + "\n")
    paths["page"].parent.mkdir()
    paths["page"].write_text("# the page that was there\n")
    paths["results"].mkdir()
    (paths["results"] / "perplexity.jsonl").write_text(json.dumps(
        {"n_ctx": 64, "chunks": 1, "scored_tokens": 32, "nll": 2.0, "perplexity": 7.39,
         "text": "x"}) + "\n")
    paths["badresults"].mkdir()
    (paths["badresults"] / "perplexity.jsonl").write_text("{\n")
    _workloads(paths)
    return {key: str(value) for key, value in paths.items()}


def _workloads(paths):
    """A good workload, one whose k.npy comes from another capture (an interrupted
    re-capture), and one written without a manifest."""
    from subquad.llm.attention_workload import save_workload

    rng = np.random.default_rng(0)

    def captured(tokens):
        return {0: {"q": rng.standard_normal((1, tokens, 4, 8)).astype(np.float32),
                    "k": rng.standard_normal((1, tokens, 2, 8)).astype(np.float32),
                    "v": rng.standard_normal((1, tokens, 2, 8)).astype(np.float32)}}

    save_workload(captured(16), paths["workload"])
    save_workload(captured(16), paths["mixed"])
    newer = paths["mixed"].parent / "newer"
    save_workload(captured(16), newer)
    os.replace(newer / "k.npy", paths["mixed"] / "k.npy")
    save_workload(captured(16), paths["unlisted"])
    for manifest in paths["unlisted"].glob("manifest*"):
        manifest.unlink()


def expand(argv, paths):
    argv = [arg.format(**paths) for arg in argv]
    return argv if "--model" in argv else ["--model", paths["model"]] + argv


def run_in_process(argv):
    """(exit status, stdout, stderr, the exception that escaped main or None)."""
    from subquad.llm import cli

    out, err = io.StringIO(), io.StringIO()
    status, escaped = 0, None
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = cli.main(argv) or 0
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
            if not isinstance(exit.code, int):
                err.write(f"{exit.code}\n")
        except BaseException as error:  # what would be a traceback
            status, escaped = 1, error
    return status, out.getvalue(), err.getvalue(), escaped


def check_outcome(expect, status, stderr, escaped, paths):
    assert escaped is None, f"traceback: {type(escaped).__name__}: {escaped}"
    assert "Traceback" not in stderr
    if expect == OK:
        assert status == 0, stderr
        return
    errors = [line for line in stderr.splitlines() if line.startswith("subquad-llm: error:")]
    assert status == 2 and len(errors) == 1, f"exit {status}, stderr {stderr!r}"
    pattern = expect.format(**{k: re.escape(v) for k, v in paths.items()})
    assert re.search(pattern, errors[0]), f"{errors[0]!r} does not match {pattern!r}"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return fixtures(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_cli_case(case, paths):
    name, argv, expect = case
    fresh = paths["fresh"]
    if os.path.exists(fresh):
        os.remove(fresh)
    status, _, stderr, escaped = run_in_process(expand(argv, paths))
    check_outcome(expect, status, stderr, escaped, paths)


CORRUPT = _corrupt_ggufs()


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_gguf(name, paths, tmp_path):
    make, expect = CORRUPT[name]
    path = tmp_path / f"{name}.gguf"
    make(open(paths["model"], "rb").read(), path)
    status, _, stderr, escaped = run_in_process(["--model", str(path), "generate", "hi",
                                                 "--tokens", "2"])
    check_outcome(f"{re.escape(str(path))}: .*(?:{expect})", status, stderr, escaped, paths)


def test_report_keeps_the_page_when_inputs_are_missing(paths):
    before = open(paths["page"]).read()
    for results in (paths["missing"], paths["dir"], paths["badresults"]):
        status, _, _, _ = run_in_process(["report", "--results", results, "--out",
                                          paths["page"]])
        assert status == 2 and open(paths["page"]).read() == before


def test_ctrl_c_is_one_line_and_status_130(paths, monkeypatch):
    from subquad.llm import cli

    def interrupted(model, *args, **options):
        raise KeyboardInterrupt  # what a kernel raises on Ctrl-C (test_interrupt.py)

    monkeypatch.setattr(cli, "_model", interrupted)
    status, _, stderr, escaped = run_in_process(["perplexity", "--text", paths["text"]])
    assert (status, stderr, escaped) == (130, "subquad-llm: interrupted\n", None)


def test_a_missing_optional_package_is_one_line(paths, monkeypatch):
    from subquad import _optional

    def missing(user, extra, modules):
        raise _optional.MissingDependency(f"{user} needs matplotlib: pip install "
                                          f"'subquad[{extra}]'")

    monkeypatch.setattr(_optional, "require", missing)
    status, _, stderr, escaped = run_in_process(["report", "--results", paths["results"],
                                                 "--out", paths["page"]])
    check_outcome(r"report needs matplotlib", status, stderr, escaped, paths)


# ---- the count of tracebacks, as subprocesses (python tests/test_llm_cli_hostile.py) ----

def _count(tmp):
    """Runs every case and every corrupt GGUF as `python -m subquad.llm.cli` (60 s and 6 GB
    each) and prints how many end in a traceback, a hang or an unclear error."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    paths = fixtures(tmp)

    def run(argv):
        command = [sys.executable, "-m", "subquad.llm.cli"] + [
            os.fsencode(arg) if "\udce9" in arg else arg for arg in argv]
        try:
            result = subprocess.run(command, capture_output=True, timeout=60,
                                    preexec_fn=limit)
        except subprocess.TimeoutExpired:
            return "hang"
        err = result.stderr.decode(errors="replace")
        if "Traceback" in err:
            return "traceback"
        if result.returncode == 0:
            return "exit 0"
        return "clean" if result.returncode == 2 and "subquad-llm: error:" in err else \
            f"exit {result.returncode}"

    tally = {}
    for name, argv, expect in CASES:
        if os.path.exists(paths["fresh"]):
            os.remove(paths["fresh"])
        outcome = run(expand(argv, paths))
        tally.setdefault(outcome, []).append(name)
        print(f"{name:36s} {'(ok case) ' if expect == OK else ''}{outcome}", flush=True)
    print({k: len(v) for k, v in tally.items()}, f"of {len(CASES)} CLI cases")
    gguf_tally = {}
    for name, (make, _) in sorted(CORRUPT.items()):
        path = os.path.join(tmp, f"{name}.gguf")
        make(open(paths["model"], "rb").read(), __import__("pathlib").Path(path))
        outcome = run(["--model", path, "generate", "hi", "--tokens", "2"])
        gguf_tally.setdefault(outcome, []).append(name)
        print(f"gguf {name:31s} {outcome}", flush=True)
    print({k: len(v) for k, v in gguf_tally.items()}, f"of {len(CORRUPT)} corrupt GGUFs")


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as directory:
        _count(directory)
