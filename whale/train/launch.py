"""One weight step of LoRA SFT under `accelerate launch`, with any number of processes.

    accelerate launch --config_file configs/accelerate/ddp.yaml -m whale.train.launch \\
        --base CHECKPOINT --examples examples.jsonl --settings settings.json --out ADAPTER \\
        [--adapter PREVIOUS_ADAPTER] [--stats stats.json]

trains the adapter (`--adapter`, or a fresh one) on the examples (JSONL of `whale.train.data.
Example`: input_ids, labels, source) for one pass, as `whale.train.sft.LoraTrainer.train` does,
and saves it where `LoraTrainer.save` would (weights, AdamW state, pass count: the next step,
in-process or launched, resumes from it). `settings.json` holds `{"lora": {...}, "sft": {...},
"seed": N}`.

Why the update does not depend on the number of processes N: every rank shuffles the whole
pass the same way (seed and pass number) and cuts the same optimizer steps; rank r trains on
`step[r::N]`, the step's trained-token count T is all-reduced (`accelerator.reduce`), each rank
backpropagates `N * sum(NLL of its shard) / T`, and DDP averages gradients over the N ranks, so
the gradient is sum(NLL of the step) / T: the token mean over the whole step, the one-process
loss. A rank whose shard of a short last step is empty backpropagates 0 x the NLL of one
example, so every rank joins each all-reduce. Micro batches before a rank's last are
backpropagated under `no_sync` (one all-reduce per optimizer step). Rank 0 saves.
Measured by tests/train/test_launch.py: 2 CPU processes give the one-process adapter to 1e-5.

Without a distributed launch on a CPU-only machine this runs `LoraTrainer` itself. On CPU,
accelerate 1.15's `--cpu` (or `use_cpu: true`) starts ONE process whatever --num_processes says
(its simple launcher; several need mpirun): multi-process CPU runs are started as multi_gpu
(torchrun) and this script asks accelerate for the CPU when CUDA is absent
(configs/accelerate/cpu-2proc.yaml).

`AccelerateTrainer` is the weight phase's side (`sft.launcher = "accelerate"`): it writes the
step's examples and settings to a folder, runs the launch as a subprocess in its own session
(killed with its whole process group on an error, a timeout or Ctrl-C; a failure names the
log), and hands back the saved adapter.

Not covered (not run here: no GPU, DeepSpeed not installed): DeepSpeed and FSDP. Written for
them: under DeepSpeed the micro batches of a rank's step are summed into one backward (the
engine steps on every backward), gradient clipping is DeepSpeed's (`gradient_clipping`, set to
sft.max_grad_norm when "auto"), and under DeepSpeed or FSDP the optimizer state is sharded, so
the saved adapter holds the weights (gathered with `accelerator.get_state_dict`) and no AdamW
state: a step resumed from it starts AdamW afresh (logged). FSDP means FSDP2 (`fsdp_version:
2`): FSDP1 swaps submodules for wrappers, and the loss calls the decoder and LM head held
from before the wrap. With dropout > 0 the N ranks draw
their dropout masks from one seed, so the update differs from one process's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from whale import procfs
from whale.errors import WhaleError
from whale.records import record_dir, replace_dir
from whale.train.data import Example
from whale.train.sft import (
    LoraSettings,
    LoraTrainer,
    SFTSettings,
    StepStats,
    trained_positions,
    usable_examples,
)

EXAMPLES_FILE = "examples.jsonl"
SETTINGS_FILE = "settings.json"
STATS_FILE = "stats.json"
LOG_FILE = "launch.log"
KILL_GRACE_S = 5.0


class LaunchError(WhaleError, RuntimeError):
    """A launched training step failed (or could not start); the message names its log."""


# --- files between the weight phase and the launched processes ---------------------------


def write_examples(path: Path, examples: Sequence[Example]) -> None:
    with open(path, "w") as f:
        for e in examples:
            f.write(json.dumps({"input_ids": e.input_ids, "labels": e.labels,
                                "source": e.source}) + "\n")  # fmt: skip


def read_examples(path: Path) -> list[Example]:
    """Examples of a JSONL file, each checked (lists of ints, a string source): a bad line is a
    ValueError naming it."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ids, labels, source = row["input_ids"], row["labels"], row["source"]
                ok = (isinstance(ids, list) and isinstance(labels, list)
                      and isinstance(source, str)
                      and all(type(x) is int for x in ids)
                      and all(type(x) is int for x in labels))  # fmt: skip
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not an example ({type(e).__name__}: {e})") from None
            if not ok:
                raise ValueError(f"{path}:{n}: input_ids and labels must be lists of ints")
            out.append(Example(input_ids=ids, labels=labels, source=source))
    return out


