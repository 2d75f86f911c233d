"""The dtype LoRA training computes in: one setting, `dtype`, in each trainer's section (the
weight phase's `rsft.sft.dtype`, proposer SFT's `sft.dtype`, proposer GRPO's `grpo.dtype`):
"auto" (the default), "bf16" or "fp32".

"auto" is bf16 where the hardware has bf16 units, else fp32: on CUDA, a device that computes
bf16 natively (`torch.cuda.is_bf16_supported(including_emulation=False)`: compute capability 8
or more, or ROCm); on a CPU, the x86 flags `avx512_bf16` or `amx_bf16` in /proc/cpuinfo.
torch's own CPU capability ("AVX512") does not say whether bf16 dot products are there, and
oneDNN's bf16 check is true on any AVX-512 CPU (it emulates bf16), so the flags are read.
Not covered: ARM's bf16 (`bf16` in the aarch64 Features line) and Apple silicon: "auto" is
fp32 there, and "bf16" can be forced.

What bf16 means (the same for the three trainers): the FROZEN base weights are loaded in bf16 and
everything computes in bf16, the low-rank path of each LoRA layer too (`lora_in_base_dtype`: its
weights cast from fp32 on each forward), but for attention over fewer than 272 keys in training,
which torch computes faster in fp32 on CPUs (`short_attention_in_fp32`); the LoRA weights themselves
stay fp32, and so do their .grad (each backward's share computed in bf16, summed in fp32), the AdamW
state and the saved adapter (the same fp32 safetensors in either dtype, which
`whale.train.lora_gguf` converts). The loss (cross-entropy) is taken in fp32 on the bf16 logits.
(Until issue 25's second measurement, on a Xeon with AMX, the low-rank path ran in fp32 as PEFT does
by default; the copies of the activations that took were about a third of a bf16 step.) No autocast,
by measurement (`python -m benchmarks.rsft_throughput --model-dir <0.5B> --examples 4 --batch-size 2
--arms fp32,bf16,autocast,bf16-autocast --threads 1`, a 2-core EPYC with avx512_bf16, shared; CPU
time of the gradient steps, best of 2): fp32 14.6 s; autocast over fp32 weights 10.2 s (1.43x:
autocast casts the frozen weights again on every forward, its cast cache keeps only leaf tensors
that require grad, and a micro batch of one example does too little arithmetic to hide that copy);
bf16 weights 8.65 s (1.68x); bf16 weights under autocast 8.2 s (1.78x, but slower by wall clock,
13.9 against 13.2 s: the gain is the small LoRA matmuls, within what runs vary) at the price of
computing the trained weights' gradients in bf16 (a price the bf16 arm pays too since
`lora_in_base_dtype`). The loss after the 2 steps was within 0.0013 across the three bf16 variants
(0.026 above fp32's). bf16 weights also halve the base model's memory. So TRL's `bf16=True`
(accelerate's autocast; it works with PEFT and both TRL trainers on torch 2.13's CPU) stays off and
the base is loaded in bf16 instead.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

TrainDtype = Literal["auto", "bf16", "fp32"]  # the setting
Dtype = Literal["bf16", "fp32"]  # what a run trained in (recorded)
Device = Literal["cpu", "cuda"]
# x86 CPU flags of bf16 arithmetic units: AVX-512 BF16 dot products (Zen 4, Cooper Lake and
# later Xeons) and AMX's bf16 tiles (Sapphire Rapids and later).
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Hardware:
    """What "auto" looks at: the CPU's flags, and the CUDA device if there is one."""

    cpu_flags: frozenset[str] = frozenset()
    cuda: bool = False  # a CUDA (or ROCm) device is there: the TRL trainers train on it
    cuda_bf16: bool = False  # it computes bf16 natively

    @property
    def device(self) -> Device:
        return "cuda" if self.cuda else "cpu"

    def has_bf16(self, device: Device) -> bool:
        if device == "cuda":
            return self.cuda and self.cuda_bf16
        return bool(self.cpu_flags & CPU_BF16_FLAGS)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo text (x86 `flags : ...`; the cores of
    one machine share them). Empty when there is no such line (other architectures)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def probe(cpuinfo: Path = CPUINFO) -> Hardware:
    """This machine's Hardware (cached per path: the hardware does not change in a process)."""
    return _probe(str(cpuinfo))


