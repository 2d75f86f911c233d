"""The weight step under `accelerate launch`: 2 CPU processes train the adapter 1 process trains
(weights and AdamW moments), the weight phase runs its step that way and serves the result, and
a failed or overlong launch is a clear error that leaves no process behind.

Why `--multi_gpu` for CPU processes: accelerate 1.15's `--cpu` starts one process whatever
`--num_processes` says (see whale/train/launch.py); every launched test checks the world size
the ranks saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from whale.train.data import IGNORE, Example, end_of_turn_id, template_ids
from whale.train.launch import (
    LaunchError,
    launch_command,
    read_examples,
    run_launch,
    write_examples,
    write_settings,
)
from whale.train.sft import LoraSettings, LoraTrainer, SFTSettings

ROOT = Path(__file__).resolve().parents[2]
CPU_2PROC = ROOT / "configs" / "accelerate" / "cpu-2proc.yaml"
LORA = LoraSettings(r=4, alpha=8)
PAIRS = [
    ("What is the sum of two and three?", "It is five."),
    ("What is seven times eight?", "It is fifty six."),
    ("Which planet is largest?", "Answer: 42"),
    ("How many legs has a spider?", "The answer is 17."),
    ("Who wrote the letter?", "a clever girl who found that one coin was missing."),
]


@pytest.fixture(scope="module")
def examples(tiny_model_dir) -> list[Example]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = []
    for i, (q, a) in enumerate(PAIRS):
        p = template_ids(tok, [{"role": "user", "content": q}])
        c = tok(a, add_special_tokens=False)["input_ids"] + [end_of_turn_id(tok)]
        out.append(Example(p + c, [IGNORE] * len(p) + c, f"q{i}#0"))
    return out


def _left(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `marker`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def _none_left(marker: str, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while _left(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tensors(folder: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(folder / "adapter_model.safetensors"))
    opt = torch.load(folder / "optimizer.pt", weights_only=True)["optimizer"]["state"]
    moments = {f"{i}.{k}": v for i, s in opt.items() for k, v in s.items() if k != "step"}
    return weights | moments


def test_examples_round_trip_and_bad_lines_are_refused(tmp_path, examples):
    write_examples(tmp_path / "ex.jsonl", examples)
    assert read_examples(tmp_path / "ex.jsonl") == examples
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1, "2"], "labels": [1, 2], "source": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: input_ids and labels must be lists"):
        read_examples(tmp_path / "bad.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("batch_size, micro_batch, steps", [(2, 1, 3), (5, 2, 1)])
def test_two_processes_train_the_adapter_one_process_trains(tmp_path, tiny_model_dir, examples,
                                                            batch_size, micro_batch, steps):
    """5 examples, 2 per step: steps of 2, 2 and 1 (rank 1 has nothing in the last one and
    joins its all-reduce with a zero gradient); or one step of 5 in padded micro batches of 2
    (a rank's first micro batch under no_sync). Same weights and same AdamW moments (the
    moments are scale-sensitive, so a loss normalized by the wrong count shows there even
    where Adam's normalized update hides it)."""
    sft = SFTSettings(lr=1e-3, batch_size=batch_size, micro_batch=micro_batch,
                      max_grad_norm=1.0, threads=1)
    ref = LoraTrainer(tiny_model_dir, LORA, sft, seed=3)
    try:
        want = ref.train(examples)
        ref.save(tmp_path / "one")
    finally:
        ref.close()
    write_examples(tmp_path / "ex.jsonl", examples)
    write_settings(tmp_path / "settings.json", LORA, sft, 3)
    args = ["--base", str(tiny_model_dir), "--examples", str(tmp_path / "ex.jsonl"),
            "--settings", str(tmp_path / "settings.json"), "--out", str(tmp_path / "two"),
            "--stats", str(tmp_path / "stats.json")]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           "-m", "whale.train.launch", *args]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["world_size"] == 2 and stats["distributed_type"] == "MULTI_CPU"
    assert stats["optimizer_steps"] == want.optimizer_steps == steps
    assert stats["tokens"] == want.tokens and stats["loss"] == pytest.approx(want.loss, rel=1e-6)
    one, two = _tensors(tmp_path / "one"), _tensors(tmp_path / "two")
    assert one.keys() == two.keys() and len(one) > 0
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    moved = max(float(one[k].abs().max()) for k in one if "lora_B" in k)  # B starts at 0
    assert diff <= 1e-5 < moved / 10, (diff, moved)
    state = json.loads((tmp_path / "two" / "trainer_state.json").read_text())
    assert state["passes"] == 1 and state["optimizer_steps"] == steps and state["optimizer"]


