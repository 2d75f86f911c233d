"""One decoding set-up (`ProposerTrainConfig.decoding`) for GRPO's sampler and `evaluate`: the
same object reaches both, its grammar reaches GRPO's served samples as evaluate's, it is fixed
once a run started, and a grammar GRPO's generation cannot honour is refused."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.revise.conftest import GOOD_EDIT, SEED, SumTask, prose_solver
from whale import config as cfgmod
from whale.records import RecordError
from whale.revise.proposer import Proposer, ProposerConfig
from whale.train.proposer import grpo as grpomod
from whale.train.proposer import grpo_rollout as rollmod
from whale.train.proposer import run as runmod
from whale.train.proposer.contexts import Decoding, family_dir, family_of
from whale.train.proposer.run import ProposerTrainConfig, check_stage_changes


def test_the_default_is_free_decoding():
    assert ProposerTrainConfig().decoding == Decoding(grammar="off", grammar_blocks=1)
    assert Decoding().grammar_for(SEED) is None


def test_a_grammar_with_in_process_or_vllm_generation_is_refused_naming_embedded():
    for gen in ("trl", "vllm"):
        tree = {"decoding": {"grammar": "on"},
                "grpo": {"generation": gen, "vllm_url": "http://x:1/v1"}}  # fmt: skip
        with pytest.raises(cfgmod.ConfigError, match="embedded"):
            cfgmod.build(ProposerTrainConfig, tree)
    cfgmod.build(ProposerTrainConfig, {"decoding": {"grammar": "on"},
                                       "grpo": {"generation": "embedded"}})  # fmt: skip
    with pytest.raises(ValueError, match="embedded"):  # the library call refuses it too
        grpomod._grammars([("c", "m")], grpomod.GRPOSettings(), Decoding("on"), {"c": SEED})


def test_evaluate_contexts_need_as_many_different_feedback_draws():
    # a feedback pool of 4 questions, draws of 4: one possible draw
    tree = {"contexts": {"dev": 10, "score": 6, "feedback": 4}, "evaluate": {"contexts": 2}}
    with pytest.raises(cfgmod.ConfigError, match="evaluate.contexts"):
        cfgmod.build(ProposerTrainConfig, tree)


def test_the_decoding_is_fixed_once_the_run_started(tmp_path):
    saved = ProposerTrainConfig()
    (tmp_path / "rollouts").mkdir()
    on = cfgmod.build(ProposerTrainConfig, {"decoding": {"grammar": "on"},
                                            "grpo": {"generation": "embedded"}})  # fmt: skip
    with pytest.raises(RecordError, match="decoding.grammar"):
        check_stage_changes(saved, on, tmp_path)


def test_grpo_serves_each_context_the_grammar_evaluate_decodes_under(tmp_path):
    """The embedded rollout asks the server for the parent's edit grammar, the very one a
    `Proposer` built for evaluate asks its model for."""
    from tests.fakes import ScriptedModel

    other = SEED.replace("reply.text.strip()", "reply.text")
    prompts = [("c1", "first prompt"), ("c2", "second prompt")]
    decoding = Decoding(grammar="on")
    grammars = grpomod._grammars(prompts, grpomod.GRPOSettings(generation="embedded"), decoding,
                                 {"c1": SEED, "c2": other})  # fmt: skip
    served = ScriptedModel(["answer"])
    rollout = rollmod.make_rollout(SimpleNamespace(serve=lambda adapter: served),
                                    grpomod.GRPOSettings(generation="embedded"), tmp_path,
                                    _Tokenizer(), rollmod.Clock(), grammars)  # fmt: skip
    msgs = [[{"role": "user", "content": m}] for _, m in prompts]
    rollout(msgs, _Trainer())
    by_prompt = {m[-1]["content"]: s.grammar for m, s in served.calls}
    evaluated = ScriptedModel([GOOD_EDIT])
    Proposer(evaluated, decoding.proposer(ProposerConfig())).propose("x", 1, 0, parent=SEED)
    assert by_prompt["first prompt"] == evaluated.calls[0][1].grammar == decoding.grammar_for(SEED)
    assert by_prompt["second prompt"] == decoding.grammar_for(other) != by_prompt["first prompt"]
    free = grpomod._grammars(prompts, grpomod.GRPOSettings(), Decoding(), {})
    assert free is None


class _Tokenizer:
    """What the rollout asks of a tokenizer: ids of a text, a chat template, the vocabulary."""

    eos_token_id, unk_token_id, unk_token = 0, 3, "<unk>"

    def __len__(self) -> int:
        return 1000

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [10 + len(w) for w in text.split()]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return " ".join(m["content"] for m in messages)

    def convert_tokens_to_ids(self, token):
        return 7


class _Trainer:
    state = SimpleNamespace(global_step=0)
    model = None
    accelerator = SimpleNamespace(unwrap_model=lambda m: SimpleNamespace(
        save_pretrained=lambda path: Path(path).mkdir(parents=True)))  # fmt: skip


def test_run_grpo_and_run_evaluate_hand_on_the_same_decoding(tmp_path, monkeypatch):
    seed = tmp_path / "seed.py"
    seed.write_text(SEED)

    def open_family(fam, cs, run_dir, solver, rt):  # two families, no question shared
        task = SumTask(80)
        task._qs = task._qs[:40] if fam == "test:a" else task._qs[40:]
        return family_of(fam, task, cs, family_dir(run_dir, fam))

    seen: dict[str, object] = {}

    def train_grpo(prompts, reward, checkpoint, settings, out, **kw):
        seen["grpo"], seen["parents"] = kw["decoding"], kw["parents"]
        (out / "adapter").mkdir(parents=True, exist_ok=True)
        return out / "adapter", []

    def evaluate_proposers(models, fams, rt, cs, pcfg, es, workers, out, say, decoding):
        seen["evaluate"] = decoding
        return {}

    monkeypatch.setattr(runmod, "build_model", lambda mcfg: prose_solver())
    monkeypatch.setattr(runmod, "open_family", open_family)
    monkeypatch.setattr(runmod, "publish", lambda adapter, base, stage: adapter)
    monkeypatch.setattr(runmod, "proposer_model", lambda name, cfg, run_dir: prose_solver)
    monkeypatch.setattr(runmod, "evaluate_proposers", evaluate_proposers)
    monkeypatch.setattr(grpomod, "train_grpo", train_grpo)
    cfg = cfgmod.build(ProposerTrainConfig, {
        "families": {"sft": [], "rl": ["test:a"], "eval": ["test:b"]},
        "contexts": {"dev": 12, "score": 6, "eval": 8, "feedback": 4, "contexts": 1,
                     "seeds": [str(seed)]},
        "checkpoint": str(tmp_path / "ckpt"), "from_sft": False,
        "decoding": {"grammar": "on"}, "grpo": {"generation": "embedded"},
    })  # fmt: skip
    import whale.train.checkpoint as ckmod
    import whale.train.serving as servmod

    monkeypatch.setattr(ckmod, "resolve_gguf", lambda name: ("alias", tmp_path / "x.gguf"))
    monkeypatch.setattr(servmod, "EmbeddedServing", lambda *a, **k: SimpleNamespace(
        close=lambda: None))  # fmt: skip
    run = tmp_path / "run"
    runmod.open_run(cfg, run)
    runmod.run_grpo(cfg, run, say=lambda m: None)
    runmod.run_evaluate(cfg, run, say=lambda m: None)
    assert seen["grpo"] is cfg.decoding and seen["evaluate"] is cfg.decoding
    assert set(seen["parents"].values()) == {SEED}  # the grammar's parent per context
