"""WHALE's weight phase: rejection-sampling SFT of the solver under a frozen harness.

One weight step (`WeightPhase.step`), as in the paper: the served weights θ_old (base + the
current LoRA adapter) run the frozen harness G times on each of the step's training prompts,
through the real isolated runtime; only trajectories the task's binary verifier accepts
(R(x, τ) = 1) enter S+, and of those (`RsftSettings.provenance`, on by default) only the model
calls whose completion produced the final answer (`whale.train.provenance`: the answer is in the
completion, or in the output of Python code the completion wrote; an accepted run with no such
call is recorded in `WeightStep.unproven` with the reason, and not trained on); each such model
call is one example (its prompt messages → its completion, loss on the completion tokens only,
`whale.train.data`); one pass of LoRA SFT over S+ (`whale.train.sft.LoraTrainer`); the adapter
is saved and served for the next rollouts (`whale.train.serving`). A step is `step_epochs` of
the prompt pool (0.05 by default: finer than the patience window W = 0.2, so that an adaptive
weight phase can end one step after T_min instead of a whole W later): one epoch is one pass
over the pool, in an order reshuffled (seeded) every epoch.

Every sample is a rollout in the run's ledger (an `OutcomeStore`), under a question id of its
own (`<id>@w<step>.<g>`) and a sampling seed of its own; a step whose record is on disk (with
its adapter) is not run again, and a step killed half way is replayed: the samples already in
the ledger are answered from it, so nothing is paid twice. An empty S+ (or no usable example)
is a recorded skip with its reason: the adapter stays, the rollouts count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale.config import above, at_least, at_most, part
from whale.harness import Runtime, RuntimeConfig, harness_hash, make_runtime
from whale.models import CachedModel, ChatModel, Completion, Message, Sampling
from whale.models.base import MAX_TEMPERATURE
from whale.models.hf import adapter_digest
from whale.records import JsonlWriter, RecordError, iter_jsonl, record_dir
from whale.runs import OutcomeStore
from whale.tasks import Question, Task
from whale.train.guesses import Chance, answer_key, chance, guesses, one_answer_per_prompts
from whale.train.patience import WeightPatience
from whale.train.sft import EmptyTrainingSet, LoraSettings, SFTSettings


@dataclass
class RsftSettings:
    g: int = 4  # trajectories per training prompt
    # One weight step, in epochs of the prompt pool (at least one prompt): finer than W.
    step_epochs: float = 0.05
    temperature: float = 1.0  # θ_old's sampling where the harness does not set it
    lora: LoraSettings = field(default_factory=LoraSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    # W = T_min = P_w (epochs): the weight phase's patience rule (adaptive schedule, rsft).
    window: float = 0.2
    t_min: float = 0.2
    p_w: float = 0.2
    # The answer-provenance rule for S+ (whale.train.provenance): train only on the model calls
    # that produced the accepted answer. Off: every call of an accepted run, as the paper does
    # (which trains on replies a harness asked for and ignored).
    provenance: bool = True
    # The guard against training on lucky guesses (whale.train.guesses): an answer the solver
    # gave on 2+ prompts of a step and that was accepted in at most this share of its samples
    # is a guess, and its accepted runs are left out of S+. 0: off, the paper's S+.
    guess_precision: float = 0.0
    # The other guard (whale.train.guesses.one_answer_per_prompts): an answer's accepted runs
    # are kept from at most this many prompts of a step. 0: off, the paper's S+.
    answer_prompts: int = 0
    # The step-level guard (whale.train.guesses.chance): train only when the step's samples are
    # accepted more often than their answers would be on random questions of the step, by more
    # than one standard error. Off: the paper's S+.
    chance_guard: bool = False

    def validate(self) -> None:
        at_least(self, 1, "g")
        at_least(self, 0, "answer_prompts")
        above(self, 0.0, "step_epochs", "window", "p_w")
        at_least(self, 0.0, "temperature", "t_min", "guess_precision")
        at_most(self, 1.0, "guess_precision")
        at_most(self, MAX_TEMPERATURE, "temperature")  # Sampling's range
        for name in ("lora", "sft"):
            with part(name):
                getattr(self, name).validate()

    def patience(self) -> WeightPatience:
        return WeightPatience(self.window, self.t_min, self.p_w)


@dataclass
class WeightStep:
    step: int  # global weight-step index of the run (0, 1, ...)
    position: int  # entries of the prompt stream consumed before this step (all phases)
    prompts: int  # distinct prompts of this step
    consumed: int  # stream entries it took (more than `prompts` where it skipped a repeat)
    samples: int
    accepted: int
    reward: float  # mean verifier reward of the step's samples (θ_old's training signal)
    examples: int = 0
    skips: dict[str, int] = field(default_factory=dict)  # reason -> examples not trained on
    # Accepted runs left out of S+ by the answer-provenance rule: sample id -> why.
    unproven: dict[str, str] = field(default_factory=dict)
    # Answers judged guesses (rsft.guess_precision), each with its counts; their accepted runs
    # (`guessed` of `accepted`) are not in S+.
    guesses: dict[str, str] = field(default_factory=dict)
    guessed: int = 0
    # Accepted runs left out because their answer was kept on rsft.answer_prompts other prompts
    # of the step: answer -> runs.
    repeated: dict[str, int] = field(default_factory=dict)
    chance: dict[str, float] | None = None  # rsft.chance_guard's reading: rate, chance, se
    trained: bool = False
    skipped: str | None = None  # why no training happened, if none did
    loss: float | None = None
    tokens: int = 0
    tokens_per_s: float = 0.0
    adapter_before: str | None = None  # digest of θ_old
    adapter: str | None = None  # digest served after this step
    adapter_path: str | None = None
    sample_s: float = 0.0
    train_s: float = 0.0
    harness: str = ""  # hash of the frozen harness the samples ran
    dtype: str | None = None  # what the step trained in ("bf16" | "fp32"); None: no training


class Solver:
    """The solver's current weights (base + an adapter folder, or the base alone) and the
    runtimes that use them. The weights are served on the first model call after a change,
    not before: a replayed step answered from the ledger starts no server."""

    def __init__(self, serving: Any, base_fingerprint: str, runtime: RuntimeConfig,
                 cache_path: str | None = None, adapter: Path | None = None) -> None:  # fmt: skip
        self.serving, self.base_fingerprint, self.runtime_cfg = serving, base_fingerprint, runtime
        self.cache_path = cache_path
        self.adapter: Path | None = None
        self.digest: str | None = None
        self._served: tuple[str | None, ChatModel] | None = None
        self._lock = threading.Lock()  # concurrent runs' first calls serve once, not twice
        self.set_adapter(adapter)

    def set_adapter(self, adapter: Path | None) -> None:
        self.adapter = adapter
        self.digest = adapter_digest(adapter) if adapter is not None else None

    @property
    def fingerprint(self) -> str:
        fp = self.base_fingerprint
        return fp if self.digest is None else f"{fp}+{self.digest}"

    def model(self) -> ChatModel:
        """The served model for the current weights (served now if they changed). A serving
        keeps one model live, so this is serialized: two runs racing to serve would close
        each other's server."""
        with self._lock:
            if self._served is None or self._served[0] != self.digest:
                m: ChatModel = self.serving.serve(self.adapter)
                if self.cache_path is not None:
                    m = CachedModel(m, self.cache_path)
                self._served = (self.digest, m)
            return self._served[1]

    def runtime(self, workers: int, temperature: float | None = None,
                seed: int | None = None) -> Runtime:  # fmt: skip
        cfg = self.runtime_cfg
        if temperature is not None or seed is not None:
            cfg = dataclasses.replace(
                cfg, temperature=cfg.temperature if temperature is None else temperature,
                seed=cfg.seed if seed is None else seed, warm=0,
            )  # fmt: skip
        return make_runtime(cfg, _Lazy(self), workers=workers)

    def close(self) -> None:
        """Drop the served model; the serving (shared by runs) is closed by its owner."""
        self._served = None