def write_settings(path: Path, lora: LoraSettings, sft: SFTSettings, seed: int) -> None:
    path.write_text(json.dumps({"lora": asdict(lora), "sft": asdict(sft), "seed": seed}))


def read_settings(path: Path) -> tuple[LoraSettings, SFTSettings, int]:
    raw = json.loads(Path(path).read_text())
    lora_keys = {f.name for f in fields(LoraSettings)}
    sft_keys = {f.name for f in fields(SFTSettings)}
    lora = dict(raw["lora"])
    bad = (set(lora) - lora_keys) | (set(raw["sft"]) - sft_keys)
    if bad:
        raise ValueError(f"{path}: unknown settings {sorted(bad)}")
    lora["targets"] = tuple(lora.get("targets", LoraSettings().targets))
    return LoraSettings(**lora), SFTSettings(**raw["sft"]), int(raw["seed"])


# --- the trainer under accelerate ---------------------------------------------------------


def _nll_module(trainer: LoraTrainer) -> Any:
    """An nn.Module whose forward is the trainer's loss, so that the forward goes through the
    DDP / FSDP / DeepSpeed wrapper (its hooks) even where the loss calls the decoder and the
    LM head apart (the fast head)."""
    import torch

    class NllSum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = trainer.model  # registers the PEFT model's parameters
            self._owner = [trainer]  # not a submodule

        def forward(self, ids: Any, labels: Any, attention: Any = None) -> Any:
            return LoraTrainer._nll_of(self._owner[0], ids, labels, attention)

    return NllSum()


