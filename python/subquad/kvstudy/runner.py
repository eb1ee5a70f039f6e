"""The resumable runner: tuning documents (every press, ratio and setting), the settings
chosen on them, then the evaluation documents and the retrieval tasks at the chosen
settings. Every (phase, task, document, press, settings, ratio) cell is one record of
<out>/cells.jsonl, written when it finishes; a rerun skips the recorded cells, and a
document or task whose cells are all recorded is not even prefilled.

Cost per document: one prefill of C tokens (replay.Prefill), the full cache's continuation,
ceil(T / short_chunk) short-window forwards, then per cell one compression and one
teacher-forced pass of T tokens. Retrieval runs a (task, haystack, length, depth) group at
a time: first the full cache on every seed (one prefill and a greedy answer each: the
calibration), then, only where the group is calibrated, the presses on each instance the
full cache answers (a second prefill, but for the last seed, then per cell one compression
and a greedy answer of at most max_new_tokens). Presses on an uncalibrated group could
never enter the comparison, so none run there.
"""

import datetime
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .. import records
from .config import StudyConfig
from .lm import Reference, continuation_logits, short_window_logprobs
from .presses import make
from ..llm.timing import PeakMemory
from .replay import Prefill, cache_entries
from .store import Store
from .tasks import Haystack, Task, make_task, score_answer, stop_decoding
from .texts import document, load_text

__all__ = ["FULL", "Runner", "StopRun", "calibrated", "choose_settings", "presses_run",
           "task_groups", "task_instances"]

FULL = "full"  # the press name of the uncompressed cache's cell
LM_METRICS = ("delta_nll", "kl", "top1", "key_delta_nll", "key_kl")
# What a press may raise while its cache is read, recorded as the cell's "error": kvpress's
# AdaKV raises ValueError when no fake key hides its pruned keys from a forward's queries.
PRESS_FAILURES = (ValueError,)


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class StopRun(Exception):
    """Raised inside the runner when max_new_cells cells have been written."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def choose_settings(config: StudyConfig, store: Store) -> Optional[Dict]:
    """{"settings": {(press, ratio): settings}, "best_baseline": name, "tune": rows} from
    the tuning cells: per (press, ratio) the grid point of the lowest mean claim metric over
    the tuning documents (plain ΔNLL where no tuning document has key tokens), and the
    baseline of the lowest mean at the claim's ratio. None while a tuning cell is missing."""
    documents = config.documents("tune")
    metric = config.claim.metric
    chosen, rows = {}, []
    for press in config.presses:
        for ratio in config.ratios:
            best = None
            for settings in config.grids[press]:
                cells = []
                for book, window in documents:
                    key = dict(phase="tune", task="lm", document=f"{book}/{window}", press=press,
                               settings=settings, ratio=ratio)
                    if not store.has(**key):
                        return None
                    cells.append(store.get(**key))
                values = [c[metric] for c in cells if c[metric] is not None]
                used = metric if values else "delta_nll"
                values = values or [c["delta_nll"] for c in cells]
                mean = sum(values) / len(values) if values else float("nan")
                rows.append({"press": press, "ratio": ratio, "settings": settings,
                             "metric": used, "mean": mean, "documents": len(values)})
                if best is None or mean < best[0]:
                    best = (mean, settings)
            chosen[press, ratio] = best[1] if best else config.grids[press][0]
    ratio = config.claim.ratio
    means = {r["press"]: r["mean"] for r in rows
             if r["ratio"] == ratio and r["press"] in config.claim.baselines
             and r["settings"] == chosen[r["press"], ratio]}
    best_baseline = min(means, key=means.get) if means else None
    return {"settings": chosen, "best_baseline": best_baseline, "tune": rows}


def task_instances(config: StudyConfig) -> List[Tuple[str, str, int, Optional[float], int]]:
    """(kind, haystack, length, depth, seed) of every task; depth None for the kinds whose
    needles are placed at random (multivalue, vartrack)."""
    t = config.tasks
    if t is None:
        return []
    out = []
    for kind in t.kinds:
        depths = t.depths if kind in ("niah", "multikey") else [None]
        for haystack in t.haystacks:
            for length in t.lengths:
                for depth in depths:
                    for seed in t.seeds:
                        out.append((kind, haystack, length, depth, seed))
    return out