@functools.cache
def _probe(cpuinfo: str) -> Hardware:
    import torch

    try:
        flags = cpu_flags(Path(cpuinfo).read_text(errors="replace"))
    except OSError:  # not Linux
        flags = frozenset()
    cuda = bool(torch.cuda.is_available())
    bf16 = cuda and bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return Hardware(cpu_flags=flags, cuda=cuda, cuda_bf16=bf16)


def resolve(choice: str, device: Device | None = None, hardware: Hardware | None = None) -> Dtype:
    """The dtype a trainer on `device` (None: the device the TRL trainers use, CUDA where there
    is one, else the CPU) trains in for the setting `choice`. `hardware`: this machine's by
    default (tests pass another). A forced "bf16" where there are no bf16 units is obeyed
    (torch emulates it, slowly) with a warning."""
    if choice not in ("auto", "bf16", "fp32"):
        raise ValueError(f"dtype: {choice!r} is not one of 'auto', 'bf16', 'fp32'")
    hw = hardware if hardware is not None else probe()
    where = device or hw.device
    if choice == "auto":
        return "bf16" if hw.has_bf16(where) else "fp32"
    if choice == "bf16" and not hw.has_bf16(where):
        log.warning("dtype 'bf16' on a %s without bf16 units: emulated, likely slower than fp32",
                    where)  # fmt: skip
    return "bf16" if choice == "bf16" else "fp32"


def torch_dtype(dtype: Dtype) -> Any:
    """The torch dtype the frozen base weights are loaded in."""
    import torch

    return torch.bfloat16 if dtype == "bf16" else torch.float32


def keep_fp32(params: Any) -> None:
    """Make the trainable (LoRA) parameters fp32 where anything made them otherwise: their
    updates, AdamW state and the saved adapter are fp32 whatever the base weights are."""
    import torch

    for p in params:
        if p.dtype != torch.float32:
            p.data = p.data.float()


