"""bf16 training (whale.train.precision) on the tiny model: "auto" reads the hardware it is
given, "fp32" forces fp32, one bf16 step's loss and gradients agree with fp32's, 20 bf16 steps
end near fp32's loss, the saved adapter is the same fp32 format either way (and converts to a
LoRA GGUF), the dtype is recorded and keys what a resume or a finished run reuses, and a bad
value is a ConfigError naming its key.

Tolerances, from the measurement they were set against (tiny model, seed 0, this file's
settings): one step, loss within 1e-3 relative (measured 1e-5) and gradient relative error
(L2) within 0.03 (measured 0.007), cosine >= 0.999 (0.99998); after 20 steps at lr 1e-2 (the
loss falls by ~0.48 nats), losses within 0.02 nats (measured 0.005).
"""

from __future__ import annotations

import json

import pytest

from tests.train.test_proposer_grpo import PROMPTS, LetterReward
from tests.train.test_proposer_grpo import settings as grpo_settings
from tests.train.test_proposer_sft import dataset
from tests.train.test_proposer_sft import settings as sft_settings
from tests.train.test_sft import LORA, PAIRS
from whale.config import ConfigError, load
from whale.train.data import IGNORE, Example, end_of_turn_id, template_ids
from whale.train.precision import Hardware, cpu_flags, probe, resolve
from whale.train.sft import LoraTrainer, SFTSettings

EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"
AVX512 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\n"


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def examples(tiny_model_dir) -> list[Example]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = []
    for i, (q, a) in enumerate(PAIRS):
        p = template_ids(tok, [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": q}])  # fmt: skip
        c = tok(a, add_special_tokens=False)["input_ids"] + [end_of_turn_id(tok)]
        out.append(Example(p + c, [IGNORE] * len(p) + c, f"q{i}#0"))
    return out


def trainer(model_dir, dtype: str, batch_size: int = 5, lr: float = 1e-2) -> LoraTrainer:
    sft = SFTSettings(lr=lr, batch_size=batch_size, threads=1, dtype=dtype)  # type: ignore[arg-type]
    return LoraTrainer(model_dir, LORA, sft, seed=0)


# -- what "auto" picks -------------------------------------------------------------------------
@pytest.mark.parametrize(("cpuinfo", "want"), [(EPYC, "bf16"), (AMX, "bf16"), (AVX512, "fp32"),
                                               (ARM, "fp32"), ("", "fp32")])  # fmt: skip
def test_auto_on_a_cpu_follows_its_bf16_flags(cpuinfo, want):
    assert resolve("auto", "cpu", Hardware(cpu_flags(cpuinfo))) == want


@pytest.mark.parametrize(("cuda_bf16", "want"), [(True, "bf16"), (False, "fp32")])
def test_auto_on_cuda_follows_the_device_not_the_cpu(cuda_bf16, want):
    hw = Hardware(cpu_flags(EPYC if not cuda_bf16 else AVX512), cuda=True, cuda_bf16=cuda_bf16)
    assert resolve("auto", None, hw) == want  # None: where the TRL trainers train (CUDA)


def test_the_weight_phase_trainer_looks_at_the_cpu_even_beside_a_gpu():
    hw = Hardware(cpu_flags(AVX512), cuda=True, cuda_bf16=True)
    assert resolve("auto", "cpu", hw) == "fp32"


@pytest.mark.parametrize("cpuinfo", [EPYC, AMX])
def test_fp32_is_forced_on_bf16_hardware(cpuinfo):
    hw = Hardware(cpu_flags(cpuinfo), cuda=True, cuda_bf16=True)
    assert resolve("fp32", "cpu", hw) == resolve("fp32", "cuda", hw) == "fp32"


def test_bf16_is_obeyed_without_bf16_units():
    assert resolve("bf16", "cpu", Hardware(cpu_flags(AVX512))) == "bf16"


def test_probe_reads_the_cpuinfo_file(tmp_path):
    (tmp_path / "amx").write_text(AMX)
    (tmp_path / "plain").write_text(AVX512)
    assert probe(tmp_path / "amx").has_bf16("cpu")
    assert not probe(tmp_path / "plain").has_bf16("cpu")
    assert probe(tmp_path / "missing").cpu_flags == frozenset()


def test_fp32_setting_loads_fp32_weights(tiny_model_dir):
    import torch

    t = trainer(tiny_model_dir, "fp32")
    try:
        assert t.dtype == "fp32"
        assert {p.dtype for p in t.model.parameters()} == {torch.float32}
    finally:
        t.close()


def test_bf16_loads_bf16_base_weights_and_fp32_lora_weights(tiny_model_dir):
    import torch

    t = trainer(tiny_model_dir, "bf16")
    try:
        frozen = {p.dtype for p in t.model.parameters() if not p.requires_grad}
        assert frozen == {torch.bfloat16} and {p.dtype for p in t.params} == {torch.float32}
    finally:
        t.close()


def test_bf16_computes_the_lora_path_in_bf16_from_fp32_masters(tiny_model_dir, examples):
    """The low-rank path takes the base's bf16 activations as they are (no fp32 copy of them)
    and its output is bf16; the weights it is computed from stay fp32 parameters."""
    import torch
    from peft.tuners.lora.layer import Linear as LoraLinear

    t = trainer(tiny_model_dir, "bf16")
    try:
        layers = [m for m in t.model.modules() if isinstance(m, LoraLinear)]
        seen: list[tuple[object, object]] = []
        inside: list[bool] = []  # within a LoRA layer's forward

        def after(m, i, o) -> None:
            inside.pop()
            seen.append((i[0].dtype, o.dtype))

        hooks = [h for m in layers for h in (
            m.register_forward_pre_hook(lambda m, i: inside.append(True)),
            m.register_forward_hook(after),
        )]  # fmt: skip
        casts: list[tuple[tuple[int, ...], object, object]] = []
        real_to = torch.Tensor.to

        def spy(self, *a, **k):  # every cast within a LoRA layer's forward
            out = real_to(self, *a, **k)
            if inside and out.dtype != self.dtype:
                casts.append((tuple(self.shape), self.dtype, out.dtype))
            return out

        torch.Tensor.to = spy  # type: ignore[method-assign]
        try:
            t.loss(examples[:1])
        finally:
            torch.Tensor.to = real_to  # type: ignore[method-assign]
        for h in hooks:
            h.remove()
        weights = {tuple(p.shape) for p in t.params}
        assert layers and len(seen) == len(layers)
        assert set(seen) == {(torch.bfloat16, torch.bfloat16)}
        assert casts and {(a, b) for _, a, b in casts} == {(torch.float32, torch.bfloat16)}
        assert {shape for shape, _, _ in casts} == weights  # weights cast; no activation
        assert {p.dtype for p in t.params} == {torch.float32}
    finally:
        t.close()


@pytest.mark.parametrize("case", ["plain", "dropout", "merged", "two active", "lora bias",
                                  "scale"])
def test_review_the_fused_forward_equals_pefts_in_every_case(tiny_model_dir, case):
    """Each case the fused forward takes (one adapter, base + (x A^T)(s B)^T in one addmm;
    dropout: the same mask; a scale set after) or hands to PEFT (merged weights, two active
    adapters, a LoRA bias): the output and gradients PEFT's forward gives (fp32, where the two
    orders round alike), on a model where every adapter's B is non-zero; with adapters off,
    the base layer's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers import AutoModelForCausalLM

    from whale.train.precision import FusedLoraLinear, lora_in_base_dtype

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    kw = dict(r=4, lora_alpha=12, target_modules=["q_proj"], task_type="CAUSAL_LM",
              lora_dropout=0.5 if case == "dropout" else 0.0, lora_bias=case == "lora bias")
    model = get_peft_model(base, LoraConfig(**kw))  # type: ignore[arg-type]
    if case == "two active":
        model.add_adapter("other", LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj"]))
    lora_in_base_dtype(model)
    m = next(m for m in model.modules() if isinstance(m, LoraLinear))
    assert type(m) is FusedLoraLinear
    for lin in [*m.lora_B.values()]:
        torch.nn.init.normal_(lin.weight)
        if lin.bias is not None:
            torch.nn.init.normal_(lin.bias)
    if case == "merged":
        m.merge()
    if case == "two active":
        m.set_adapter(["default", "other"])  # both trainable
    if case == "scale":
        m.set_scale("default", 5.0)
    m.train()
    x = torch.randn(2, 5, m.in_features, requires_grad=True)
    outs = []
    for forward in (FusedLoraLinear.forward, LoraLinear.forward):
        torch.manual_seed(3)  # the same dropout mask
        y = forward(m, x)
        y.pow(2).sum().backward()
        grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
        outs.append((y.detach(), x.grad.clone(), *grads))
        m.zero_grad(set_to_none=True)
        x.grad = None
    assert len(outs[0]) == len(outs[1])
    for fused, peft in zip(*outs, strict=True):
        assert torch.allclose(fused, peft, rtol=1e-5, atol=1e-4)
    m.enable_adapters(False)
    assert torch.equal(m(x), m.base_layer(x))  # PEFT's own forward when adapters are off


def test_review_lora_weights_partitioned_by_zero3_go_through_their_modules(tiny_model_dir):
    """DeepSpeed ZeRO-3 (configs/accelerate/deepspeed-zero3.yaml; bf16 is "auto" on a recent
    GPU) gathers a partitioned parameter only in the forward hooks of the module that holds it:
    a layer whose LoRA weights are partitioned (they carry `ds_id`) must call lora_A and lora_B,
    not read their weights, which hold nothing there."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers import AutoModelForCausalLM

    from whale.train.precision import lora_in_base_dtype

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                            task_type="CAUSAL_LM"))  # fmt: skip
    lora_in_base_dtype(model)
    m = next(m for m in model.modules() if isinstance(m, LoraLinear))
    called: list[str] = []
    for side in ("lora_A", "lora_B"):
        lin = getattr(m, side)["default"]
        lin.weight.ds_id = 0  # what deepspeed.zero marks its parameters with
        lin.register_forward_pre_hook(lambda mod, i, side=side: called.append(side))
    m(torch.randn(2, 3, m.in_features, dtype=torch.bfloat16))
    assert called == ["lora_A", "lora_B"]