@pytest.mark.slow
def test_the_weight_phase_trains_under_accelerate_and_serves_the_adapter(tmp_path, tiny_model_dir):
    """launcher = accelerate: two weight steps, each a 2-process launch (the second resumes
    from the first's adapter, AdamW state included); the next rollouts use each new adapter."""
    from transformers import AutoTokenizer

    from tests.test_schedule import SEED, EvenTask, settings
    from whale.harness import RuntimeConfig
    from whale.models import Sampling
    from whale.models.hf import TransformersChat
    from whale.runs import OutcomeStore
    from whale.train.rsft import Solver, WeightPhase, trainer_factory
    from whale.train.serving import InProcessServing

    tiny = tiny_model_dir
    rs = settings()
    rs.sft.launcher, rs.sft.accelerate_config = "accelerate", str(CPU_2PROC)
    rs.validate()
    task = EvenTask()
    store = OutcomeStore(tmp_path / "run", "fp-test")
    serving = InProcessServing(tiny, alias="tiny", threads=1)
    solver = Solver(serving, "fp-test", RuntimeConfig(sandbox="auto", warm=0))
    wp = WeightPhase(tmp_path / "run" / "weight", task, task.questions()[:8], store, solver, rs,
                     trainer_factory(tiny, rs, 0), lambda: AutoTokenizer.from_pretrained(tiny),
                     seed=0, workers=2)
    tags = {"schedule": "weight-only", "cycle": 1, "phase": "weight", "kind": "weight_sample",
            "step": 0, "adapter": None}
    try:
        rec = wp.step(SEED, 0, 0, None, tags)
        assert rec.trained and rec.examples == rec.accepted >= 1, rec
        launched = tmp_path / "run" / "weight" / "launch" / "step_0000"
        stats = json.loads((launched / "stats.json").read_text())
        assert stats["world_size"] == 2 and stats["tokens"] == rec.tokens > 0
        assert len(read_examples(launched / "examples.jsonl")) == rec.examples
        assert solver.adapter == Path(rec.adapter_path) and solver.adapter.is_dir()
        assert rec.adapter == solver.digest is not None
        msgs = [{"role": "user", "content": "Say a word about number 3."}]
        sampling = Sampling(max_tokens=12, temperature=1.0, seed=5)
        base = TransformersChat(tiny, threads=1).chat(msgs, sampling)
        assert solver.model().chat(msgs, sampling).token_ids != base.token_ids  # served: new
        rec2 = wp.step(SEED, 1, rec.consumed, None, {**tags, "step": 1, "adapter": rec.adapter})
        assert rec2.adapter_before == rec.adapter
        if rec2.trained:
            state = json.loads((Path(rec2.adapter_path) / "trainer_state.json").read_text())
            assert state["passes"] == 2 and state["optimizer"]  # resumed, not restarted
            assert rec2.adapter == solver.digest != rec.adapter
    finally:
        wp.close()
        store.close()
        serving.close()


@pytest.mark.slow
def test_a_failed_launch_is_a_clear_error_and_leaves_no_process(tmp_path, tiny_model_dir,
                                                                examples):
    from whale.train.launch import AccelerateTrainer

    def trainer(config: str, **kw) -> AccelerateTrainer:
        sft = SFTSettings(threads=1, launcher="accelerate", accelerate_config=config, **kw)
        return AccelerateTrainer(tiny_model_dir, LORA, sft, seed=0)

    # A missing config is refused when the settings are checked (the config load), before
    # the weight phase pays for any rollout.
    with pytest.raises(ValueError, match="no/such.yaml' is not a file"):
        SFTSettings(launcher="accelerate", accelerate_config=str(tmp_path / "no" / "such.yaml"),
                    threads=1).validate()  # fmt: skip
    bad = tmp_path / "bad.yaml"
    bad.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NOPE\n")
    with pytest.raises(LaunchError, match=r"failed \(exit 1\); log: .*b/launch.log") as e:
        trainer(str(bad)).train(examples, tmp_path / "b")
    assert "NOPE" in str(e.value) and (tmp_path / "b" / "launch.log").is_file()
    assert _none_left(str(tmp_path / "b"))
    # Killed half way (the launcher and its ranks start and import torch; a whole step took
    # under 6 s on a quiet machine, so 2 s): the whole process group goes.
    # the error says it: killed at its 2 s limit, not left to run (no wall-clock bound)
    with pytest.raises(LaunchError, match="ran past 2.0 s and was killed"):
        trainer(str(CPU_2PROC), launch_timeout_s=2.0).train(examples, tmp_path / "c")
    assert _none_left(str(tmp_path / "c")), _left(str(tmp_path / "c"))
    with pytest.raises(ValueError, match="launcher 'accelerate' needs accelerate_config"):
        SFTSettings(launcher="accelerate").validate()


def test_a_ctrl_c_kills_the_launch_group(tmp_path):
    """KeyboardInterrupt while waiting: the subprocess (its own session) is killed with its
    children. The stand-in launcher forks one child in its group and one in a session of its
    own, as torchrun starts its ranks (out of reach of a kill of the launcher's group)."""
    import signal
    import threading

    marker = str(tmp_path / "sleeper")
    script = ("import os, time\n"
              "if os.fork() == 0 and os.fork() == 0:\n    os.setsid()\n"
              f"time.sleep(60)  # {marker}")
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(1.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run_launch([sys.executable, "-c", script], tmp_path / "log")
    timer.join()
    assert time.monotonic() - t0 < 40  # interrupted, not waited out (the launcher sleeps 60 s)
    assert _none_left(marker), _left(marker)


def test_the_launch_command_names_config_port_and_processes():
    cmd = launch_command("/c.yaml", ["--out", "x"], num_processes=4, port=12345)
    assert cmd[1:] == ["-m", "accelerate.commands.launch", "--config_file", "/c.yaml",
                       "--num_processes", "4", "--main_process_port", "12345",
                       "-m", "whale.train.launch", "--out", "x"]