def lora_in_base_dtype(model: Any) -> int:
    """Make every LoRA layer of `model` compute its low-rank path in the dtype of its input, the
    base's (bf16), with its weights cast from their fp32 masters on each forward. Returns the
    number of LoRA layers changed.

    Why: PEFT casts each LoRA layer's input to the adapter's dtype (fp32), adds the fp32 low-rank
    output to the bf16 base output (promoting it to fp32) and casts the sum back: three copies of
    an activation per projection, in both passes. On a 2-core Xeon with AMX, 1 thread, these
    (`aten::copy_`, `mul`, `add` under torch's profiler) were about a third of a bf16 step on
    700-token examples; computed in bf16, the step on the benchmark's default examples went
    from 1.78-1.82x to 1.98x faster than fp32, and it is 2.61x on 710-token and 3.08x on
    1,500-token examples (`python -m benchmarks.rsft_throughput --model-dir <0.5B> --examples 4
    --batch-size 2 --arms fp32,bf16 --threads 1 [--words 500,150]`, docs/measurements.md).
    What stays fp32: the LoRA weights, their .grad (summed in fp32 over micro batches), the
    AdamW state and the saved adapter, so a lr of 1e-6 still moves them. What changes, as under
    autocast: the low-rank path's activations and their gradients are bf16, and so is each
    backward's gradient of a LoRA weight (a bf16 matmul; the cast's backward only widens it, to
    a value bf16 holds exactly). On the tiny model one step's LoRA gradients were 0.0078 from
    fp32's (relative L2), 0.0076 with PEFT's fp32 path: the bf16 base dominates either way.
    Not covered: PEFT's LoRA variants (DoRA and the like) and non-Linear LoRA layers keep PEFT's
    own casts; whale trains neither. PEFT before 0.16 has no `lora_variant` (its DoRA is the
    `use_dora` flag), and before 0.15 no switch for the input cast: there the low-rank path
    still computes in fp32 (the cast weights are fp32 already), as PEFT does by default.
    Each plain LoRA layer also adds its low-rank path to the base output in one `addmm`
    (`FusedLoraLinear`: the scale applied to B, not to an activation), and a model on torch's
    SDPA computes attention on short sequences in fp32 while training
    (`short_attention_in_fp32`).
    Call it after every adapter is added: an adapter added later (`add_adapter`, `load_adapter`)
    has plain fp32 layers, which fail on the bf16 input this leaves uncast (TRL adds its "ref"
    adapter in the trainer's constructor, before the three trainers call this)."""
    import torch
    from peft.tuners.lora.layer import Linear as LoraLinear

    cast, fused = _cast_linear(), _fused_lora_linear()
    n = 0
    for m in model.modules():
        if isinstance(m, LoraLinear) and not _variant(m):
            m.cast_input_dtype_enabled = False  # PEFT's switch for the input cast
            for lin in [*m.lora_A.values(), *m.lora_B.values()]:
                if type(lin) is torch.nn.Linear:
                    lin.__class__ = cast  # same parameters and state dict; another forward
            if type(m) is LoraLinear:
                m.__class__ = fused
            n += 1
    short_attention_in_fp32(model)
    return n


def short_attention_in_fp32(model: Any) -> bool:
    """Make a model that uses torch's SDPA compute attention in fp32 while it trains in bf16 on
    fewer than `FP32_ATTENTION_BELOW` keys (its inputs cast up, its output back), and as before
    otherwise. Returns whether the model's attention was changed (not for other kernels).

    Why: torch's CPU flash-attention backward in bf16 is slower than in fp32 on short sequences.
    Forward + backward of one Qwen2.5-0.5B layer's attention (14 query heads, 2 KV heads, causal), 1
    thread, a 2-core Xeon with AMX, torch 2.13, quiet (`python -m benchmarks.rsft_throughput ...
    --attention`): 129 keys fp32 1.9 ms / bf16 5.0 ms, 258 keys 6.1 / 7.5 ms, 512 keys 21.5 / 16.4
    ms, 700 keys 33.7 / 28.8 ms, 1,500 keys 121.3 / 81.2 ms; in a bf16 step of the weight phase on
    ~130-token examples, attention's backward was 11% of the step. Around the crossover, the same
    command's function run twice beside other work (2026-12-05): 258 keys fp32 0.87x bf16's time,
    288 keys 1.01-1.06x, 384 keys 1.23-1.27x, so the bound sits between the two (272, where an
    earlier, ad hoc timing put it). Only in training mode (`module.training`), so a checkpointed
    layer's recompute computes what its forward did; `loss` (eval mode) keeps bf16, and so does
    generation in eval mode, but TRL's GRPO generates in training mode: its sequences of fewer keys
    are attended in fp32 there too, forward only, where bf16's kernel is the faster one (what that
    costs was not measured; the Harness Learning experiment generates on the llama.cpp server
    instead, `grpo.generation = "embedded"`). Not covered: other attention kernels (eager, flex) are
    left as they are."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    _register_attention()
    try:
        base.set_attn_implementation(ATTENTION)
    except (ValueError, ImportError) as e:  # a model class that refuses a registered function
        log.warning("attention left as SDPA: %s", e)
    # What the model says it uses: transformers may leave it unchanged without raising.
    return getattr(base.config, "_attn_implementation", None) == ATTENTION


FP32_ATTENTION_BELOW = 272  # keys; the measured crossover (above) is between 258 and 288
ATTENTION = "whale_sdpa"  # the name registered with transformers' attention interfaces


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the masks SDPA takes


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
               **kwargs: Any) -> tuple[Any, Any]:  # fmt: skip
    """transformers' SDPA attention, in fp32 for a bf16 layer training on few keys."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.dtype == torch.bfloat16 and query.device.type == "cpu" and module.training
            and key.shape[-2] < FP32_ATTENTION_BELOW):  # fmt: skip
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                              attention_mask, **kwargs)  # fmt: skip
        return out.to(query.dtype), weights
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _variant(layer: Any) -> bool:
    """Whether a LoRA layer holds an adapter of a variant (DoRA, aLoRA, ...) for any adapter:
    `lora_variant` from PEFT 0.16 on, the `use_dora` flags before it."""
    dora = getattr(layer, "use_dora", {})
    return bool(getattr(layer, "lora_variant", None)) or any(dora.values())


