"""A PEFT LoRA adapter as a llama.cpp LoRA GGUF, so trained weights are served at embedded speed.

Why our own writer: llama.cpp's `convert_lora_to_gguf.py` is not installed with
llama-cpp-python (it lives in the source tree with its `conversion/` package), and for the
projections a solver adapter trains it does a small, fixed thing. This module does that thing
with the `gguf` package and follows the converter of llama.cpp as vendored by
llama-cpp-python 0.3.36 (and llama.cpp's loader, `src/llama-adapter.cpp`):

- KV: `general.architecture` (qwen2 or llama, from the base config), `general.type` =
  "adapter", `adapter.type` = "lora", `adapter.lora.alpha` (f32), `general.name`,
  `general.quantization_version`;
- tensors `blk.{i}.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight.lora_a`
  and `.lora_b`: lora_a is PEFT's `lora_A.weight` as is (torch shape (r, in), GGUF dims
  [in, r]) and lora_b is `lora_B.weight` as is ((out, r), GGUF dims [r, out]); f16 by default
  (f32 on request). llama.cpp scales by alpha / r with r = lora_b's first GGUF dim;
- llama only: llama.cpp stores q/k weights with their rows permuted for its RoPE layout
  (`LlamaModel.permute`), so lora_b of q and k gets the same row permutation (an output-side
  operation, exact); qwen2 has none.

PEFT's rsLoRA scales by alpha / sqrt(r); written as alpha' = alpha * sqrt(r) it gives the same
scale in llama.cpp (the upstream converter ignores `use_rslora`).

Refused with a ValueError that names the reason: modules other than those seven projections
(embeddings, lm_head, norms, `modules_to_save`), DoRA and the other LoRA variants, rank or
alpha patterns (and tensors whose rank differs from `r`), LoRA biases, `fan_in_fan_out`,
initialisations that rewrite the base weights (PiSSA, OLoRA, CorDA, LoftQ), architectures
other than qwen2 and llama, and shapes that do not fit the base config. The output is written
atomically (temp file, then rename).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# PEFT module name -> llama.cpp tensor name (gguf's TensorNameMap agrees; tests check it).
PROJECTIONS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# HF architecture / model_type -> llama.cpp `general.architecture`.
ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama"}

_KEY = re.compile(
    r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.("
    + "|".join(re.escape(k) for k in PROJECTIONS)
    + r")\.lora_([AB])\.weight$"
)
# Config entries that mean something this converter cannot express (falsy values are fine).
_REFUSED = {
    "use_dora": "DoRA (use_dora)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "BD-LoRA (use_bdlora)",
    "lora_bias": "LoRA biases (lora_bias)",
    "fan_in_fan_out": "fan_in_fan_out weights",
    "rank_pattern": "a rank pattern (rank_pattern)",
    "alpha_pattern": "an alpha pattern (alpha_pattern)",
    "modules_to_save": "fully trained modules (modules_to_save)",
    "trainable_token_indices": "trainable token embeddings (trainable_token_indices)",
    "layer_replication": "layer replication",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
    "velora_config": "VeLoRA (velora_config)",
}
# Initialisations that leave the base weights as they were (the others rewrite them).
_PLAIN_INITS = (True, False, "gaussian", "eva", "orthogonal")


def adapter_to_gguf(
    adapter_dir: Path,
    out: Path | None = None,
    *,
    base: Path | None = None,
    outtype: str = "f16",
) -> Path:
    """Convert the PEFT adapter in `adapter_dir` to a llama.cpp LoRA GGUF at `out` (default
    `adapter_dir / "adapter.gguf"`); returns `out`. `base` is the base model's transformers
    folder (its config.json); by default the adapter's `base_model_name_or_path` when that is
    a local folder. Without a base config a Qwen2 adapter still converts (its architecture
    comes from the adapter config and no shape check is done); a llama one needs it (head
    counts). `outtype` is "f16" or "f32"."""
    adapter_dir = Path(adapter_dir)
    out = Path(out) if out is not None else adapter_dir / "adapter.gguf"
    if outtype not in ("f16", "f32"):
        raise ValueError(f"outtype must be 'f16' or 'f32', not {outtype!r}")
    lcfg = _read_json(adapter_dir / ADAPTER_CONFIG)
    _check_config(lcfg, adapter_dir)
    hparams = _base_config(lcfg, base)
    arch = _architecture(lcfg, hparams, adapter_dir)
    if arch == "llama" and hparams is None:
        raise ValueError(
            f"{adapter_dir}: a llama adapter needs the base config (head counts): pass base="
        )
    r = int(lcfg["r"])
    alpha = float(lcfg["lora_alpha"])
    if lcfg.get("use_rslora"):
        alpha *= math.sqrt(r)  # llama.cpp scales by alpha / r; rsLoRA means alpha / sqrt(r)

    pairs = _pairs(_load_tensors(adapter_dir / ADAPTER_WEIGHTS), adapter_dir)
    dtype = np.float16 if outtype == "f16" else np.float32
    tensors: list[tuple[str, np.ndarray]] = []
    for (layer, module), (a, b) in sorted(pairs.items()):
        name = f"blk.{layer}.{PROJECTIONS[module]}.weight"
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != r or b.shape[1] != r:
            raise ValueError(
                f"{adapter_dir}: {name} has lora_A {a.shape} and lora_B {b.shape}; expected rank "
                f"r={r} everywhere (rank patterns are not supported)"
            )
        if hparams is not None:
            _check_shape(name, layer, module, a, b, hparams)
        if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            assert hparams is not None
            n_head = int(hparams["num_attention_heads"])
            n_kv = int(hparams.get("num_key_value_heads") or n_head)
            b = _llama_permute(b, n_head if module == "self_attn.q_proj" else n_kv)
        tensors.append((name + ".lora_a", np.ascontiguousarray(a, dtype=dtype)))
        tensors.append((name + ".lora_b", np.ascontiguousarray(b, dtype=dtype)))
    _write(out, arch, alpha, adapter_dir.name, tensors)
    return out


# --- reading ------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: not a PEFT adapter folder") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _check_config(lcfg: dict[str, Any], where: Path) -> None:
    if lcfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type {lcfg.get('peft_type')!r} is not LORA")
    for key, what in _REFUSED.items():
        if lcfg.get(key):
            raise ValueError(f"{where}: {what} cannot be converted to a llama.cpp LoRA")
    if lcfg.get("bias", "none") != "none":
        raise ValueError(f"{where}: bias={lcfg['bias']!r} (trained biases) cannot be converted")
    init = lcfg.get("init_lora_weights", True)
    if init not in _PLAIN_INITS:
        raise ValueError(
            f"{where}: init_lora_weights={init!r} rewrites the base weights; llama.cpp would "
            "apply the adapter to the original ones"
        )
    if "r" not in lcfg or "lora_alpha" not in lcfg:
        raise ValueError(f"{where}: adapter config has no r / lora_alpha")


def _base_config(lcfg: dict[str, Any], base: Path | None) -> dict[str, Any] | None:
    if base is not None:
        return _read_json(Path(base) / "config.json")
    name = lcfg.get("base_model_name_or_path")
    if name and (Path(name) / "config.json").is_file():
        return _read_json(Path(name) / "config.json")
    return None


def _architecture(lcfg: dict[str, Any], hparams: dict[str, Any] | None, where: Path) -> str:
    if hparams is not None:
        for a in hparams.get("architectures") or []:
            if a in ARCHITECTURES:
                return ARCHITECTURES[a]
        if hparams.get("model_type") in MODEL_TYPES:
            return MODEL_TYPES[hparams["model_type"]]
        found = hparams.get("architectures") or hparams.get("model_type")
    else:
        found = (lcfg.get("auto_mapping") or {}).get("base_model_class")
        if found in ARCHITECTURES:
            return ARCHITECTURES[found]
    raise ValueError(f"{where}: base architecture {found!r} is not one of qwen2, llama")


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ValueError(f"{path} does not exist (adapters saved as .bin are not supported)")
    try:
        from safetensors.numpy import load_file

        return dict(load_file(str(path)))
    except (TypeError, ValueError):  # bf16 has no numpy dtype: go through torch
        from safetensors.torch import load_file as load_torch

        return {k: v.float().numpy() for k, v in load_torch(str(path)).items()}


def _pairs(
    weights: dict[str, np.ndarray], where: Path
) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in weights.items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(
                f"{where}: cannot map adapter tensor {key!r} to llama.cpp (only LoRA A/B of "
                f"{', '.join(k.split('.')[-1] for k in PROJECTIONS)} in decoder layers)"
            )
        halves.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = value
    if not halves:
        raise ValueError(f"{where}: the adapter has no LoRA tensors")
    out = {}
    for k, h in halves.items():
        if set(h) != {"A", "B"}:
            raise ValueError(f"{where}: layer {k[0]} {k[1]} has lora_{''.join(h)} only")
        out[k] = (h["A"], h["B"])
    return out


def _check_shape(
    name: str, layer: int, module: str, a: np.ndarray, b: np.ndarray, hp: dict[str, Any]
) -> None:
    hidden = int(hp["hidden_size"])
    n_head = int(hp["num_attention_heads"])
    n_kv = int(hp.get("num_key_value_heads") or n_head)
    head_dim = int(hp.get("head_dim") or hidden // n_head)
    ff = int(hp["intermediate_size"])
    in_out = {
        "self_attn.q_proj": (hidden, n_head * head_dim),
        "self_attn.k_proj": (hidden, n_kv * head_dim),
        "self_attn.v_proj": (hidden, n_kv * head_dim),
        "self_attn.o_proj": (n_head * head_dim, hidden),
        "mlp.gate_proj": (hidden, ff),
        "mlp.up_proj": (hidden, ff),
        "mlp.down_proj": (ff, hidden),
    }[module]
    if layer >= int(hp["num_hidden_layers"]):
        raise ValueError(f"{name}: layer {layer} but the base has {hp['num_hidden_layers']}")
    if (a.shape[1], b.shape[0]) != in_out:
        raise ValueError(
            f"{name}: adapter maps {a.shape[1]} -> {b.shape[0]} features, the base "
            f"{in_out[0]} -> {in_out[1]} (wrong base model?)"
        )


def _llama_permute(b: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` on the rows (outputs) of lora_B."""
    rows, r = b.shape
    return b.reshape(n_head, 2, rows // n_head // 2, r).swapaxes(1, 2).reshape(rows, r)


# --- writing ------------------------------------------------------------------------------


def _write(
    out: Path, arch: str, alpha: float, name: str, tensors: list[tuple[str, np.ndarray]]
) -> None:
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        w = gguf.GGUFWriter(str(tmp), arch=arch)
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        w.add_name(name)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for tname, data in tensors:
            w.add_tensor(tname, data)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
