"""`whale train-proposer sft | grpo | evaluate` as library calls: one config, one run directory.

    sft:      contexts of the SFT families -> teacher edits -> filter + screens -> dataset
              -> epochs by family-disjoint k-fold CV -> LoRA SFT of the proposer
    grpo:     contexts of the RL families -> GRPO updates (reward: execute the edit, r = J + v),
              from the SFT adapter when there is one; `phases` > 1 is the paper's offline
              multistep recipe: after each phase every parent advances to its best sampled
              revision (when it beat the parent), is rescored, and the next phase trains on
              the new states
    evaluate: the subject proposer against the others on the unseen families (evaluate.py)

`decoding` (contexts.Decoding: the edit grammar "off", the default, or "on") is how GRPO samples
and how evaluate's proposers decode: one setting, fixed once the run has started, recorded with
the readings. The family lists refuse generator twins split across them (contexts.TWINS, taken
transitively), and every family must offer `contexts.variant` (checked before anything runs).

One x_t template for the whole run: `contexts.template` renders every context (teacher, GRPO,
the multistep advance, evaluate's contexts) and evaluate's ratchet rounds. train-proposer does
not read `propose.template`: left at "default" it is ignored, set to the contexts' template it
agrees, and set to another one it is refused before anything runs (it would have meant a
ratchet prompted otherwise than the contexts).

Layout of the run directory: `config.toml`; `rollouts/<family>/` (one ledger per family,
shared by every stage: nothing is paid twice); `contexts/{sft,rl_1,rl_2,...}.json`;
`teacher/` (proposals/, candidates.jsonl with every rejection and its reason, kept.jsonl,
dataset/, summary.json); `sft/` (cv/, checkpoints/, adapter/); `grpo/phase_K/` (checkpoints/,
updates.jsonl, rewards.jsonl, adapter/); `evaluate/`. A trained adapter folder holds its
llama.cpp LoRA GGUF and `whale-proposer.json`, so `whale adapt --proposer <folder>` and
`whale search --proposer <folder>` serve it like any model.

Resume: run the same command on the same directory. The config is fixed once a stage has
started (its folder exists); a stage's own section may change until then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from whale import config as cfgmod
from whale.harness import RuntimeConfig, load_harness, make_runtime
from whale.models import PROPOSER_MARKER, ChatModel, ModelConfig, build_model, close_model
from whale.records import RecordError, record_dir, replace_dir, write_atomic
from whale.revise.code_screens import ReviewerScreen
from whale.revise.proposer import Proposer, ProposerConfig, load_template
from whale.runs import changed_fields, may_change, resumable
from whale.tasks import refusal
from whale.train.proposer.contexts import (
    ContextSettings,
    Decoding,
    Family,
    FamilySplits,
    RevisionContext,
    build_contexts,
    check_no_eval_text,
    held_out_texts,
    load_contexts,
    make_context,
    open_family,
    possible_draws,
    rerender,
    save_contexts,
)
from whale.train.proposer.evaluate import EvaluateSettings, evaluate_proposers
from whale.train.proposer.grpo import GRPOSettings
from whale.train.proposer.reward import ExecutionReward, echo_screen
from whale.train.proposer.sft import ProposerSFTSettings
from whale.train.proposer.teacher import TeacherSettings, load_dataset_dir, teacher_data

STAGES = ("sft", "grpo", "evaluate")
_STAGE_SECTIONS = {
    "sft": ("teacher", "reviewer", "filter", "sft", "propose"),
    "grpo": ("grpo", "phases", "from_sft"),
    "evaluate": ("evaluate",),
}


_PROPOSE_TEMPLATE_DEFAULT = ProposerConfig().template  # "default": left as it is, ignored


def _default_families() -> FamilySplits:
    # rg:products, not rg:gcd: gcd is lcm's generator twin (contexts.TWINS), so gcd in SFT
    # would make lcm a seen family. products is chain_sum's twin, in the same list.
    return FamilySplits(sft=["rg:basic_arithmetic", "rg:chain_sum", "rg:products"],
                        rl=["rg:letter_counting"], eval=["rg:lcm", "rg:count_bits"])  # fmt: skip


@dataclass
class ProposerTrainConfig:
    # What a resume may change besides where and how fast rollouts run (whale.runs.resume),
    # once a stage has started: which eval families evaluate reads (a record holds the same
    # either way); where GRPO's vLLM server is; proposals asked for at once.
    budget_fields: ClassVar[frozenset[str]] = frozenset({"evaluate.only"})
    where_fields: ClassVar[frozenset[str]] = frozenset({"grpo.vllm_url", "grpo.vllm_model",
                                                        "grpo.generation_retries",
                                                        "propose.concurrency"})  # fmt: skip

    families: FamilySplits = field(default_factory=_default_families)
    contexts: ContextSettings = field(default_factory=ContextSettings)
    solver: ModelConfig = field(default_factory=ModelConfig)
    teacher: ModelConfig = field(
        default_factory=lambda: ModelConfig(name="qwen-coder-1.5b", timeout_s=600.0)
    )
    reviewer: ModelConfig | None = None  # optional oracle-access check of kept teacher edits
    # The proposer trained: a catalog name or .gguf (served by llama.cpp with its adapter) and
    # its transformers checkpoint (default: made once from the GGUF).
    proposer: str = "qwen-coder-0.5b"
    checkpoint: str | None = None
    # The temperature and length of every proposer's samples. Its `template` is not read:
    # contexts.template is the run's one x_t template (another value here is refused; the
    # default "default" is ignored). Its `grammar` is the teacher's only: teacher edits are
    # filtered on execution, so a grammar there raises the yield of SFT data and is part of no
    # reading.
    propose: ProposerConfig = field(default_factory=ProposerConfig)
    # How the trained proposer's samples are decoded, in GRPO and in evaluate alike (one
    # setting, fixed once the run has started, recorded with evaluate's readings).
    decoding: Decoding = field(default_factory=Decoding)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    filter: TeacherSettings = field(default_factory=TeacherSettings)
    sft: ProposerSFTSettings = field(default_factory=ProposerSFTSettings)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    phases: int = 1  # 1: single-step contexts; more: the multistep offline phases
    from_sft: bool = True  # GRPO starts from the SFT adapter when the run has one
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    workers: int = 2
    # mirror the finished run into an experiment tracker (whale.analysis.tracking.track_run):
    # "none" (default) | "mlflow" | "wandb", offline, files inside the run directory
    tracking: cfgmod.TrackerKind = "none"
    out: str | None = None

    def validate(self) -> None:
        cfgmod.check_choices(self)
        with cfgmod.part("families"):
            self.families.validate()
        if self.phases < 1 or self.workers < 1:
            raise cfgmod.ConfigError("phases and workers must be >= 1")
        for name in ("contexts", "filter", "sft", "grpo", "evaluate", "propose", "decoding"):
            with cfgmod.part(name):
                getattr(self, name).validate()
        if self.decoding.grammar == "on" and self.grpo.generation != "embedded":
            raise cfgmod.ConfigError(
                f"decoding.grammar = 'on' with grpo.generation = {self.grpo.generation!r}: GRPO "
                "would sample without the grammar evaluate decodes under (TRL's generate and a "
                "vLLM server take no GBNF grammar); use grpo.generation = 'embedded' (llama.cpp) "
                "or decoding.grammar = 'off'"
            )
        self._check_template()
        for where in ("sft", "rl", "eval"):
            for fam in getattr(self.families, where):
                why = refusal(fam, self.contexts.variant)
                if why is not None:  # before the SFT contexts are paid, not at the eval stage
                    raise cfgmod.ConfigError(f"contexts.{why} (families.{where})")
        c, n = self.contexts, self.evaluate.contexts
        if possible_draws(c.dev - c.score, c.feedback) < n:
            raise cfgmod.ConfigError(
                f"evaluate.contexts = {n}: a feedback pool of {c.dev - c.score} questions "
                f"(contexts.dev - contexts.score) has fewer than {n} different draws of "
                f"contexts.feedback = {c.feedback}"
            )

    def _check_template(self) -> None:
        """propose.template is not read here: refused unless left at its default or naming the
        run's template (contexts.template) by its text ("proposer.txt" is "default")."""
        ct, pt = self.contexts.template, self.propose.template
        if pt != _PROPOSE_TEMPLATE_DEFAULT and load_template(ct) != load_template(pt):
            raise cfgmod.ConfigError(
                f"propose.template = {pt!r} differs from contexts.template = {ct!r}: "
                "train-proposer renders every prompt of the run (contexts, teacher, GRPO, "
                "evaluate and its ratchet) with contexts.template and does not read "
                "propose.template; set contexts.template (or `whale train-proposer sft "
                "--template NAME`)"
            )


