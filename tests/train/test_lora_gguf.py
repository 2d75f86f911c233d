"""PEFT adapter -> llama.cpp LoRA GGUF: names, shapes, alpha and refusals on tiny local models;
on the real models, llama.cpp with the converted adapter computes what transformers + PEFT
computes (logits within the base's own Q4-vs-fp32 noise), a zero adapter changes nothing and a
random one changes the output."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import require_model
from whale.train.lora_gguf import PROJECTIONS, adapter_to_gguf

pytest.importorskip("peft")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# --- helpers (also used by benchmarks/serve_adapter.py) -------------------------------------


def randomize_lora_b(model: Any, std: float, seed: int = 0) -> None:
    """Give every lora_B of a PEFT model N(0, std) entries (PEFT initializes them to zero)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def peft_model(base_dir: Path, targets: list[str] = ALL, r: int = 32, alpha: int = 64, **kw: Any):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        str(base_dir), dtype=torch.float32, local_files_only=True
    )
    return get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, **kw))


def save_random_adapter(
    base_dir: Path, out: Path, std: float = 0.02, targets: list[str] = ALL, r: int = 32,
    alpha: int = 64, seed: int = 0,
) -> Path:  # fmt: skip
    """A PEFT adapter of `base_dir` with random lora_B (std) saved into `out`; returns `out`."""
    model = peft_model(base_dir, targets, r, alpha)
    randomize_lora_b(model, std, seed)
    model.save_pretrained(str(out))
    return out


_LLAMA_LOGITS = """
import sys, numpy as np
from whale.models.llama_server import extra_bufts_off
from llama_cpp import llama_cpp as lc
if extra_bufts_off():  # the AMX crash workaround of whale.models.llama_server
    default = lc.llama_model_default_params
    def params():
        p = default(); p.use_extra_bufts = False; return p
    lc.llama_model_default_params = params
from llama_cpp import Llama
gguf, lora, ids, out = sys.argv[1], sys.argv[2] or None, sys.argv[3], sys.argv[4]
ids = [int(x) for x in ids.split(",")]
llm = Llama(gguf, lora_path=lora, logits_all=True, n_ctx=512, n_threads=2, verbose=False)
llm.eval(ids)
np.save(out, np.array(llm.scores[: len(ids)], dtype=np.float32))
"""


def llama_logits(gguf: Path, lora: Path | None, ids: list[int], tmp: Path) -> np.ndarray:
    """llama.cpp's logits at every position of `ids` (a subprocess: llama.cpp stays out of the
    test process)."""
    out = tmp / f"logits-{len(list(tmp.glob('logits-*')))}.npy"
    subprocess.run(
        [sys.executable, "-c", _LLAMA_LOGITS, str(gguf), str(lora or ""),
         ",".join(map(str, ids)), str(out)],
        check=True, timeout=300,
    )  # fmt: skip
    return np.load(out)


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).mean())


# --- unit tests on tiny models --------------------------------------------------------------


def _tiny_adapter(base: Path, out: Path, targets: list[str] = ALL, **kw: Any) -> Path:
    model = peft_model(base, targets, r=4, alpha=8, **kw)
    randomize_lora_b(model, 0.1)
    model.save_pretrained(str(out))
    return out


def _reader(path: Path):
    import gguf

    return gguf.GGUFReader(str(path))


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def test_names_shapes_alpha_and_values(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    adapter = _tiny_adapter(tiny_model_dir, tmp_path / "ad")
    out = adapter_to_gguf(adapter)
    assert out == adapter / "adapter.gguf" and out.is_file()
    assert [p.name for p in adapter.iterdir() if p.name.startswith(".")] == []  # no temp left
    r = _reader(out)
    assert _field(r, "general.architecture") == "qwen2"
    assert _field(r, "general.type") == "adapter"
    assert _field(r, "adapter.type") == "lora"
    assert _field(r, "adapter.lora.alpha") == pytest.approx(8.0)

    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    hidden, ff = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = hidden // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    in_out = {"attn_q": (hidden, hidden), "attn_k": (hidden, kv), "attn_v": (hidden, kv),
              "attn_output": (hidden, hidden), "ffn_gate": (hidden, ff),
              "ffn_up": (hidden, ff), "ffn_down": (ff, hidden)}  # fmt: skip
    tensors = {t.name: t for t in r.tensors}
    expected = {
        f"blk.{i}.{n}.weight.lora_{ab}"
        for i in range(cfg["num_hidden_layers"]) for n in in_out for ab in "ab"
    }  # fmt: skip
    assert set(tensors) == expected
    peft = load_file(str(adapter / "adapter_model.safetensors"))
    hf_names = {v: k for k, v in PROJECTIONS.items()}
    for name, t in tensors.items():
        layer, proj = int(name.split(".")[1]), name.split(".")[2]
        n_in, n_out = in_out[proj]
        # GGUF dims are numpy's reversed: lora_a [in, r], lora_b [r, out] (llama-adapter.cpp).
        want = [n_in, 4] if name.endswith("lora_a") else [4, n_out]
        assert [int(d) for d in t.shape] == want, name
        assert t.tensor_type.name == "F16"
        key = (f"base_model.model.model.layers.{layer}.{hf_names[proj]}."
               f"lora_{'A' if name.endswith('lora_a') else 'B'}.weight")  # fmt: skip
        np.testing.assert_allclose(np.asarray(t.data, np.float32), peft[key], rtol=1e-3, atol=1e-4)


