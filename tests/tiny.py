"""A tiny local causal LM for unit tests: a byte-level BPE tokenizer trained here on a small
built-in corpus, a Qwen2.5-style chat template, and a random-weight 2-layer `Qwen2ForCausalLM`.

Why: training and in-process-generation tests need a real transformers model (real tokenizer,
real chat template, real `generate`) but must run offline in seconds. The weights are random,
so its replies are gibberish; tests assert properties (determinism, shapes, masks, ids), never
that the model says anything sensible. Not covered: the `{% generation %}` markers of TRL's
assistant-only training template (TRL swaps in its own when it recognizes the stock one).

Use `from tests.tiny import make_tiny_model` anywhere; `tests/train/conftest.py` has the
session-scoped `tiny_model_dir` fixture.
"""

from __future__ import annotations

from pathlib import Path

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# Qwen2.5-style: one `<|im_start|>{role}\n{content}<|im_end|>\n` block per message (system, user,
# assistant, tool) and `<|im_start|>assistant\n` when asked for a generation prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "The quick brown fox jumps over the lazy dog while a careful student adds numbers and "
    "checks every answer twice before writing it down in the notebook on the kitchen table. "
    "Question, answer, system, user, assistant, tool, call, result, error, retry, final. "
    "What is the sum of two and three? It is five. What is seven times eight? It is fifty six. "
    "Please think step by step, then give the answer as a single number at the end. "
    "In the morning the weather was cold and grey, but by noon the sun came out over the hills "
    "and the children ran down to the river to watch the boats. Their teacher told them a "
    "story about a king who counted his gold every night, and a clever girl who found that "
    "one coin was missing. She measured, weighed, compared and finally explained her method. "
    "Scientists observe, predict, experiment and revise; engineers design, build, measure, "
    "improve. Libraries, museums, hospitals, schools, markets, gardens, bridges and stations "
    "fill the city. Monday Tuesday Wednesday Thursday Friday Saturday Sunday. January "
    "February March April May June July August September October November December. "
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety "
    "hundred thousand million. red orange yellow green blue purple black white silver golden. "
    "Who wrote the letter? Where did they travel? Why does ice float? How many legs has a "
    "spider? Which planet is largest? When did the train leave the station yesterday? "
)
_CODE = (
    "def add(x, y):\n    return x + y\n\nprint(add(3, 4))\n"
    "for i in range(10):\n    if i % 2 == 0:\n        total += i\n"
    '{"name": "add", "arguments": {"x": 3, "y": 4}}\n'
    '{"tool": "search", "query": "capital of France", "result": "Paris"}\n'
    "Answer: 42\nThe answer is 17.\n#### 128\n"
)
_ARITH = " ".join(
    f"{a} + {b} = {a + b}. {a} - {b} = {a - b}. {a} * {b} = {a * b}."
    for a in range(0, 40, 3)
    for b in range(0, 40, 7)
)
CORPUS = [_WORDS * 3, _CODE * 3, _ARITH]

VOCAB_SIZE = 1024


def make_tiny_model(out: Path, seed: int = 0) -> Path:
    """Build the tiny tokenizer + random Qwen2 model and `save_pretrained` both into `out`
    (created if missing); returns `out`. Same seed, same weights. fp32, ~0.2 M parameters."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(CORPUS, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=IM_END,
        pad_token=EOT,
        additional_special_tokens=[IM_START, IM_END],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(IM_END),
        pad_token_id=tok.convert_tokens_to_ids(EOT),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out)
    return out
