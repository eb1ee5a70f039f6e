"""What the speed studies (resolution_speed, wildcat_speed) share: reading a [speed] table,
timing calls interleaved (A B C A B C ...), keeping the CSV rows of a partial rerun when
they were measured with the same settings, and the page's record of the measurement
(commit, machine, torch, wall and CPU time, load average)."""

import argparse
import csv
import os
import sys
import time
from typing import Callable, Dict, Iterable, List, Mapping, Sequence, Tuple

import torch

from ..records import cpu_model, load_average
from ..train.config import ConfigError, tomllib


def positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def load_table(path: str, table: str, keys: Iterable[str], optional: Mapping,
               positive: Iterable[str]) -> Dict:
    """The [table] of the TOML file `path` with `optional`'s defaults filled in and its
    path under "path"; ConfigError naming the file, the table or `table.key` when the file
    cannot be read, a key is unknown or missing, or a `positive` key is not an integer
    >= 1."""
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read it ({error.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    spec = raw.get(table)
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a [{table}] table")
    unknown = sorted(set(spec) - set(keys) - set(optional))
    missing = sorted(set(keys) - set(spec))
    if unknown or missing:
        raise ConfigError(f"{table}: unknown key(s) {unknown}, missing key(s) {missing}")
    spec = {**optional, **spec, "path": path}
    for key in positive:
        if not positive_int(spec[key]):
            raise ConfigError(f"{table}.{key}: expected an integer >= 1, got {spec[key]!r}")
    return spec


def interleaved_times(calls: Sequence[Callable[[], object]], repeats: int,
                      clock: Callable[[], float] = None) -> List[List[float]]:
    """Seconds of each call, `repeats` each, timed in turn (A B C A B C ...): times[i][r].
    clock: time.perf_counter unless given."""
    clock = clock or time.perf_counter
    times: List[List[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, mine in zip(calls, times):
            started = clock()
            call()
            mine.append(clock() - started)
    return times


def kept_csv_rows(path: str, keep: Callable[[Dict], bool], settings: str, config: str,
                  numbers: Mapping[str, Callable], what: Callable[[Dict], str],
                  option: str) -> List[Dict]:
    """The rows of the CSV `path` (if it exists) that `keep` accepts, their `numbers`
    columns cast; ConfigError when some were measured with other `settings` than those of
    the config file `config`, or on another machine than this one (either of them before
    the CSV recorded it), naming them by `what(row)`: a page mixing them would compare
    unlike times. option: the command-line option that picks a subset (e.g. "grids")."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as file:
        rows = [row for row in csv.DictReader(file) if keep(row)]
    machine = cpu_model()
    for differs, how in ((lambda row: row.get("settings") != settings,
                          f"with other settings than {config} ({settings})"),
                         (lambda row: row.get("machine") != machine,
                          f"on another machine than this one ({machine})")):
        other = sorted({what(row) for row in rows if differs(row)})
        if other:
            raise ConfigError(f"{path}: its rows of {', '.join(other)} were measured {how}, "
                              f"or before the CSV recorded that; measure them all (without "
                              f"--{option}), or write the subset elsewhere with --docs")
    for row in rows:
        row.update({key: cast(row[key]) for key, cast in numbers.items()})
    return rows


def recorded(measure: Callable[[], List[Dict]]) -> Tuple[List[Dict], float, float,
                                                          List[float]]:
    """measure()'s rows, each with the machine it ran on ("machine"), with the wall and CPU
    seconds it took and the load average before and after it."""
    loads, started, cpu = [load_average()], time.perf_counter(), time.process_time()
    rows = measure()
    loads.append(load_average())
    for row in rows:
        row["machine"] = cpu_model()
    return rows, time.perf_counter() - started, time.process_time() - cpu, loads


def measurement_record(rows: Sequence[Dict], wall_s: float, cpu_s: float,
                       loads: Sequence[float]) -> str:
    """The page's sentence on where and how the rows were measured."""
    load = (f"; load average {loads[0]:.2f} at the start, {loads[-1]:.2f} at the end"
            if loads else "")
    machines = sorted({r.get("machine") or "unknown" for r in rows})
    return (f"Commit(s) {', '.join(sorted({r.get('commit', 'unknown') for r in rows}))}; "
            f"machine: {', '.join(machines)}, torch {torch.__version__}; last measurement: wall "
            f"{wall_s / 60:.1f} min, CPU {cpu_s / 60:.1f} min{load}")


def span(row: Dict) -> str:
    """A row's median seconds with its min-max."""
    return f"{row['median_s']:.4g} ({row['min_s']:.3g}-{row['max_s']:.3g})"


def study_main(argv, prog: str, doc: str, subset: str, load: Callable[[str], Dict],
               kept_rows: Callable, measure: Callable, page: Callable, what: str) -> int:
    """The command line of a speed study: `config [--docs DIR] [--<subset> ...]
    [--repeats R]`. Loads the config, keeps the CSV rows of what is not measured (refusing
    before any measurement when they do not match), measures the config's `subset` (e.g.
    "grids") or the chosen part of it and writes the page; 2 on a config error."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--docs", default="docs/results")
    parser.add_argument(f"--{subset}", nargs="*", type=int, help=f"only these {subset}")
    parser.add_argument("--repeats", type=int, help="override speed.repeats")
    args = parser.parse_args(argv)
    if args.repeats is not None and not positive_int(args.repeats):
        parser.error(f"--repeats: expected an integer >= 1, got {args.repeats}")
    try:
        spec = load(args.config)
        if args.repeats is not None:
            spec["repeats"] = args.repeats
        chosen = getattr(args, subset) or spec[subset]
        if not all(positive_int(n) for n in chosen):
            raise ConfigError(f"--{subset}: expected integers >= 1, got {chosen}")
        kept = kept_rows(spec, chosen, args.docs)  # refuses before any measurement
        rows, wall_s, cpu_s, loads = recorded(lambda: measure(spec, chosen))
        print(page(spec, kept + rows, args.docs, wall_s, cpu_s, loads))
    except (ConfigError, ValueError, OSError) as error:
        print(f"{what}: error: {error}", file=sys.stderr)
        return 2
    return 0