def _attention_dtypes(monkeypatch, t: LoraTrainer, examples) -> dict[str, set]:
    """The query dtypes torch's SDPA got in a training step and in `loss` (eval mode)."""
    import torch

    real = torch.nn.functional.scaled_dot_product_attention
    got: list[object] = []

    def spy(q, *a, **k):
        got.append(q.dtype)
        return real(q, *a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    t.train(examples)
    trained = set(got)
    got.clear()
    t.loss(examples)
    return {"train": trained, "eval": set(got)}


def test_a_bf16_step_computes_attention_on_few_keys_in_fp32(monkeypatch, tiny_model_dir,
                                                            examples):  # fmt: skip
    """torch's CPU flash-attention backward is slower in bf16 than in fp32 on short sequences
    (whale.train.precision): a training step casts a short sequence's attention up; eval keeps
    bf16, and fp32 training is untouched."""
    import torch

    for dtype, want in (("bf16", {"train": {torch.float32}, "eval": {torch.bfloat16}}),
                        ("fp32", {"train": {torch.float32}, "eval": {torch.float32}})):  # fmt: skip
        t = trainer(tiny_model_dir, dtype)
        try:
            assert _attention_dtypes(monkeypatch, t, examples) == want, dtype
        finally:
            t.close()
            monkeypatch.undo()


def test_review_short_attention_takes_an_additive_bf16_mask():
    """A float (additive) mask in the layer's dtype, as a caller's own 4-D mask is: cast up with
    the query (SDPA refuses a bf16 mask beside an fp32 query), the result plain SDPA's."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from whale.train.precision import _attention

    layer = torch.nn.Module()
    layer.is_causal, layer.num_key_value_groups = True, 1  # type: ignore[assignment]
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.zeros(1, 1, 6, 6, dtype=torch.bfloat16)
    mask[..., :2] = torch.finfo(torch.bfloat16).min  # the first two keys hidden
    got, _ = _attention(layer.train(), q, k, v, mask, dropout=0.0, scaling=None)
    want, _ = sdpa_attention_forward(layer, q.float(), k.float(), v.float(), mask.float(),
                                     dropout=0.0, scaling=None)  # fmt: skip
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))


def test_a_bf16_step_keeps_attention_on_many_keys_in_bf16(monkeypatch, tiny_model_dir, examples):
    import torch

    from whale.train import precision

    monkeypatch.setattr(precision, "FP32_ATTENTION_BELOW", 2)  # every example is longer
    t = trainer(tiny_model_dir, "bf16")
    try:
        assert _attention_dtypes(monkeypatch, t, examples)["train"] == {torch.bfloat16}
    finally:
        t.close()


def test_a_bf16_model_pickles_and_computes_the_same_after(tiny_model_dir, examples):
    """torch.save of the whole model (or any pickling of it) must not fail on the swapped
    class; a copy computes what the original does."""
    import copy
    import pickle

    import torch

    t = trainer(tiny_model_dir, "bf16")
    try:
        ids = torch.tensor([examples[0].input_ids])
        with torch.no_grad():
            want = t.model(input_ids=ids).logits
            for other in (pickle.loads(pickle.dumps(t.model)), copy.deepcopy(t.model)):
                assert torch.equal(other(input_ids=ids).logits, want)
    finally:
        t.close()


def test_review_a_pickled_bf16_model_computes_in_a_fresh_process(tiny_model_dir, examples,
                                                                tmp_path):  # fmt: skip
    """The model's attention is "whale_sdpa", a name registered in the process that trained:
    unpickled where nothing registered it, the forward must still find it (it failed with
    KeyError: 'whale_sdpa' is not a valid attention implementation)."""
    import subprocess
    import sys

    import torch

    t = trainer(tiny_model_dir, "bf16")
    try:
        torch.save(t.model, tmp_path / "model.pt")
        ids = torch.tensor([examples[0].input_ids])
        t.model.train()  # the short-attention path (fp32) as well as eval's
        with torch.no_grad():
            want = [t.model(input_ids=ids).logits]
            t.model.eval()
            want.append(t.model(input_ids=ids).logits)
        torch.save({"ids": ids, "want": want}, tmp_path / "io.pt")
    finally:
        t.close()
    script = (
        "import sys, torch\n"
        "m = torch.load(sys.argv[1], weights_only=False)\n"
        "io = torch.load(sys.argv[2])\n"
        "got = []\n"
        "for train in (True, False):\n"
        "    m.train(train)\n"
        "    with torch.no_grad():\n"
        "        got.append(m(input_ids=io['ids']).logits)\n"
        "assert all(torch.equal(g, w) for g, w in zip(got, io['want'])), 'differs'\n"
    )
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model.pt"),
                        str(tmp_path / "io.pt")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_bf16_step_at_a_small_lr_still_moves_every_lora_factor(tiny_model_dir, examples):
    """AdamW moves a weight by about lr per step: 1e-6 is far below a bf16 weight's resolution
    (~4e-3 relative), so it moves only because the masters are fp32. One example per step: A's
    gradient is zero until a first step has moved B off its zeros."""
    import torch

    t = trainer(tiny_model_dir, "bf16", batch_size=1, lr=1e-6)
    try:
        before = [p.detach().clone() for p in t.params]
        t.train(examples)
        moved = [float((p.detach() - b).abs().max()) for p, b in zip(t.params, before, strict=True)]
    finally:
        t.close()
    assert min(moved) > 1e-7, moved
    assert {b.dtype for b in before} == {torch.float32}


def test_an_older_peft_without_lora_variant_is_changed_and_its_dora_left_alone(tiny_model_dir):
    """PEFT 0.15 (within pyproject's peft>=0.14) has no `lora_variant` attribute: its DoRA is
    the `use_dora` flag. Plain LoRA layers are still changed, DoRA ones still left to PEFT."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers import AutoModelForCausalLM

    from whale.train.precision import lora_in_base_dtype

    for dora, want in ((False, True), (True, False)):
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
        model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], use_dora=dora,
                                                task_type="CAUSAL_LM"))  # fmt: skip
        layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
        for m in layers:  # as PEFT 0.15 builds them
            del m.lora_variant
            m.use_dora = {"default": dora}
        assert lora_in_base_dtype(model) == (len(layers) if want else 0)
        assert {m.cast_input_dtype_enabled for m in layers} == {not want}