def check_stage_changes(saved: ProposerTrainConfig, now: ProposerTrainConfig,
                        run_dir: Path) -> None:  # fmt: skip
    """RecordError naming the first changed field that a started stage's records depend on."""
    if not (run_dir / "rollouts").exists() and not (run_dir / "contexts").exists():
        return  # nothing was run yet (a typo in a family name, say): anything may change
    open_sections = {s for stage, secs in _STAGE_SECTIONS.items()
                     if not (run_dir / _stage_dir(stage)).exists() for s in secs}  # fmt: skip
    free = resumable(ProposerTrainConfig)
    for name, old, new in changed_fields(asdict(saved), asdict(now)):
        if may_change(free, name) or name.split(".", 1)[0] in open_sections:
            continue
        raise RecordError(
            f"{run_dir}: {name} was {old!r}, now {new!r}: the records of a started stage "
            "depend on it (start a new run directory); until a stage starts, its own section "
            f"may change ({', '.join(f'{k}: {v}' for k, v in _STAGE_SECTIONS.items())})"
        )


def _stage_dir(stage: str) -> str:
    return {"sft": "teacher", "grpo": "grpo", "evaluate": "evaluate"}[stage]


class Session:
    """What every stage needs, opened on first use and closed at the end: the solver and its
    runtime, the families (tasks, splits, ledgers), the trainable checkpoint."""

    def __init__(self, cfg: ProposerTrainConfig, run_dir: Path,
                 say: Callable[[str], None]) -> None:  # fmt: skip
        self.cfg, self.dir, self.say = cfg, run_dir, say
        self._families: dict[str, Family] = {}
        self._solver: ChatModel | None = None
        self._runtime: Any = None

    @property
    def runtime(self) -> Any:
        if self._runtime is None:
            self._solver = build_model(self.cfg.solver)
            self._runtime = make_runtime(self.cfg.runtime, self._solver, workers=self.cfg.workers)
        return self._runtime

    def family(self, fam: str) -> Family:
        if fam not in self._families:
            c = self.cfg
            self._families[fam] = open_family(fam, c.contexts, self.dir, c.solver, c.runtime)
        return self._families[fam]

    def held_out(self) -> list[str]:
        return held_out_texts(self.family(f) for f in self.cfg.families.all())

    def contexts(self, name: str, fams: list[str]) -> list[RevisionContext]:
        path = self.dir / "contexts" / f"{name}.json"
        if path.exists():
            return load_contexts(path)
        out: list[RevisionContext] = []
        for f in fams:
            out += build_contexts(self.family(f), self.runtime, self.cfg.contexts,
                                  self.cfg.workers, self.say)  # fmt: skip
        record_dir(path.parent)
        save_contexts(path, out)
        return out

    def checkpoint(self) -> Path:
        from whale.train.checkpoint import trainable_checkpoint

        return Path(self.cfg.checkpoint or trainable_checkpoint(self.cfg.proposer))

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
        for f in self._families.values():
            f.store.close()
        close_model(self._solver)