class DistributedLoraTrainer(LoraTrainer):
    """`LoraTrainer` on the processes of an `accelerate.Accelerator`: the model and optimizer
    are prepared by accelerate (moved to its device, wrapped for DDP / FSDP / DeepSpeed), each
    rank trains on its shard of every step (see the module docstring), rank 0 saves."""

    def __init__(self, accelerator: Any, base_dir: Path, lora: LoraSettings, sft: SFTSettings,
                 seed: int, adapter: Path | None = None) -> None:  # fmt: skip
        from accelerate.utils import DistributedType

        on_cuda = accelerator.device.type == "cuda"  # where "auto" looks for bf16 units
        super().__init__(base_dir, lora, sft, seed, adapter=adapter,
                         device="cuda" if on_cuda else "cpu")  # fmt: skip
        self.accelerator = acc = accelerator
        self._deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        self._sharded = self._deepspeed or acc.distributed_type == DistributedType.FSDP
        if self._deepspeed:
            ds = acc.state.deepspeed_plugin.deepspeed_config
            ds["gradient_accumulation_steps"] = 1  # one backward per optimizer step here
            if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
                ds["train_micro_batch_size_per_gpu"] = 1  # no dataloader: for its logs only
            if ds.get("train_batch_size", "auto") == "auto":
                ds["train_batch_size"] = acc.num_processes
            if ds.get("gradient_clipping", "auto") == "auto":
                ds["gradient_clipping"] = sft.max_grad_norm
        self._wrapped, self.optimizer = acc.prepare(_nll_module(self), self.optimizer)

    def _nll_sum(self, batch: Sequence[Example]) -> Any:
        ids, labels, attention = self._tensors(batch)
        dev = self.accelerator.device
        return self._wrapped(ids.to(dev), labels.to(dev),
                             None if attention is None else attention.to(dev))  # fmt: skip

    def train(self, examples: Sequence[Example]) -> StepStats:
        """`LoraTrainer.train` over all ranks: the same pass, the same steps, the same update."""
        import torch

        acc = self.accelerator
        usable = self._usable(examples)
        t0 = time.monotonic()
        order = list(range(len(usable)))
        random.Random(f"{self.seed}/{self.passes}").shuffle(order)
        self._wrapped.train()
        rank, world = acc.process_index, acc.num_processes
        local_nll, total_tokens, steps = 0.0, 0, 0
        bs = self.sft.batch_size
        for start in range(0, len(order), bs):
            step = [usable[i] for i in order[start : start + bs]]
            shard = step[rank::world]
            mine = sum(trained_positions(e) for e in shard)
            tokens = int(acc.reduce(torch.tensor(mine, device=acc.device), reduction="sum"))
            if tokens != sum(trained_positions(e) for e in step):
                raise RuntimeError("the ranks disagree on the step's examples")
            weight = world / tokens if shard else 0.0
            batches = self._micro_batches(shard) if shard else [step[:1]]
            self.optimizer.zero_grad(set_to_none=True)
            if self._deepspeed:
                nlls = [self._nll_sum(mb) for mb in batches]
                acc.backward(torch.stack(nlls).sum() * weight)
                local_nll += sum(float(x.detach()) for x in nlls) if shard else 0.0
            else:
                for j, mb in enumerate(batches):
                    last = j == len(batches) - 1
                    with contextlib.nullcontext() if last else acc.no_sync(self._wrapped):
                        nll = self._nll_sum(mb)
                        acc.backward(nll * weight)
                    local_nll += float(nll.detach()) if shard else 0.0
                if self.sft.max_grad_norm > 0:
                    acc.clip_grad_norm_(list(self._wrapped.parameters()), self.sft.max_grad_norm)
            self.optimizer.step()
            total_tokens += tokens
            steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        total_nll = float(acc.reduce(torch.tensor(local_nll, dtype=torch.float64,
                                                  device=acc.device), reduction="sum"))  # fmt: skip
        self.passes += 1
        self.optimizer_steps += steps
        wall = time.monotonic() - t0
        return StepStats(examples=len(usable), tokens=total_tokens, loss=total_nll / total_tokens,
                         optimizer_steps=steps, wall_s=wall,
                         tokens_per_s=total_tokens / wall if wall > 0 else 0.0,
                         dtype=self.dtype)  # fmt: skip

    def save(self, out: Path) -> Path:
        """Rank 0 writes what `LoraTrainer.save` writes; every rank returns after it has. Under
        DeepSpeed / FSDP the weights are gathered (a collective) and no AdamW state is saved."""
        acc = self.accelerator
        acc.wait_for_everyone()
        weights: dict[str, Any] | None = None
        optimizer: dict[str, Any] | None = None
        if self._sharded:
            full = acc.get_state_dict(self._wrapped)  # every rank takes part
            weights = {k.removeprefix("model."): v for k, v in (full or {}).items()}
            optimizer = {}
        if acc.is_main_process:
            self._save(Path(out), weights, optimizer)
        acc.wait_for_everyone()
        return Path(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m whale.train.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--base", required=True, type=Path, help="transformers checkpoint folder")
    p.add_argument("--examples", required=True, type=Path, help="JSONL of examples")
    p.add_argument("--settings", required=True, type=Path, help="JSON: lora, sft, seed")
    p.add_argument("--out", required=True, type=Path, help="where the new adapter is saved")
    p.add_argument("--adapter", type=Path, default=None, help="adapter to resume from")
    p.add_argument("--stats", type=Path, default=None, help="JSON of the step's stats (rank 0)")
    args = p.parse_args(argv)
    lora, sft, seed = read_settings(args.settings)
    examples = read_examples(args.examples)

    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    acc = Accelerator(cpu=not torch.cuda.is_available())
    trainer: LoraTrainer
    if acc.distributed_type == DistributedType.NO and acc.device.type == "cpu":
        trainer = LoraTrainer(args.base, lora, sft, seed, adapter=args.adapter)
    else:
        trainer = DistributedLoraTrainer(acc, args.base, lora, sft, seed, adapter=args.adapter)
    try:
        stats = trainer.train(examples)
        trainer.save(args.out)
    finally:
        trainer.close()
    if acc.is_main_process and args.stats is not None:
        row = asdict(stats) | {"world_size": acc.num_processes,
                               "distributed_type": str(acc.distributed_type).split(".")[-1]}
        tmp = args.stats.with_name(args.stats.name + ".tmp")
        tmp.write_text(json.dumps(row, indent=1))
        os.replace(tmp, args.stats)
    acc.wait_for_everyone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


# --- the weight phase's side: a launched step as a subprocess ------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the launch and everything it started: SIGTERM its process group and every
    descendant (torchrun starts each rank in a session of its own: the group alone misses
    them), then after up to KILL_GRACE_S SIGKILL whatever of them is left; reap the launcher."""
    tree = procfs.descendants(proc.pid) if proc.poll() is None else {}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_GRACE_S)
    while tree and time.monotonic() < deadline:
        alive = procfs.processes()
        tree = {p: t for p, t in tree.items() if p in alive and alive[p][1] == t}
        if tree:
            time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    alive = procfs.processes()
    for pid, t in tree.items():
        if pid in alive and alive[pid][1] == t:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_GRACE_S)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def launch_command(config: str | Path, script_args: Sequence[str],
                   num_processes: int = 0, port: int | None = None) -> list[str]:  # fmt: skip
    """`python -m accelerate.commands.launch --config_file CONFIG [--num_processes N]
    --main_process_port PORT -m whale.train.launch ARGS` (a free port: runs on one machine at
    once must not collide on accelerate's default 29500)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    if num_processes:
        cmd += ["--num_processes", str(num_processes)]
    cmd += ["--main_process_port", str(port or _free_port()), "-m", "whale.train.launch"]
    return cmd + list(script_args)


def run_launch(cmd: Sequence[str], log: Path, timeout_s: float | None = None,
               threads: int = 1) -> None:  # fmt: skip
    """Run a launch command in a session of its own with its output in `log`; on return or on
    any exception (Ctrl-C included) no process of it is left. A non-zero exit or a timeout is
    a LaunchError naming the log."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=env)  # fmt: skip
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"accelerate launch ran past {timeout_s} s and was killed; "
                              f"log: {log}") from None  # fmt: skip
        finally:
            _kill_group(proc)  # also what outlived a finished launcher
    if rc != 0:
        raise LaunchError(f"accelerate launch failed (exit {rc}); log: {log}\n{_tail(log)}")


class AccelerateTrainer:
    """The weight phase's trainer when `sft.launcher = "accelerate"`: `train` runs one launched
    step (`accelerate launch --config_file sft.accelerate_config -m whale.train.launch`) in
    `workdir` (examples, settings, log, stats and the new adapter), `save` moves that adapter
    to its place; the next `train` resumes from it. The examples are checked here first, so an
    empty set is the same `EmptyTrainingSet` the in-process trainer raises, before a launch."""

    def __init__(self, base_dir: Path, lora: LoraSettings, sft: SFTSettings, seed: int,
                 adapter: Path | None = None) -> None:  # fmt: skip
        lora.validate()
        sft.validate()
        if not sft.accelerate_config:
            raise ValueError("sft.accelerate_config: the accelerate config path is required")
        self.base_dir, self.lora, self.sft, self.seed = Path(base_dir), lora, sft, seed
        self.adapter = Path(adapter) if adapter is not None else None
        self._staged: Path | None = None
        self._tmp: Path | None = None

    def train(self, examples: Sequence[Example], workdir: Path | None = None) -> StepStats:
        usable_examples(examples, self.sft.max_len)
        config = Path(self.sft.accelerate_config or "").expanduser()
        if not config.is_file():
            raise LaunchError(f"sft.accelerate_config {str(config)!r} is not a file")
        if workdir is None:
            self._tmp = workdir = Path(tempfile.mkdtemp(prefix="whale-launch-"))
        else:  # in the run directory: never through (or the removal of) a linked folder
            workdir = Path(workdir)
            record_dir(workdir.parent)
            record_dir(workdir)
        shutil.rmtree(workdir, ignore_errors=True)  # a replayed step starts clean
        workdir.mkdir(parents=True)
        write_examples(workdir / EXAMPLES_FILE, examples)
        write_settings(workdir / SETTINGS_FILE, self.lora, self.sft, self.seed)
        staged = workdir / "adapter"
        args = ["--base", str(self.base_dir), "--examples", str(workdir / EXAMPLES_FILE),
                "--settings", str(workdir / SETTINGS_FILE), "--out", str(staged),
                "--stats", str(workdir / STATS_FILE)]  # fmt: skip
        if self.adapter is not None:
            args += ["--adapter", str(self.adapter)]
        cmd = launch_command(config.resolve(), args, self.sft.num_processes)
        (workdir / "command.json").write_text(json.dumps(cmd))
        run_launch(cmd, workdir / LOG_FILE, self.sft.launch_timeout_s, self.sft.threads)
        try:
            row = json.loads((workdir / STATS_FILE).read_text())
            stats = StepStats(**{f.name: row[f.name] for f in fields(StepStats)})
        except (OSError, ValueError, KeyError) as e:
            raise LaunchError(f"the launch wrote no stats ({e}); log: {workdir / LOG_FILE}") from e
        if not staged.is_dir():
            raise LaunchError(f"the launch saved no adapter; log: {workdir / LOG_FILE}")
        self._staged = staged
        return stats

    def save(self, out: Path) -> Path:
        """Move the adapter of the last `train` to `out` (as `LoraTrainer.save`: the old `out`
        is replaced, never half-written)."""
        if self._staged is None:
            raise RuntimeError("nothing trained since the last save")
        out = Path(out)
        record_dir(out.parent)  # never through a link (whale.records)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.move(self._staged, tmp)
        replace_dir(tmp, out)
        self._staged, self.adapter = None, out
        self.close()
        return out

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


if __name__ == "__main__":
    sys.exit(main())