@functools.cache
def _cast_linear() -> type:
    import torch
    import torch.nn.functional as F

    class CastLinear(torch.nn.Linear):
        """An nn.Linear that computes in its input's dtype (its fp32 weights cast on the fly)."""

        def forward(self, x: Any) -> Any:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.weight.to(x.dtype), bias)

    CastLinear.__module__, CastLinear.__qualname__ = __name__, "CastLinear"  # pickle finds it
    return CastLinear


@functools.cache
def _fused_lora_linear() -> type:
    import torch
    import torch.nn.functional as F
    from peft.tuners.lora.layer import Linear as LoraLinear

    class FusedLoraLinear(LoraLinear):
        """A PEFT LoRA Linear whose one active adapter is added to the base output by one
        `addmm`, `base + (x A^T)(s B)^T`, in the input's dtype. PEFT computes `(x A^T) B^T`,
        multiplies it by the scale s and adds it to the base output: two more passes over an
        activation of the layer's output width, in the forward and again in the backward; here
        s scales the small B (r x out) instead. Anything else (no adapter or several active,
        merged weights, a LoRA bias, extra arguments, LoRA weights partitioned by DeepSpeed
        ZeRO-3, which gathers them only in lora_A's and lora_B's own forward hooks) is PEFT's
        own forward."""

        def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
            active = self.active_adapters
            name = active[0] if len(active) == 1 else None
            if (args or kwargs or name is None or self.disable_adapters or self.merged
                    or name not in self.lora_A or self.lora_B[name].bias is not None
                    or _variant(self) or hasattr(self.lora_A[name].weight, "ds_id")
                    or hasattr(self.lora_B[name].weight, "ds_id")):  # fmt: skip
                return super().forward(x, *args, **kwargs)
            result = self.base_layer(x)
            if result.dtype != x.dtype:
                return super().forward(x, *args, **kwargs)
            a: Any = self.lora_A[name].weight.to(x.dtype)
            b: Any = (self.lora_B[name].weight * self.scaling[name]).to(x.dtype)
            low = F.linear(self.lora_dropout[name](x), a)
            out = torch.addmm(result.reshape(-1, result.shape[-1]),
                              low.reshape(-1, low.shape[-1]), b.t())  # fmt: skip
            return out.view(result.shape)

    FusedLoraLinear.__module__, FusedLoraLinear.__qualname__ = __name__, "FusedLoraLinear"
    return FusedLoraLinear


def __getattr__(name: str) -> Any:
    """`CastLinear` and `FusedLoraLinear`, made on first use (torch and PEFT are imported lazily
    here): so that a model holding them pickles (torch.save of the whole model) and unpickles
    in a fresh process. Unpickling looks them up here, so this registers the attention such a
    model was switched to (`ATTENTION`) too: its config names it."""
    if name in ("CastLinear", "FusedLoraLinear"):
        _register_attention()
        return _cast_linear() if name == "CastLinear" else _fused_lora_linear()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
