"""subquad-train: train a model family from a TOML config.

    subquad-train --config configs/lm.toml [table.key=value ...] [--resume | --overwrite]
    subquad-train --compare runs/a runs/b --plot compare.png
    subquad-train --evaluate RUN_DIR|CHECKPOINT [--split test] [--text FILE]
"""

import argparse
import sys

from .config import load
from .evaluate import evaluate
from .loop import Trainer
from .metrics import plot_runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="subquad-train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="TOML configuration (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="table.key=value",
                        help="override a config value (TOML syntax), e.g. train.steps=50")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue the run in run.out from its checkpoint, if it has one")
    start.add_argument("--overwrite", action="store_true",
                       help="start again in a run.out that holds a run (its checkpoint and "
                            "metrics are removed)")
    parser.add_argument("--compare", nargs="+", metavar="RUN",
                        help="plot the loss curves of these run directories")
    parser.add_argument("--plot", default="compare.png", help="PNG written by --compare")
    parser.add_argument("--metric", default="loss", help="metric plotted by --compare")
    parser.add_argument("--evaluate", metavar="RUN",
                        help="score a trained run (its directory or a checkpoint file) on "
                             "the whole --split, or on --text, without training")
    parser.add_argument("--split", default="validation", choices=("validation", "test"),
                        help="the split --evaluate scores")
    parser.add_argument("--text", metavar="FILE",
                        help="with --evaluate: score this UTF-8 text file (lm, mlm)")
    args = parser.parse_intermixed_args(argv)  # overrides may follow --resume
    if (args.split != "validation" or args.text) and not args.evaluate:
        parser.error("--split and --text go with --evaluate")
    try:
        if args.evaluate:
            result = evaluate(args.evaluate, args.split, args.text)
            print(" ".join(f"{key}={value:.6g}" if isinstance(value, float) else
                           f"{key}={value}" for key, value in result.items()))
            return 0
        if args.compare:
            print(plot_runs(args.compare, args.plot, args.metric))
            return 0
        if not args.config:
            parser.error("--config is required (or --compare)")
        config = load(args.config, args.overrides)
        result = Trainer(config, resume=args.resume, overwrite=args.overwrite).run()
    except (ValueError, OSError, FloatingPointError, MemoryError) as error:
        # ConfigError, DataError, CheckpointError and the registry's errors (an attention
        # entry that cannot do what the model needs) are ValueErrors that say what to
        # change; OSErrors name the file (rundir.RunFileError for the run's own files);
        # FloatingPointError is a diverged run.
        message = str(error) or type(error).__name__
        print(f"subquad-train: error: {' '.join(message.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("subquad-train: interrupted; the last checkpoint stands (continue with "
              "--resume)", file=sys.stderr)
        return 130
    print(" ".join(f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}"
                   for key, value in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