def test_names_agree_with_gguf_tensor_map() -> None:
    import gguf

    for arch in (gguf.MODEL_ARCH.QWEN2, gguf.MODEL_ARCH.LLAMA):
        tmap = gguf.get_tensor_name_map(arch, 4)
        for module, name in PROJECTIONS.items():
            assert tmap.get_name(f"model.layers.3.{module}") == f"blk.3.{name}"


def test_subset_f32_and_rslora(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = _tiny_adapter(
        tiny_model_dir,
        tmp_path / "ad",
        ["q_proj", "v_proj"],
        use_rslora=True,
        task_type="CAUSAL_LM",
    )
    out = adapter_to_gguf(adapter, tmp_path / "x" / "a.gguf", outtype="f32")
    r = _reader(out)
    assert {t.name.split(".")[2] for t in r.tensors} == {"attn_q", "attn_v"}
    assert {t.tensor_type.name for t in r.tensors} == {"F32"}
    # rsLoRA scales by alpha / sqrt(r); llama.cpp by alpha' / r, so alpha' = alpha * sqrt(r).
    assert _field(r, "adapter.lora.alpha") == pytest.approx(8.0 * math.sqrt(4))


@pytest.mark.parametrize(
    "targets, kw, reason",
    [
        (ALL, {"use_dora": True}, "DoRA"),
        (ALL, {"rank_pattern": {"q_proj": 2}}, "rank pattern"),
        (ALL, {"modules_to_save": ["lm_head"]}, "modules_to_save"),
        (ALL, {"bias": "lora_only"}, "bias"),
        (["q_proj", "embed_tokens"], {}, "embed_tokens"),
    ],
)
def test_refuses_what_llama_cpp_cannot_apply(
    tiny_model_dir: Path, tmp_path: Path, targets: list[str], kw: dict[str, Any], reason: str
) -> None:
    adapter = _tiny_adapter(tiny_model_dir, tmp_path / "ad", targets, **kw)
    with pytest.raises(ValueError, match=reason):
        adapter_to_gguf(adapter)
    assert not (adapter / "adapter.gguf").exists()


def test_refuses_rank_mismatch_and_wrong_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    adapter = _tiny_adapter(tiny_model_dir, tmp_path / "ad")
    # Tensors of another rank than the config's r (a rank pattern written by hand).
    w = load_file(str(adapter / "adapter_model.safetensors"))
    key = next(k for k in w if "q_proj.lora_A" in k)
    w[key] = w[key][:2]
    w[key.replace("lora_A", "lora_B")] = w[key.replace("lora_A", "lora_B")][:, :2].copy()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    save_file(w, str(bad / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="rank"):
        adapter_to_gguf(bad)
    # A base config whose sizes differ from the adapter's.
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    cfg["intermediate_size"] *= 2
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="wrong base"):
        adapter_to_gguf(adapter, base=other)
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="gpt2|GPT2"):
        adapter_to_gguf(adapter, base=other)