class _Lazy:
    """A ChatModel that serves the solver's weights on its first call."""

    def __init__(self, solver: Solver) -> None:
        self.solver = solver
        self.name = f"solver:{solver.digest or 'base'}"

    def chat(self, messages: list[Message], sampling: Sampling,
             timeout: float | None = None) -> Completion:  # fmt: skip
        return self.solver.model().chat(messages, sampling, timeout)

    def resolve_model(self) -> ChatModel:
        """The served model itself (served now): what an executor that runs rollouts in other
        processes describes to them (whale.harness.ray_specs.describe_model)."""
        return self.solver.model()


def sample_seed(seed: int, step: int, g: int) -> int:
    """A sampling seed per (run seed, step, sample): the G samples of one prompt differ."""
    h = hashlib.sha256(f"{seed}:{step}:{g}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


def step_prompts(pool: Sequence[Question], position: int, n: int,
                 seed: int) -> tuple[list[Question], int]:  # fmt: skip
    """The next `n` distinct prompts of the run's prompt stream from `position`, and how many
    stream entries they took. The stream is the pool reshuffled every epoch (seeded by the run
    seed and the epoch index); a step that crosses into the next epoch skips the prompts it
    already holds (a prompt asked twice in one step would be one sample paid twice)."""
    size = len(pool)
    n = min(n, size)
    orders: dict[int, list[Question]] = {}
    out: list[Question] = []
    seen: set[str] = set()
    p = position
    while len(out) < n:
        epoch, i = divmod(p, size)
        if epoch not in orders:
            orders[epoch] = list(pool)
            random.Random(f"{seed}:{epoch}").shuffle(orders[epoch])
        q = orders[epoch][i]
        p += 1
        if q.id not in seen:
            seen.add(q.id)
            out.append(q)
    return out, p - position


class WeightPhase:
    """Runs weight steps for one schedule run; steps are recorded in `root/steps.jsonl` and
    adapters saved under `root/adapters/step_NNNN/`."""

    def __init__(self, root: Path, task: Task, pool: Sequence[Question], store: OutcomeStore,
                 solver: Solver, settings: RsftSettings, make_trainer: Callable[[Path | None], Any],
                 tokenizer: Callable[[], Any], seed: int, workers: int) -> None:  # fmt: skip
        if not pool:
            raise ValueError("the weight phase needs a non-empty training prompt pool")
        self.root, self.task, self.pool, self.store = root, task, list(pool), store
        self.solver, self.settings, self.seed, self.workers = solver, settings, seed, workers
        self.make_trainer, self.tokenizer = make_trainer, tokenizer
        self._trainer: Any = None
        self._tok: Any = None
        record_dir(root)  # never a link (whale.records)
        self.done: dict[int, WeightStep] = {}
        path = root / "steps.jsonl"
        for n, row in iter_jsonl(path):
            try:
                s = WeightStep(**row)
            except TypeError as e:
                raise RecordError(f"{path}:{n}: not a weight step ({e})") from None
            self.done[s.step] = s
        self._log = JsonlWriter(path)

    @property
    def per_step(self) -> int:
        return max(1, round(self.settings.step_epochs * len(self.pool)))

    def epochs(self, prompts: int) -> float:
        return prompts / len(self.pool)

    def step(self, harness: str, k: int, position: int, max_rollouts: int | None,
             tags: dict[str, Any]) -> WeightStep:  # fmt: skip
        """Weight step `k` from prompt `position`; at most `max_rollouts` samples (the last
        step of a rollout budget is cut to fit: at least one prompt)."""
        g = self.settings.g
        n = self.per_step
        if max_rollouts is not None:
            n = max(1, min(n, max_rollouts // g))
        prompts, consumed = step_prompts(self.pool, position, n, self.seed)
        prior = self.done.get(k)
        h = harness_hash(harness)
        if (prior is not None and prior.position == position and prior.prompts == len(prompts)
                and prior.harness == h and prior.adapter_before == self.solver.digest
                and (prior.adapter_path is None or Path(prior.adapter_path).is_dir())):  # fmt: skip
            # Finished before a kill, from the same state: its samples are in the ledger (they
            # count for the budget, as they did), and the step's adapter is on disk.
            self.store.rebind(self.solver.fingerprint, **tags)
            for g in range(self.settings.g):
                self.store.mark_used(h, [self._sample_id(q, k, g) for q in prompts])
            self.solver.set_adapter(Path(prior.adapter_path) if prior.adapter_path else None)
            return prior
        t0 = time.monotonic()
        before = self.solver.digest
        outcomes, trajs = self._sample(harness, k, prompts, tags)
        sample_s = time.monotonic() - t0
        accepted = [(o, t) for o, t in zip(outcomes, trajs, strict=True) if o.correct]
        rec = WeightStep(step=k, position=position, prompts=len(prompts), consumed=consumed,
                         samples=len(outcomes),
                         accepted=len(accepted),
                         reward=sum(o.correct for o in outcomes) / max(1, len(outcomes)),
                         adapter_before=before, adapter=before,
                         adapter_path=str(self.solver.adapter) if self.solver.adapter else None,
                         sample_s=round(sample_s, 2), harness=h)  # fmt: skip
        guessed = guesses(outcomes, self.settings.guess_precision)
        rec.guesses = {a: c.text() for a, c in guessed.items()}
        clear = [(o, t) for o, t in accepted if answer_key(o.answer) not in guessed]
        rec.guessed = len(accepted) - len(clear)
        kept, rec.repeated = one_answer_per_prompts(clear, self.settings.answer_prompts,
                                                    f"{self.seed}:{k}")  # fmt: skip
        luck = self._chance(outcomes, prompts, trajs) if accepted else None
        if luck is not None:
            rec.chance = {"rate": round(luck.rate, 4), "chance": round(luck.chance, 4),
                          "se": round(luck.se, 4), "grades": luck.grades}  # fmt: skip
        if not accepted:
            rec.skipped = f"no accepted trajectory (0 of {len(outcomes)} samples)"
        elif luck is not None and not luck.above:
            rec.skipped = f"no better than chance (rsft.chance_guard): {luck.text()}"
        elif not kept:
            rec.skipped = (f"every accepted run's answer is a guess ({rec.guessed} of "
                           f"{len(accepted)}; rsft.guess_precision {self.settings.guess_precision}"
                           f"): {rec.guesses}")  # fmt: skip
        else:
            self._train(rec, kept, k)
        self._log.write(asdict(rec))
        self.done[k] = rec
        return rec

    def _chance(self, outcomes: list[Any], prompts: list[Question],
                trajs: list[Any]) -> Chance | None:  # fmt: skip
        if not self.settings.chance_guard:
            return None
        from whale import grading

        sandbox = next((t.sandbox for t in trajs if getattr(t, "sandbox", None)), "auto")
        return chance(
            outcomes, prompts, lambda q, a: grading.grade(self.task, q, a, sandbox=sandbox).correct
        )

    @staticmethod
    def _sample_id(q: Question, k: int, g: int) -> str:
        return f"{q.id}@w{k}.{g}"

    def _sample(self, harness: str, k: int, prompts: list[Question],
                tags: dict[str, Any]) -> tuple[list[Any], list[Any]]:  # fmt: skip
        self.store.rebind(self.solver.fingerprint, **tags)
        outcomes: list[Any] = []
        trajs: list[Any] = []
        for g in range(self.settings.g):
            rt = self.solver.runtime(self.workers, self.settings.temperature,
                                     sample_seed(self.seed, k, g))  # fmt: skip
            try:
                qs = [dataclasses.replace(q, id=self._sample_id(q, k, g)) for q in prompts]
                ev = self.store.evaluate(rt, harness, self.task, qs, "train", self.workers)
            finally:
                rt.close()
            outcomes += ev.outcomes
            trajs += ev.trajectories
        return outcomes, trajs

    def _train(self, rec: WeightStep, accepted: list[Any], k: int) -> None:
        from whale.train.data import trajectory_examples
        from whale.train.provenance import NO_PROVENANCE, answer_provenance

        examples, skips = [], Counter[str]()
        kept: list[tuple[Any, frozenset[int] | None]] = []
        for t in accepted:
            calls = None
            if self.settings.provenance:
                prov = answer_provenance(t)
                if not prov.calls:
                    rec.unproven[t.question_id] = str(prov.reason)
                    skips[NO_PROVENANCE] += len(t.model_calls())
                    continue
                calls = prov.calls
            kept.append((t, calls))
        if kept and self._tok is None:
            self._tok = self.tokenizer()
        for t, calls in kept:
            # An example over sft.max_len tokens (prompt + completion) is a recorded skip.
            ex, sk = trajectory_examples(t, self._tok, self.settings.sft.max_len, calls)
            examples += ex
            skips.update(s.reason.split(":")[0] for s in sk)
        rec.examples, rec.skips = len(examples), dict(skips)
        if not kept:
            rec.skipped = (f"{NO_PROVENANCE}: none of the {len(accepted)} accepted runs' answers "
                           "came from a completion (weight/steps.jsonl `unproven`)")  # fmt: skip
            return
        if not examples:
            rec.skipped = f"no usable example in {len(accepted)} accepted runs: {dict(skips)}"
            return
        if self._trainer is None:
            self._trainer = self.make_trainer(self.solver.adapter)
        t0 = time.monotonic()
        try:
            if self.settings.sft.launcher == "accelerate":  # a subprocess: whale.train.launch
                workdir = self.root / "launch" / f"step_{k:04d}"
                stats = self._trainer.train(examples, workdir=workdir)
            else:
                stats = self._trainer.train(examples)
        except EmptyTrainingSet as e:
            rec.skipped = f"nothing to train on: {e}"
            return
        out = self._trainer.save(self.root / "adapters" / f"step_{k:04d}")
        rec.train_s = round(time.monotonic() - t0, 2)
        rec.trained, rec.loss, rec.tokens = True, stats.loss, stats.tokens
        rec.tokens_per_s = round(stats.tokens_per_s, 1)
        rec.dtype = stats.dtype
        self.solver.set_adapter(out)
        rec.adapter, rec.adapter_path = self.solver.digest, str(out)

    def close(self) -> None:
        self._log.close()
        if self._trainer is not None:
            self._trainer.close()
            self._trainer = None


def trainer_factory(
    checkpoint: Path, settings: RsftSettings, seed: int
) -> Callable[[Path | None], Any]:
    """Makes the LoRA trainer on first need (loading the base weights takes seconds): in this
    process, or (`sft.launcher = "accelerate"`) one that runs each step under `accelerate
    launch` in a subprocess (`whale.train.launch.AccelerateTrainer`)."""

    def make(adapter: Path | None) -> Any:
        if settings.sft.launcher == "accelerate":
            from whale.train.launch import AccelerateTrainer

            return AccelerateTrainer(checkpoint, settings.lora, settings.sft, seed, adapter)
        from whale.train.sft import LoraTrainer

        return LoraTrainer(checkpoint, settings.lora, settings.sft, seed, adapter=adapter)

    return make