def open_run(cfg: ProposerTrainConfig, run_dir: Path) -> None:
    path = run_dir / "config.toml"
    if path.exists():
        check_stage_changes(cfgmod.load(ProposerTrainConfig, path), cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, tomli_w.dumps(cfgmod.to_dict(cfg)))


def publish(adapter: Path, base: str, stage: str) -> Path:
    """Make `adapter` servable as a proposer: its LoRA GGUF and `whale-proposer.json`."""
    from whale.train.lora_gguf import adapter_to_gguf

    lora = adapter_to_gguf(adapter)
    marker = {"base": base, "lora": lora.name, "stage": stage, "format": 1}
    write_atomic(adapter / PROPOSER_MARKER, json.dumps(marker, indent=1))
    return adapter


def run_sft(cfg: ProposerTrainConfig, run_dir: Path,
            say: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    from whale.train.proposer.sft import cross_validate, train_sft

    if not cfg.families.sft:
        raise RecordError("sft: no SFT families (families.sft is empty)")
    t0, s = time.monotonic(), Session(cfg, run_dir, say)
    try:
        teacher_dir = run_dir / "teacher"
        if not (teacher_dir / "summary.json").exists():
            contexts = s.contexts("sft", cfg.families.sft)
            fams = {f: s.family(f) for f in cfg.families.sft}
            echo = {f: echo_screen(fam, _baseline(cfg)) for f, fam in fams.items()}
            reviewer = None
            if cfg.reviewer is not None:
                reviewer = ReviewerScreen(build_model(cfg.reviewer))
            teacher_model = build_model(cfg.teacher)
            prior = cfg.contexts.teacher_template
            asked = None
            if prior and load_template(prior) != load_template(cfg.contexts.template):
                text = load_template(prior)
                asked = {c.id: rerender(c, fams[c.family], s.runtime, text) for c in contexts}
            try:
                summary = teacher_data(contexts, fams, s.runtime,
                                       Proposer(teacher_model, _propose(cfg)), cfg.filter,
                                       teacher_dir, echo, s.held_out(), cfg.workers, reviewer,
                                       say, asked, prior if asked else "")  # fmt: skip
            finally:
                close_model(teacher_model)
                if reviewer is not None:
                    close_model(reviewer.model)
        summary = json.loads((teacher_dir / "summary.json").read_text())
        say(f"teacher: {summary['kept']} of {summary['proposals']} proposals kept "
            f"{summary['kept_per_family']}; rejected {summary['rejected']}")  # fmt: skip
        if summary["kept"] == 0:
            raise RecordError(
                f"{teacher_dir}: the teacher kept no edit ({summary['rejected']}); lower "
                "filter.min_score / filter.min_gain, add contexts, or use a stronger teacher"
            )
        data = load_dataset_dir(teacher_dir / "dataset")
        texts = [m["content"] for row in data for m in row["prompt"] + row["completion"]]
        check_no_eval_text(texts, s.held_out())
        ckpt, sft_dir = s.checkpoint(), run_dir / "sft"
        epochs, cv = cfg.sft.epochs, None
        if epochs is None:
            if len(set(data["family"])) >= 2:
                res = cross_validate(data, ckpt, cfg.sft, sft_dir / "cv", say)
                epochs, cv = res.epochs, asdict(res)
            else:
                epochs = cfg.sft.max_epochs / 2  # no CV with one family: recorded below
                say(f"sft: one family kept examples: no family-disjoint CV; {epochs} epochs")
        adapter = publish(train_sft(data, ckpt, cfg.sft, epochs, sft_dir, say), cfg.proposer,
                          "sft")  # fmt: skip
        out = {"teacher": summary, "epochs": epochs, "cv": cv, "adapter": str(adapter),
               "examples": len(data), "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
        write_atomic(sft_dir / "summary.json", json.dumps(out, indent=1, default=str))
        return out
    finally:
        s.close()


def _propose(cfg: ProposerTrainConfig) -> ProposerConfig:
    """cfg.propose with the run's one x_t template, contexts.template (validate has refused a
    propose.template that names another)."""
    return replace(cfg.propose, template=cfg.contexts.template)


def _baseline(cfg: ProposerTrainConfig) -> str:
    return "\n".join(load_harness(n) for n in cfg.contexts.seeds)


def advance(contexts: list[RevisionContext], best: dict[str, tuple[float, str]], s: Session,
            phase: int) -> list[RevisionContext]:  # fmt: skip
    """Multistep: each parent moves to its best sampled revision when that beat it (else it
    stays), and is rescored on a fresh Q_fb draw of its family."""
    import random

    template, out = load_template(s.cfg.contexts.template), []
    for ctx in contexts:
        score, source = best.get(ctx.id, (-1.0, ""))
        if score <= ctx.parent_score:
            out.append(ctx)
            continue
        fam = s.family(ctx.family)
        rng = random.Random(f"{s.cfg.contexts.seed}:{ctx.id}:{phase}")
        q_fb = rng.sample(fam.feedback_pool, min(s.cfg.contexts.feedback, len(fam.feedback_pool)))
        out.append(make_context(fam, s.runtime, source, q_fb, template, s.cfg.contexts.report,
                                s.cfg.workers, f"{ctx.id.rsplit('/', 1)[-1]}.p{phase}",
                                ctx.step + 1))  # fmt: skip
    return out


def run_grpo(cfg: ProposerTrainConfig, run_dir: Path,
             say: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    from whale.train.proposer.grpo import train_grpo
    from whale.train.serving import EmbeddedServing

    t0, s = time.monotonic(), Session(cfg, run_dir, say)
    serving = None
    try:
        if not cfg.families.rl:
            raise RecordError("grpo: no RL families (families.rl is empty)")
        init = run_dir / "sft" / "adapter"
        adapter: Path | None = init if cfg.from_sft and (init / "adapter_config.json").exists() \
            else None  # fmt: skip
        say(f"grpo: from {'the SFT adapter ' + str(adapter) if adapter else 'the base model'}"
            f"{'' if adapter or not cfg.from_sft else ' (no SFT adapter in this run)'}")
        contexts = s.contexts("rl_1", cfg.families.rl)
        fams = {f: s.family(f) for f in cfg.families.rl}
        if cfg.grpo.generation == "embedded":
            from whale.train.checkpoint import resolve_gguf

            alias, gguf = resolve_gguf(cfg.proposer)
            serving = EmbeddedServing(gguf, alias, n_ctx=_proposer_ctx(cfg),
                                      threads=cfg.solver.threads, timeout_s=600.0)  # fmt: skip
        phases = []
        init_from = str(adapter) if adapter else "base"
        for k in range(1, cfg.phases + 1):
            check_no_eval_text([c.prompt for c in contexts], s.held_out())  # every phase's
            pdir = run_dir / "grpo" / f"phase_{k}"
            record_dir(pdir.parent)
            record_dir(pdir)
            reward = ExecutionReward(contexts, fams, s.runtime, pdir / "rewards.jsonl",
                                     cfg.workers,
                                     echo={f: echo_screen(x, _baseline(cfg))
                                           for f, x in fams.items()})  # fmt: skip
            try:
                adapter, stats = train_grpo([(c.id, c.prompt) for c in contexts], reward,
                                            s.checkpoint(), cfg.grpo, pdir, init_adapter=adapter,
                                            serving=serving, say=say, decoding=cfg.decoding,
                                            parents={c.id: c.parent_source
                                                     for c in contexts})  # fmt: skip
            finally:
                reward.close()
            phases.append({"phase": k, "contexts": len(contexts), "reward": reward.stats(),
                           "updates": [asdict(u) for u in stats]})  # fmt: skip
            if k < cfg.phases:
                path = run_dir / "contexts" / f"rl_{k + 1}.json"
                if path.exists():
                    contexts = load_contexts(path)
                else:
                    contexts = advance(contexts, reward.best, s, k)
                    save_contexts(path, contexts)
        assert adapter is not None
        publish(adapter, cfg.proposer, "grpo")
        final = run_dir / "grpo" / "adapter"
        _link(final, adapter)
        out = {"phases": phases, "adapter": str(final), "from": init_from,
               "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
        write_atomic(run_dir / "grpo" / "summary.json", json.dumps(out, indent=1, default=str))
        return out
    finally:
        if serving is not None:
            serving.close()
        s.close()


def _proposer_ctx(cfg: ProposerTrainConfig) -> int:
    """A context window that holds the longest prompt GRPO keeps and its completion."""
    return max(4096, cfg.grpo.max_prompt + max(cfg.grpo.max_completion, cfg.propose.max_tokens))


def _link(final: Path, adapter: Path) -> None:
    """grpo/adapter: a copy of the last phase's adapter (a folder anyone can pass around)."""
    import shutil

    if final.resolve() == adapter.resolve():
        return
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(adapter, tmp)
    replace_dir(tmp, final)


def proposer_model(name: str, cfg: ProposerTrainConfig, run_dir: Path) -> Callable[[], ChatModel]:
    """A factory of the proposer `name` names (see EvaluateSettings.subject)."""
    stage = {"trained": None, "sft": "sft", "grpo": "grpo"}
    n_ctx = _proposer_ctx(cfg)
    if name in stage:
        pick = stage[name] or ("grpo" if (run_dir / "grpo" / "adapter").exists() else "sft")
        folder = run_dir / pick / "adapter"
        if not (folder / PROPOSER_MARKER).exists():
            raise RecordError(f"{folder}: no trained proposer there (run `whale train-proposer "
                              f"{pick}` first)")  # fmt: skip
        mcfg = ModelConfig(name=str(folder), n_ctx=n_ctx, timeout_s=600.0, cache=False)
    elif name == "base":
        mcfg = ModelConfig(name=cfg.proposer, n_ctx=n_ctx, timeout_s=600.0, cache=False)
    elif name == "teacher":  # in the others' context at least: a prompt that does not fit is
        # read as an edit that made no harness, so a smaller window would handicap it
        mcfg = replace(cfg.teacher, n_ctx=max(cfg.teacher.n_ctx, n_ctx))
    else:
        mcfg = ModelConfig(name=name, n_ctx=n_ctx, timeout_s=600.0, cache=False)
    return lambda: build_model(mcfg)


def run_evaluate(cfg: ProposerTrainConfig, run_dir: Path,
                 say: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    s = Session(cfg, run_dir, say)
    try:
        es = cfg.evaluate
        names = [es.subject, *es.against]
        models = {n: proposer_model(n, cfg, run_dir) for n in names}
        unknown = sorted(set(es.only) - set(cfg.families.eval))
        if unknown:
            raise RecordError(f"evaluate.only: {unknown} are not eval families")
        fams = [s.family(f) for f in cfg.families.eval if not es.only or f in es.only]
        if not fams:
            raise RecordError("evaluate: no eval families (families.eval is empty)")
        return evaluate_proposers(models, fams, s.runtime, cfg.contexts, _propose(cfg), es,
                                  cfg.workers, run_dir / "evaluate", say,
                                  decoding=cfg.decoding)  # fmt: skip
    finally:
        s.close()