def task_groups(config: StudyConfig) -> List[Tuple[str, str, int, Optional[float]]]:
    """(kind, haystack, length, depth) of every group of seeds, in task_instances' order."""
    out = []
    for kind, haystack, length, depth, _ in task_instances(config):
        if (kind, haystack, length, depth) not in out:
            out.append((kind, haystack, length, depth))
    return out


def task_document(haystack: str, length: int, depth: Optional[float], seed: int) -> str:
    return f"{haystack}/{length}/{depth}/{seed}"


def full_task_key(kind: str, haystack: str, length: int, depth: Optional[float],
                  seed: int) -> Dict:
    return dict(phase="evaluate", task=kind, document=task_document(haystack, length, depth,
                                                                     seed),
                press=FULL, settings={}, ratio=0.0)


def calibrated(config: StudyConfig, store: Store, kind: str, haystack: str, length: int,
               depth: Optional[float]) -> Optional[bool]:
    """Whether the full cache's mean score over the group's seeds reaches the calibration
    threshold; None while a seed's full-cache cell is missing."""
    scores = []
    for seed in config.tasks.seeds:
        key = full_task_key(kind, haystack, length, depth, seed)
        if not store.has(**key):
            return None
        scores.append(store.get(**key)["score"])
    return sum(scores) / len(scores) >= config.tasks.calibration_threshold


def presses_run(config: StudyConfig, store: Store, kind: str, haystack: str, length: int,
                depth: Optional[float], seed: int) -> bool:
    """Whether the presses run on this instance: always without skip_on_miss; with it, when
    the group is calibrated and the full cache answers this instance."""
    if not config.tasks.skip_on_miss:
        return store.has(**full_task_key(kind, haystack, length, depth, seed))
    return (calibrated(config, store, kind, haystack, length, depth) is True
            and store.get(**full_task_key(kind, haystack, length, depth, seed))["score"] >= 1)


