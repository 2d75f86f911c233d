"""GRPO's samples from a served model ("embedded", "vllm"): each update's adapter saved and
served, G completions per context sampled (seeded by run seed, update and index; a sample whose
call times out asked again with its seed, `generation_retries` times), and the ids to train on
rebuilt or checked (`completion_ids`; grpo's docstring says why and what is masked out).
`Clock` holds what one update measured."""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from whale.models.base import ModelTimeout, Sampling
from whale.train.data import end_of_turn_id, template_ids

if TYPE_CHECKING:
    from whale.train.serving import SolverServing


class SamplerSettings(Protocol):
    """What the sampler reads of `grpo.GRPOSettings` (a seam, so this module does not import
    grpo, which imports it)."""

    seed: int
    max_completion: int
    temperature: float
    generation_retries: int
    concurrency: int


@dataclass
class Clock:
    """What one update measured, filled by the wrappers, emptied at each checkpoint."""

    start: float = 0.0
    end: float = 0.0
    generation_s: float = 0.0
    reward_s: float = 0.0
    serve_s: float = 0.0
    mismatches: int = 0
    retries: int = 0
    rewards: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    grad_norm: float | None = None

    def reset(self) -> None:
        self.__dict__.update(asdict(Clock()), start=time.monotonic())



def completion_ids(c: Any, tokenizer: Any, eot: int,
                    limit: int | None = None) -> tuple[list[int], bool]:  # fmt: skip
    """The ids to train on for one served completion, and whether they are what was sampled:
    the backend's own ids, or ids rebuilt from the text and checked against its count. A
    server's ids are used only if each is a token of this tokenizer and there are at most
    `limit` (+1 end of turn) of them; else they are ignored and the text is rebuilt (a
    server that sends garbage ids must not put them, or an out-of-vocabulary index, into
    the loss)."""
    stop = c.finish_reason == "stop"
    if c.token_ids is not None and _ids_ok(c.token_ids, len(tokenizer), limit):
        ids = list(c.token_ids)
        if stop and (not ids or ids[-1] not in (eot, tokenizer.eos_token_id)):
            ids.append(eot)
        return (ids or [eot]), bool(ids)
    ids = list(tokenizer(c.text, add_special_tokens=False)["input_ids"])
    counted = c.usage.get("completion_tokens")
    if stop:
        return [*ids, eot], counted in (len(ids), len(ids) + 1)
    ok = c.finish_reason == "length" and counted == len(ids) and bool(ids)
    return (ids or [eot]), ok  # an empty completion cannot be trained on: one masked token


def _ids_ok(ids: Any, vocab: int, limit: int | None) -> bool:
    return (isinstance(ids, list) and (limit is None or len(ids) <= limit + 1)
            and all(type(i) is int and 0 <= i < vocab for i in ids))  # fmt: skip


def make_rollout(
    serving: SolverServing, settings: SamplerSettings, out: Path, tokenizer: Any, clock: Clock,
    grammars: Mapping[str, str] | None = None,
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """`grammars`: a prompt's message text -> the grammar its completions are decoded under
    (none: free decoding)."""
    eot = end_of_turn_id(tokenizer)

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        step = int(trainer.state.global_step)
        t0 = time.monotonic()
        adapter = out / "serving" / f"step_{step}"
        shutil.rmtree(adapter, ignore_errors=True)
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(str(adapter))
        chat = serving.serve(adapter)
        clock.serve_s += time.monotonic() - t0
        for old in adapter.parent.glob("step_*"):
            if old != adapter:
                shutil.rmtree(old, ignore_errors=True)

        def one(i: int) -> tuple[Any, int]:  # the completion, the times it was asked again
            seed = random.Random(f"{settings.seed}/{step}/{i}").getrandbits(31)
            grammar = (grammars or {}).get(prompts[i][-1]["content"])
            sampling = Sampling(settings.max_completion, settings.temperature, seed=seed,
                                grammar=grammar)  # fmt: skip
            for again in range(settings.generation_retries + 1):
                try:
                    return chat.chat(prompts[i], sampling), again
                except ModelTimeout:
                    if again == settings.generation_retries:
                        raise
            raise AssertionError("unreachable")

        with ThreadPoolExecutor(settings.concurrency) as pool:
            done = list(pool.map(one, range(len(prompts))))
        completions = [c for c, _ in done]
        clock.retries += sum(a for _, a in done)
        rendered: dict[str, list[int]] = {}  # the G copies of a prompt are rendered once
        for p in prompts:
            if (key := json.dumps(p)) not in rendered:
                rendered[key] = template_ids(tokenizer, p)
        pairs = [completion_ids(c, tokenizer, eot, settings.max_completion) for c in completions]
        # A prompt the server tokenized otherwise than the local template (another tokenizer
        # or chat template) conditioned its completion on other ids: trained, it would not be
        # what was sampled, so it is masked out like any mismatch.
        ok = tuple(k and c.prompt_token_ids in (None, rendered[json.dumps(p)])
                   for (_, k), c, p in zip(pairs, completions, prompts, strict=True))  # fmt: skip
        ids = tuple(x for x, _ in pairs)
        clock.mismatches += ok.count(False)
        return {
            # the local chat template's ids (the server's, where it sent them, are the same)
            "prompt_ids": [rendered[json.dumps(p)] for p in prompts],
            "completion_ids": list(ids),
            "logprobs": None,
            "env_mask": [[int(k)] * len(x) for x, k in zip(ids, ok, strict=True)],  # 1: trained
            "whale_text": [c.text for c in completions],  # to the reward: the text as sampled
        }

    return rollout
