"""python -m subquad.kvstudy run|report CONFIG: see subquad.kvstudy."""

import argparse
import sys
import time

from .config import load


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subquad.kvstudy")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compute the missing cells of a study")
    run.add_argument("config")
    run.add_argument("--max-cells", type=int, default=None,
                     help="stop after this many new cells (the rest on the next run)")
    run.add_argument("--share", type=_share, default=(0, 1), metavar="K/N",
                     help="take the K-th of every N documents and tasks (0 <= K < N), so "
                          "that N processes, one per core, run the study together")
    report = sub.add_parser("report", help="print the study's report, or write it into a page")
    report.add_argument("config")
    report.add_argument("--page", default=None,
                        help="the page whose report block (between the markers) is replaced")
    args = parser.parse_args(argv)
    config = load(args.config)
    if args.command == "report":
        from .report import render, write_page
        from .store import Store

        if args.page:
            write_page(config, args.page)
        else:
            sys.stdout.write(render(config, Store(config.out)))
        return 0
    from .model import load_smollm2
    from .runner import Runner

    start, cpu = time.perf_counter(), time.process_time()
    model, tokenizer = load_smollm2()
    print(f"model loaded: {time.perf_counter() - start:.1f} s wall, "
          f"{time.process_time() - cpu:.1f} CPU s", flush=True)
    computed = Runner(config, model, tokenizer, log=lambda m: print(m, flush=True)).run(
        args.max_cells, args.share)
    print(f"{computed} cells computed: {time.perf_counter() - start:.1f} s wall, "
          f"{time.process_time() - cpu:.1f} CPU s", flush=True)
    return 0


def _share(text: str):
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        k, n = -1, 0
    if not 0 <= k < n <= 64:
        raise argparse.ArgumentTypeError(
            f"expected K/N with 0 <= K < N <= 64 (this process takes the K-th of every N "
            f"documents and tasks), got {text!r}")
    return k, n


if __name__ == "__main__":
    sys.exit(main())