# -- bf16 against fp32 -------------------------------------------------------------------------
def _one_step(t: LoraTrainer, examples, state) -> tuple[float, object]:
    """The loss of one optimizer step over every example from LoRA weights `state`, and the
    gradient AdamW was handed (flattened)."""
    import torch

    with torch.no_grad():
        for name, p in t.model.named_parameters():
            if p.requires_grad:
                p.copy_(state[name])
    seen = []
    original = t.optimizer.step

    def capture(*a, **k):
        seen.append(torch.cat([p.grad.flatten() for p in t.params]).clone())
        return original(*a, **k)

    t.optimizer.step = capture  # type: ignore[method-assign]
    stats = t.train(examples)
    assert stats.optimizer_steps == 1
    return stats.loss, seen[0]


def test_one_step_loss_and_gradients_match_fp32(tiny_model_dir, examples):
    import torch

    ts = {d: trainer(tiny_model_dir, d) for d in ("fp32", "bf16")}
    try:
        g = torch.Generator().manual_seed(1)  # B nonzero too: both LoRA factors get gradients
        state = {n: torch.randn(p.shape, generator=g) * 0.1
                 for n, p in ts["fp32"].model.named_parameters() if p.requires_grad}  # fmt: skip
        (l32, g32), (l16, g16) = (_one_step(ts[d], examples, state) for d in ("fp32", "bf16"))
    finally:
        for t in ts.values():
            t.close()
    assert l16 == pytest.approx(l32, rel=1e-3)
    assert float((g16 - g32).norm() / g32.norm()) < 0.03
    assert float(torch.nn.functional.cosine_similarity(g16, g32, dim=0)) > 0.999