class Runner:
    """Runner(config, model, tokenizer, texts=None).run(max_new_cells=None, log=print).
    model: a transformers causal LM (attention "subquad" for the coreset presses);
    tokenizer: tokenize(text, add_bos=False) -> ids, detokenize(ids), eos_id (and
    im_end_id, where a chat turn ends);
    texts: name -> text for fixtures (default: subquad.data's packages)."""

    def __init__(self, config: StudyConfig, model, tokenizer, texts=None,
                 log: Callable[[str], None] = print):
        self.config, self.model, self.tokenizer, self.texts = config, model, tokenizer, texts
        self.store = Store(config.out)
        self.log = log
        self.computed = 0
        self.max_new_cells: Optional[int] = None
        self._tokens: Dict[str, List[int]] = {}
        self._haystacks: Dict[str, Haystack] = {}
        self._meta = {"commit": records.git_commit(), "threads": torch.get_num_threads()}

    def run(self, max_new_cells: Optional[int] = None, share: Tuple[int, int] = (0, 1)) -> int:
        """Computes the missing cells (at most max_new_cells of them); returns how many.
        share (k, n): this process takes the k-th of every n documents and tasks of each
        phase, so that n processes (one per core) share the study's out folder; their cell
        sets are disjoint, and each appends whole lines to cells.jsonl."""
        k, n = share
        if not 0 <= k < n:
            raise ValueError(f"share: expected (k, n) with 0 <= k < n, got {share!r}")
        self.max_new_cells, self.computed, self.share = max_new_cells, 0, share
        torch.set_num_threads(self.config.threads)
        self._meta["threads"] = torch.get_num_threads()
        self.store.append({"type": "session", "time": _now(), "study": self.config.name,
                           "share": f"{k}/{n}", **records.machine(), **self._meta,
                           **_versions()})
        try:
            with torch.no_grad():
                self._run()
        except StopRun:
            pass
        return self.computed

    def _run(self) -> None:
        c = self.config
        cells = [(p, s, r) for p in c.presses for r in c.ratios for s in c.grids[p]]
        for book, window in self._mine(c.documents("tune")):
            self._lm_document("tune", book, window, cells)
        # Another share's tuning cells may still be in flight: the store is read again.
        choice = choose_settings(c, Store(c.out))
        if choice is None:
            if self.share[1] > 1:
                self.log("tuning cells of the other shares are missing: run this share "
                         "again when they have finished")
                return
            raise RuntimeError("a tuning cell is missing after the tuning phase")
        settings = choice["settings"]
        cells = [(p, settings[p, r], r) for p in c.presses for r in c.ratios]
        for book, window in self._mine(c.documents("evaluate")):
            self._lm_document("evaluate", book, window, cells)
        for group in self._mine(task_groups(c)):
            self._task_group(*group, cells)

    def _mine(self, units: List) -> List:
        k, n = self.share
        return units[k::n]

    # --- records ---------------------------------------------------------------------

    def _record(self, key: Dict, values: Dict) -> None:
        if self.max_new_cells is not None and self.computed >= self.max_new_cells:
            raise StopRun
        self.store.append({"type": "cell", **key, **values, "time": _now(),
                           "load": records.load_average(), **self._meta})
        self.computed += 1

    def _tokens_of(self, name: str) -> List[int]:
        if name not in self._tokens:
            self._tokens[name] = self.tokenizer.tokenize(load_text(name, self.texts),
                                                         add_bos=False)
        return self._tokens[name]

    # --- language modelling ------------------------------------------------------------

    def _lm_document(self, phase: str, book: str, window: int, cells: List) -> None:
        c = self.config.lm
        name = f"{book}/{window}"

        def key(press, settings, ratio):
            return dict(phase=phase, task="lm", document=name, press=press, settings=settings,
                        ratio=ratio)

        full_key = key(FULL, {}, 0.0)
        missing = [cell for cell in cells if not self.store.has(**key(*cell))]
        if not missing and self.store.has(**full_key):
            return
        self.log(f"{phase} {name}: {len(missing)} cells")
        ids = torch.tensor(document(self._tokens_of(book), window, c.context + c.continuation))
        continuation = ids[c.context:]
        prefill = Prefill(self.model, ids[None, :c.context])
        with PeakMemory() as full_cost:
            full_logits = continuation_logits(self.model, prefill.full_cache(),
                                              prefill.last_logits, continuation, c.context,
                                              c.score_chunk)
        with PeakMemory() as short_cost:
            short = short_window_logprobs(self.model, ids, c.context, c.short_window,
                                          c.short_chunk)
        reference = Reference(full_logits, continuation, short, c.key_lsd, c.key_lcl)
        if not self.store.has(**full_key):
            self._record(full_key, {
                **reference.summary(), "prefill_s": prefill.prefill_s,
                "prefill_cpu_s": prefill.prefill_cpu_s,
                "prefill_peak_mib": prefill.prefill_peak_mib,
                "continuation_s": full_cost.seconds, "continuation_cpu_s": full_cost.cpu_seconds,
                "short_cpu_s": short_cost.cpu_seconds,
                **cache_entries(self.model, prefill.cache)})
        for press, settings, ratio in missing:
            pressed, cost = prefill.compress(make(press, ratio, self.config.seed, settings))
            entries = cache_entries(self.model, pressed)
            try:
                with PeakMemory() as scoring:
                    logits = continuation_logits(self.model, pressed, prefill.last_logits,
                                                 continuation, c.context, c.score_chunk)
            except PRESS_FAILURES as error:  # recorded, not retried: the report lists it
                self._record(key(press, settings, ratio), {
                    **dict.fromkeys(LM_METRICS), **cost, **entries, "error": _error(error)})
                continue
            self._record(key(press, settings, ratio), {
                **reference.score(logits), **cost, **entries,
                "continuation_s": scoring.seconds, "continuation_cpu_s": scoring.cpu_seconds,
                "continuation_peak_mib": scoring.mib})

    # --- retrieval tasks ---------------------------------------------------------------

    def _haystack(self, name: str) -> Haystack:
        if name not in self._haystacks:
            self._haystacks[name] = Haystack(name, load_text(name, self.texts), self.tokenizer)
        return self._haystacks[name]

    def _instance(self, kind, haystack, length, depth, seed) -> Tuple[Task, Prefill]:
        t = self.config.tasks
        task = make_task(kind, self._haystack(haystack), self.tokenizer, length, depth, seed,
                         keys=t.keys, values=t.values, hops=t.hops)
        return task, Prefill(self.model, torch.tensor([task.context]))

    def _task_group(self, kind, haystack, length, depth, cells) -> None:
        seeds = self.config.tasks.seeds
        last = None  # (seed, task, prefill) of the last calibration: its presses reuse it
        for seed in seeds:
            full_key = full_task_key(kind, haystack, length, depth, seed)
            if self.store.has(**full_key):
                continue
            task, prefill = self._instance(kind, haystack, length, depth, seed)
            answer = self._answer(task, prefill.full_cache())
            self._record(full_key, {**answer, "prefill_s": prefill.prefill_s,
                                    "prefill_cpu_s": prefill.prefill_cpu_s,
                                    "prefill_peak_mib": prefill.prefill_peak_mib,
                                    "answers": task.answers,
                                    "needle_positions": task.needle_positions,
                                    **cache_entries(self.model, prefill.cache)})
            self.log(f"{kind} {full_key['document']}: full cache {answer['score']:.2f}")
            last = (seed, task, prefill)
        if self.config.tasks.skip_on_miss and not calibrated(self.config, self.store, kind,
                                                             haystack, length, depth):
            self.log(f"{kind} {haystack}/{length}/{depth}: not calibrated, no presses")
            return
        for seed in seeds:
            if not presses_run(self.config, self.store, kind, haystack, length, depth, seed):
                continue
            name = task_document(haystack, length, depth, seed)

            def key(press, settings, ratio):
                return dict(phase="evaluate", task=kind, document=name, press=press,
                            settings=settings, ratio=ratio)

            missing = [cell for cell in cells if not self.store.has(**key(*cell))]
            if not missing:
                continue
            self.log(f"{kind} {name}: {len(missing)} cells")
            task, prefill = (last[1:] if last is not None and last[0] == seed
                             else self._instance(kind, haystack, length, depth, seed))
            for press, settings, ratio in missing:
                pressed, cost = prefill.compress(make(press, ratio, self.config.seed, settings))
                entries = cache_entries(self.model, pressed)
                try:
                    answer = self._answer(task, pressed)
                except PRESS_FAILURES as error:
                    answer = {"answer": None, "score": None, "error": _error(error)}
                self._record(key(press, settings, ratio), {**answer, **cost, **entries})

    def _answer(self, task: Task, cache) -> Dict:
        """The greedy answer to the task's question after `cache`, its score, and the
        decoding cost (wall and CPU ms per token after the question, peak MiB)."""
        model, context = self.model, len(task.context)
        question = torch.tensor([task.question])
        positions = torch.arange(context, context + question.shape[1])[None]
        out = model(input_ids=question, past_key_values=cache, position_ids=positions,
                    logits_to_keep=1)
        tokens: List[int] = []
        # The end of text, and of a chat turn (<|im_end|>, SmolLM2's end of an answer).
        stops = {getattr(self.tokenizer, name, None) for name in ("eos_id", "im_end_id")}
        steps = 0
        with PeakMemory() as cost:
            while True:
                token = int(out.logits[0, -1].argmax())
                tokens.append(token)
                text = self.tokenizer.detokenize(tokens)
                if (token in stops or stop_decoding(task, text)
                        or len(tokens) == task.max_new_tokens):
                    break
                position = torch.tensor([[context + question.shape[1] + steps]])
                out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                            position_ids=position)
                steps += 1
        per_token = (lambda s: 1000 * s / steps) if steps else (lambda s: None)
        return {"answer": text, "score": score_answer(task, text), "decoded": len(tokens),
                "decode_ms_per_token": per_token(cost.seconds),
                "decode_cpu_ms_per_token": per_token(cost.cpu_seconds),
                "decode_peak_mib": cost.mib if steps else None}


def _versions() -> Dict[str, str]:
    import kvpress  # noqa: F401  (its version, from the installed metadata)
    import transformers
    from importlib.metadata import version

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "kvpress": version("kvpress")}
