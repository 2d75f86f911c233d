"""In-process chat with transformers, optionally through a PEFT LoRA adapter.

Why: the exact fallback for serving trained weights (the adapter as PEFT saved it, no GGUF
conversion, fp32), and the backend the training unit tests use with the tiny local model. It is
slow on CPU (docs/measurements.md) and serves one request at a time: a lock covers loading
and generation.

Sampling is plain: temperature (0 = greedy) and top_p only; top_k and repetition penalty are
switched off whatever the model's `generation_config` says, so that a Sampling means the same
thing for every model. Not supported: grammars and function tools (a ModelError says so),
batching, streaming. torch, transformers and peft are imported on first use only.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from whale.models.base import (
    Completion,
    ContextOverflow,
    Message,
    ModelError,
    ModelNotFound,
    ModelTimeout,
    Sampling,
    template_messages,
)

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def adapter_digest(adapter_dir: Path) -> str:
    """sha256[:12] over the bytes of `adapter_model.safetensors` then `adapter_config.json`:
    names the adapter in the model name (and so in cache keys and records) by content."""
    adapter_dir = Path(adapter_dir)
    h = hashlib.sha256()
    for name in ADAPTER_FILES:
        path = adapter_dir / name
        if not path.is_file():
            raise ModelNotFound(f"adapter {adapter_dir}: missing {name}")
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


class TransformersChat:
    """A ChatModel over a transformers checkpoint directory (`save_pretrained` layout with a
    tokenizer that has a chat template), plus an optional PEFT adapter directory."""

    def __init__(
        self,
        model_dir: str | Path,
        adapter: str | Path | None = None,
        alias: str | None = None,
        threads: int | None = None,
        device: str = "cpu",
    ) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise ModelNotFound(f"{self.model_dir} is not a transformers model directory")
        self.adapter = Path(adapter) if adapter is not None else None
        self.threads = threads
        self.device = device
        self.name = f"hf:{alias or self.model_dir.name}"
        if self.adapter is not None:
            self.name += f"+{adapter_digest(self.adapter)}"
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None

    # -- loading -------------------------------------------------------------------------------

    def _load(self) -> None:
        """Load tokenizer, model and adapter once; the caller holds the lock."""
        if self._model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            model: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise ModelNotFound(f"cannot load {self.model_dir}: {e}") from e
        if tokenizer.chat_template is None:
            raise ModelError(f"{self.model_dir}: the tokenizer has no chat template")
        if self.adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(self.adapter))
        model.to(self.device)
        model.eval()
        self._tokenizer, self._model = tokenizer, model

    def _eos_ids(self) -> list[int]:
        """The ids that end a reply: the generation config's eos ids and the tokenizer's eos."""
        ids: set[int] = set()
        eos = self._model.generation_config.eos_token_id
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(eos)
        if self._tokenizer.eos_token_id is not None:
            ids.add(self._tokenizer.eos_token_id)
        return sorted(ids)

    def _max_positions(self) -> int | None:
        config = self._model.config
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if value else None

    # -- chat ----------------------------------------------------------------------------------

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        """Generate one reply.

        `token_ids` are the generated ids: with the eos id at the end when the model stopped on
        eos; when a stop string cut the reply, the ids up to and including the token that
        completed the first stop string (so they decode to the text plus the stop string and
        possibly a few characters after it, never less than the text). A prompt longer than
        the model's positions raises ContextOverflow; a reply that would run past them is cut
        there with finish_reason "length". `timeout` is checked between tokens (ModelTimeout).
        """
        if sampling.grammar is not None or sampling.tools is not None:
            # Generation here reads no tool calls out of a reply: tools are refused, never
            # dropped.
            raise ModelError(f"{self.name} does not support grammar/tools (in-process "
                             "generation takes no grammar and returns no tool calls; serve "
                             "the model with the native llama-server or an OpenAI-compatible "
                             "server)")  # fmt: skip
        with self._lock:
            self._load()
            return self._generate(messages, sampling, timeout)

    def _generate(
        self, messages: list[Message], sampling: Sampling, timeout: float | None
    ) -> Completion:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        tok, model = self._tokenizer, self._model
        try:
            encoded = tok.apply_chat_template(
                template_messages(messages), add_generation_prompt=True, tokenize=True,
                return_dict=True,
            )  # fmt: skip
        except Exception as e:  # jinja errors on malformed messages
            raise ModelError(f"{self.name}: cannot render the chat template: {e}") from e
        prompt_ids = [int(i) for i in encoded["input_ids"]]
        limit = self._max_positions()
        if limit is not None and len(prompt_ids) >= limit:
            raise ContextOverflow(
                f"{self.name}: prompt of {len(prompt_ids)} tokens fills all {limit} positions"
            )
        max_new = max(0, sampling.max_tokens)
        if limit is not None:
            max_new = min(max_new, limit - len(prompt_ids))
        if max_new == 0:
            return self._completion("", "length", [], prompt_ids)

        deadline = None if timeout is None else time.monotonic() + timeout
        timed_out = False

        class Deadline(StoppingCriteria):  # type: ignore[misc]
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                nonlocal timed_out
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                done = torch.full((input_ids.shape[0],), timed_out, dtype=torch.bool)
                return done.to(input_ids.device)

        eos_ids = self._eos_ids()
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
        sample = sampling.temperature > 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "do_sample": sample,
            "eos_token_id": eos_ids,
            "pad_token_id": pad_id,
            "repetition_penalty": 1.0,
            "stopping_criteria": StoppingCriteriaList([Deadline()]),
        }
        if sample:
            kwargs.update(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=0, min_p=0.0
            )
        else:  # transformers' neutral values: it would warn about (unused) others
            kwargs.update(temperature=1.0, top_p=1.0, top_k=50)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        input_ids = torch.tensor([prompt_ids], device=self.device)
        attention = torch.ones_like(input_ids)
        # Seed a private copy of the RNG state so the same seed gives the same sample without
        # disturbing the caller's global torch RNG.
        devices: list[int] | None = [] if self.device == "cpu" else None  # None: all CUDA
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        if timed_out:
            raise ModelTimeout(f"{self.name}: no reply within {timeout} s")
        ids = [int(i) for i in out[0, len(prompt_ids) :]]
        return self._finish(ids, prompt_ids, eos_ids, sampling.stop, max_new)

    def _finish(
        self,
        ids: list[int],
        prompt_ids: list[int],
        eos_ids: list[int],
        stop: tuple[str, ...],
        max_new: int,
    ) -> Completion:
        tok = self._tokenizer
        text = tok.decode(ids, skip_special_tokens=True)
        cut = _first_stop(text, stop)
        if cut is not None:
            text = text[: cut[0]]
            # The shortest prefix of ids whose text holds the stop string.
            for k in range(1, len(ids) + 1):
                if _first_stop(tok.decode(ids[:k], skip_special_tokens=True), stop) is not None:
                    ids = ids[:k]
                    break
            return self._completion(text, "stop", ids, prompt_ids)
        if ids and ids[-1] in eos_ids:
            return self._completion(text, "stop", ids, prompt_ids)
        reason = "length" if len(ids) >= max_new else "stop"
        return self._completion(text, reason, ids, prompt_ids)

    @staticmethod
    def _completion(text: str, reason: str, ids: list[int], prompt_ids: list[int]) -> Completion:
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }
        return Completion(text, reason, usage, token_ids=ids, prompt_token_ids=prompt_ids)

    def close(self) -> None:
        """Drop the weights; a later chat loads them again."""
        with self._lock:
            self._model = None
            self._tokenizer = None


def _first_stop(text: str, stop: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string in `text`, or None."""
    hits = [(i, s) for s in stop if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None