def test_loss_after_20_steps_is_near_fp32s(tiny_model_dir, examples):
    losses = {}
    for d in ("fp32", "bf16"):
        t = trainer(tiny_model_dir, d, batch_size=1)
        try:
            before = t.loss(examples)
            for _ in range(4):  # 5 examples, one per step
                stats = t.train(examples)
            assert t.optimizer_steps == 20 and stats.dtype == d
            losses[d] = (before, t.loss(examples))
        finally:
            t.close()
    assert losses["fp32"][1] < losses["fp32"][0] - 0.2  # it trained: the comparison means something
    assert abs(losses["bf16"][1] - losses["fp32"][1]) < 0.02, losses


# -- what is saved -----------------------------------------------------------------------------
def _saved(t: LoraTrainer, examples, out) -> dict:
    from safetensors.torch import load_file

    t.train(examples)
    t.save(out)
    t.close()
    return load_file(str(out / "adapter_model.safetensors"))


def test_the_saved_adapter_has_one_format_in_either_dtype(tiny_model_dir, examples, tmp_path):
    import torch

    a = _saved(trainer(tiny_model_dir, "fp32"), examples, tmp_path / "fp32")
    b = _saved(trainer(tiny_model_dir, "bf16"), examples, tmp_path / "bf16")
    assert a.keys() == b.keys() and a
    assert {k: (v.dtype, v.shape) for k, v in a.items()} == {k: (v.dtype, v.shape)
                                                             for k, v in b.items()}  # fmt: skip
    assert {v.dtype for v in b.values()} == {torch.float32}
    for d in ("fp32", "bf16"):
        state = json.loads((tmp_path / d / "trainer_state.json").read_text())
        assert state["dtype"] == d and state["sft"]["dtype"] == d