def test_llama_q_k_rows_follow_llama_cpp_rope_layout(tmp_path: Path) -> None:
    """llama.cpp stores llama q/k rows per head as interleaved pairs (row 2i+k of a head is
    HF's row k*half+i); lora_B of q and k must be stored the same way, the rest as is."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.numpy import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    base = tmp_path / "llama"
    LlamaForCausalLM(cfg).save_pretrained(str(base))
    model = get_peft_model(
        LlamaForCausalLM.from_pretrained(str(base)),
        LoraConfig(r=4, lora_alpha=4, target_modules=ALL),
    )
    randomize_lora_b(model, 1.0)
    model.save_pretrained(str(tmp_path / "ad"))
    out = adapter_to_gguf(tmp_path / "ad", outtype="f32")
    assert _field(_reader(out), "general.architecture") == "llama"
    got = {t.name: np.asarray(t.data) for t in _reader(out).tensors}
    peft = load_file(str(tmp_path / "ad" / "adapter_model.safetensors"))
    prefix = "base_model.model.model.layers.0."
    head_dim = 32 // 4
    half = head_dim // 2
    for module, heads in (("self_attn.q_proj", 4), ("self_attn.k_proj", 2)):
        hf_b = peft[prefix + module + ".lora_B.weight"]
        gg_b = got[f"blk.0.{PROJECTIONS[module]}.weight.lora_b"]
        for h in range(heads):
            for i in range(half):
                for k in range(2):
                    np.testing.assert_array_equal(
                        gg_b[h * head_dim + 2 * i + k], hf_b[h * head_dim + k * half + i]
                    )
        np.testing.assert_array_equal(
            got[f"blk.0.{PROJECTIONS[module]}.weight.lora_a"],
            peft[prefix + module + ".lora_A.weight"],
        )
    np.testing.assert_array_equal(
        got["blk.0.attn_v.weight.lora_b"], peft[prefix + "self_attn.v_proj.lora_B.weight"]
    )
    # Without the base config a llama adapter cannot be converted (head counts unknown).
    cfg_path = tmp_path / "ad" / "adapter_config.json"
    acfg = json.loads(cfg_path.read_text())
    acfg["base_model_name_or_path"] = str(tmp_path / "nowhere")
    cfg_path.write_text(json.dumps(acfg))
    with pytest.raises(ValueError, match="llama"):
        adapter_to_gguf(tmp_path / "ad")


# --- the real models ------------------------------------------------------------------------

MESSAGES = [
    {"role": "user", "content": "Write a Python function that returns the square of a number."}
]
TEXT = [*MESSAGES, {"role": "assistant",
                    "content": "def square(x):\n    return x * x\n\nThis multiplies the number by itself."}]  # fmt: skip


def _agreement_case(name: str, targets: list[str], std: float, tmp: Path) -> dict[str, float]:
    """Mean |logit difference| over every position of a fixed chat text between llama.cpp
    (base, base + converted adapter) and transformers (base, base + PEFT adapter)."""
    import torch

    from whale.train.checkpoint import base_tokenizer, trainable_checkpoint

    gguf = require_model(name)
    ck = trainable_checkpoint(name)
    tok = base_tokenizer(ck)
    ids = tok(tok.apply_chat_template(TEXT, tokenize=False), add_special_tokens=False)["input_ids"]
    model = peft_model(ck, targets)
    randomize_lora_b(model, std)
    model.save_pretrained(str(tmp / "ad"))
    with torch.no_grad():
        hf_lora = model(torch.tensor([ids])).logits[0].numpy()
        with model.disable_adapter():
            hf_base = model(torch.tensor([ids])).logits[0].numpy()
    del model
    lora = adapter_to_gguf(tmp / "ad")
    ll_base = llama_logits(gguf, None, ids, tmp)
    ll_lora = llama_logits(gguf, lora, ids, tmp)
    return {
        "noise": mean_abs(ll_base, hf_base),  # Q4 kernels vs fp32 on the same weights
        "match": mean_abs(ll_lora, hf_lora),
        "vs_base": mean_abs(ll_lora, hf_base),
    }


@pytest.mark.model
@pytest.mark.slow
def test_qwen_adapter_computes_what_peft_computes(tmp_path: Path) -> None:
    # Measured: noise 0.053, match 0.076, vs_base 1.60 (std 0.02); the same adapter applied with
    # half or twice the scale in transformers is 1.02 / 3.95 away.
    d = _agreement_case("qwen-coder-0.5b", ALL, 0.02, tmp_path)
    assert d["match"] < 2 * d["noise"], d
    assert d["match"] < 0.25 * d["vs_base"], d


@pytest.mark.model
@pytest.mark.slow
def test_llama_adapter_computes_what_peft_computes(tmp_path: Path) -> None:
    # SmolLM2 is a llama: q/k lora_B rows must follow llama.cpp's RoPE permutation. Measured:
    # noise 0.198, match 0.212, vs_base 1.29; without the permutation match is 2.08.
    d = _agreement_case("smollm2-135m", ["q_proj", "k_proj"], 0.1, tmp_path)
    assert d["match"] < 1.5 * d["noise"], d
    assert d["match"] < 0.4 * d["vs_base"], d


@pytest.mark.model
@pytest.mark.slow
def test_embedded_server_applies_the_adapter(tmp_path: Path) -> None:
    from whale.models.base import Sampling
    from whale.models.embedded import EmbeddedLlama
    from whale.train.checkpoint import trainable_checkpoint

    gguf = require_model("qwen-coder-0.5b")
    ck = trainable_checkpoint("qwen-coder-0.5b")
    model = peft_model(ck)
    model.save_pretrained(str(tmp_path / "zero"))  # PEFT's init: lora_B = 0
    randomize_lora_b(model, 0.02)
    model.save_pretrained(str(tmp_path / "random"))
    del model
    sampling = Sampling(max_tokens=32, temperature=0.0)
    texts, names = {}, {}
    for label in ("base", "zero", "random"):
        lora = None if label == "base" else adapter_to_gguf(tmp_path / label)
        m = EmbeddedLlama(gguf, alias="q", n_ctx=512, threads=1, lora=lora)
        try:
            texts[label] = m.chat(MESSAGES, sampling).text
        finally:
            m.close()
        names[label] = m.name
    assert texts["zero"] == texts["base"]
    assert texts["random"] != texts["base"]
    assert names["base"] == "embedded:q"
    assert len({names["base"], names["zero"], names["random"]}) == 3
    assert all(n.startswith("embedded:q+") and len(n) == len("embedded:q+") + 12
               for n in (names["zero"], names["random"]))  # fmt: skip