def test_a_bf16_adapter_converts_to_a_lora_gguf(tiny_model_dir, examples, tmp_path):
    from whale.train.lora_gguf import adapter_to_gguf

    _saved(trainer(tiny_model_dir, "bf16"), examples, tmp_path / "a")
    out = adapter_to_gguf(tmp_path / "a", base=tiny_model_dir)
    assert out.is_file() and out.stat().st_size > 0


def test_a_bf16_adapter_resumes_where_it_stopped(tiny_model_dir, examples, tmp_path):
    t = trainer(tiny_model_dir, "bf16", batch_size=2)
    t.train(examples)
    t.save(tmp_path / "a")
    want = t.train(examples).loss
    t.close()
    sft = SFTSettings(lr=1e-2, batch_size=2, threads=1, dtype="bf16")
    r = LoraTrainer(tiny_model_dir, LORA, sft, seed=0, adapter=tmp_path / "a")
    try:
        assert r.train(examples).loss == pytest.approx(want, rel=1e-6)
    finally:
        r.close()


# -- proposer SFT and GRPO ---------------------------------------------------------------------
def spy_lora_in_base_dtype(monkeypatch, module: str) -> list[int]:
    """Calls through to `lora_in_base_dtype` as `module` imported it; the list gets the number
    of LoRA layers each call changed."""
    import importlib

    from whale.train.precision import lora_in_base_dtype

    calls: list[int] = []
    def spy(model: object) -> int:
        calls.append(lora_in_base_dtype(model))
        return calls[-1]

    monkeypatch.setattr(importlib.import_module(module), "lora_in_base_dtype", spy)
    return calls


def test_proposer_sft_records_its_dtype_and_saves_one_format(tiny_model_dir, tmp_path,
                                                              monkeypatch):
    from safetensors.torch import load_file

    from whale.train.proposer.sft import train_sft

    changed = spy_lora_in_base_dtype(monkeypatch, "whale.train.proposer.sft")
    got = {}
    for d in ("fp32", "bf16"):
        s = sft_settings(dtype=d, max_len=256)
        adapter = train_sft(dataset(4, 2), tiny_model_dir, s, 1.0, tmp_path / d, say=quiet)
        got[d] = {k: (v.dtype, v.shape) for k, v in
                  load_file(str(adapter / "adapter_model.safetensors")).items()}  # fmt: skip
        assert json.loads((tmp_path / d / "train.json").read_text())["dtype"] == d
    assert got["fp32"] == got["bf16"] and got["fp32"]
    assert len(changed) == 1 and changed[0] > 0  # bf16 only: its LoRA path computes in bf16


def test_proposer_sft_fingerprint_keys_the_dtype_trained_in(tiny_model_dir):
    from whale.train.proposer.sft import _run_fingerprint

    data = dataset(4, 2)

    def fp(d: str) -> str:
        return _run_fingerprint(tiny_model_dir, sft_settings(dtype=d), data, None, 1.0, [])

    assert fp("bf16") != fp("fp32")
    assert fp("auto") == fp(resolve("auto"))  # what counts is what "auto" trains in here


def test_grpo_records_its_dtype_and_saves_one_format(tiny_model_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from whale.train.proposer.grpo import RUN_FILE, train_grpo

    changed = spy_lora_in_base_dtype(monkeypatch, "whale.train.proposer.grpo")
    got = {}
    for d in ("fp32", "bf16"):
        adapter, _ = train_grpo(PROMPTS, LetterReward(), tiny_model_dir,
                                grpo_settings(dtype=d), tmp_path / d, say=quiet)  # fmt: skip
        got[d] = {k: (v.dtype, v.shape) for k, v in
                  load_file(str(adapter / "adapter_model.safetensors")).items()}  # fmt: skip
        assert json.loads((tmp_path / d / RUN_FILE).read_text())["dtype"] == d
    assert got["fp32"] == got["bf16"] and got["fp32"]
    assert len(changed) == 1 and changed[0] > 0


def test_grpo_refuses_to_resume_a_run_in_the_other_dtype(tmp_path):
    from whale.train.proposer.grpo import RUN_FILE, _check_run

    old = {"settings": {"g": 4}, "checkpoint": "c", "init_adapter": None, "prompts": "p"}
    (tmp_path / RUN_FILE).write_text(json.dumps(old))  # made before the setting: fp32
    _check_run(tmp_path, old | {"dtype": "fp32"})
    with pytest.raises(ValueError, match="dtype"):
        _check_run(tmp_path, old | {"dtype": "bf16"})


# -- the setting -------------------------------------------------------------------------------
@pytest.mark.parametrize(("config", "key"), [("cotrain", "rsft.sft.dtype"),
                                             ("proposer", "sft.dtype"),
                                             ("proposer", "grpo.dtype")])  # fmt: skip
def test_a_bad_dtype_is_a_config_error_naming_its_key(config, key):
    from whale.schedule.cotrain import CotrainConfig
    from whale.train.proposer.run import ProposerTrainConfig

    cls = CotrainConfig if config == "cotrain" else ProposerTrainConfig
    assert load(cls, overrides=[f"{key}=fp32"]) is not None
    with pytest.raises(ConfigError) as e:
        load(cls, overrides=[f"{key}=fp16"])
    assert e.value.field == key and "'fp16' is not one of 'auto', 'bf16', 'fp32'" in str(e.value)


def test_a_bad_dtype_built_in_python_is_refused():
    with pytest.raises(ConfigError, match="dtype"):
        SFTSettings(dtype="half").validate()  # type: ignore[arg-type]


def test_review26_a_weight_step_resumed_from_an_fp32_adapter_stays_fp32(tiny_model_dir, examples,
                                                                         tmp_path, monkeypatch):
    """A cotrain run made before the setting existed trained its adapters in fp32; resumed on a
    machine with bf16 units, "auto" (the config.toml it saved has no dtype: the default) went
    on in bf16 from the fp32 adapter, silently: GRPO and proposer SFT refuse or retrain such a
    resume, the weight phase's LoraTrainer did not look."""
    import whale.train.precision as precision

    t = trainer(tiny_model_dir, "fp32", batch_size=2)
    t.train(examples)
    t.save(tmp_path / "a")
    t.close()
    state = json.loads((tmp_path / "a" / "trainer_state.json").read_text())
    del state["dtype"]  # saved before the setting existed
    state["sft"].pop("dtype")
    (tmp_path / "a" / "trainer_state.json").write_text(json.dumps(state))
    monkeypatch.setattr(precision, "probe", lambda *a: Hardware(cpu_flags(EPYC)))
    sft = SFTSettings(lr=1e-2, batch_size=2, threads=1)  # dtype "auto": bf16 on this hardware
    r = LoraTrainer(tiny_model_dir, LORA, sft, seed=0, adapter=tmp_path / "a")
    try:
        assert r.dtype == "fp32"
    finally:
        r.close()
    r = LoraTrainer(tiny_model_dir, LORA, SFTSettings(lr=1e-2, batch_size=2, threads=1,
                                                      dtype="bf16"), seed=0,
                    adapter=tmp_path / "a")  # fmt: skip
    try:
        assert r.dtype == "bf16"  # named: obeyed (logged)
    finally:
        r.close()


def test_short_attention_reports_a_switch_transformers_did_not_make():
    """transformers may leave the attention as it was without raising (a model class that
    does not take a registered function); the switch then says False, as the model does."""
    from types import SimpleNamespace

    from whale.train.precision import short_attention_in_fp32

    class Refuses:
        config = SimpleNamespace(_attn_implementation="sdpa")

        def set_attn_implementation(self, name: str) -> None:
            pass  # unchanged, no error

    class Raises(Refuses):
        def set_attn_implementation(self, name: str) -> None:
            raise ValueError(f"{name} is not supported by this model")

    assert short_attention_in_fp32(Refuses()) is False
    assert short_attention_in_fp32(Raises()) is False


def test_short_attention_switches_an_sdpa_model_and_says_so(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from whale.train.precision import ATTENTION, short_attention_in_fp32

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")  # fmt: skip
    assert short_attention_in_fp32(model) is True
    assert model.config._attn_implementation == ATTENTION
