"""The Ray executor on a local 2-CPU cluster (one per module: ray.init costs seconds): same
outcomes as the local pool, a killed actor loses and double-pays nothing, Ctrl-C stops it.
Real jailed runs of real harnesses; the model is tests/servers.py's StubServer."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import ScriptedModel
from tests.servers import StubServer
from whale.evaluation import evaluate
from whale.harness import Runtime, Sandbox, load_harness
from whale.harness.executor import ExecutorUnavailable
from whale.models import CachedModel, OpenAICompatible
from whale.tasks import load_task

try:
    import ray
except ImportError:  # `make install` installs whale[ray]: a missing Ray is a failure, not a skip
    if os.environ.get("WHALE_SKIP_RAY_TESTS") != "1":
        raise ImportError("ray is not installed: run `make install` (whale[ray])") from None
    pytest.skip("ray not installed and WHALE_SKIP_RAY_TESTS=1", allow_module_level=True)

from whale.harness.ray_executor import RayExecutor, describe_model  # noqa: E402

pytestmark = pytest.mark.slow

# Question-dependent results of every kind: a harness fault (status error), its own right
# answer, and the model's reply (wrong for most questions).
MIXED = '''
def run(question, env):
    reply = env.llm([{"role": "user", "content": question}])
    expr = question[len("Calculate "):].rstrip(".")
    if len(question) % 3 == 0:
        raise ValueError("harness fault on " + expr)
    if len(question) % 3 == 1:
        return str(round(eval(expr)))
    return reply.text.split(":")[-1].strip()
'''


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_dead(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


DRIVER = """
import sys, threading, time
from tests.servers import StubServer
from whale.evaluation import evaluate
from whale.harness import Runtime, load_harness
from whale.harness.ray_executor import RayExecutor
from whale.models import OpenAICompatible
from whale.tasks import load_task
task = load_task("rg:basic_arithmetic", size=6, seed=0)
with StubServer([("sleep", 60, "Answer: 1")]) as s:
    ex = RayExecutor(actors=1, per_actor=1, num_cpus=1)
    rt = Runtime(model=OpenAICompatible("stub", s.base_url, timeout_s=90), executor=ex)
    def say():
        while not s.requests:
            time.sleep(0.05)
        print("RUNNING", flush=True)
    threading.Thread(target=say, daemon=True).start()
    evaluate(rt, load_harness("single_call"), task, task.questions(), 2)
"""


def test_a_sigkilled_driver_leaves_no_process_of_its_local_cluster():
    # Its own cluster (first in the module: before the module's cluster starts): gcs, raylet,
    # agents, the actor, its jail.
    import subprocess
    import sys

    from tests.test_interrupt import descendants, left_alive

    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "RUNNING\n"
        procs = descendants(p.pid)
        names = b" ".join(cmd for _, cmd in procs.values())
        jail = Sandbox().resolved().encode()  # the jail of the actor's run
        assert b"raylet" in names and b"ray::DashboardAgent" in names and jail in names
        p.kill()
        p.wait()
        assert left_alive(procs, within_s=5) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_ray_gives_the_outcomes_of_the_local_pool(cluster):
    task = load_task("rg:basic_arithmetic", size=10, seed=3)
    qs = task.questions()
    with StubServer([("ok", "Answer: 7")]) as s:
        model = OpenAICompatible("stub", s.base_url)
        local = evaluate(Runtime(model=model), MIXED, task, qs, 2)
        ex = RayExecutor(actors=2, per_actor=2)
        rt = Runtime(model=model, executor=ex)
        try:
            remote = evaluate(rt, MIXED, task, qs, 2)
        finally:
            pids = ex.actor_pids()
            rt.close()
    got = [(o.question_id, o.status, o.answer, o.score, o.retries) for o in remote.outcomes]
    want = [(o.question_id, o.status, o.answer, o.score, 0) for o in local.outcomes]
    assert got == want
    assert {o.status for o in local.outcomes} == {"ok", "error"}  # the comparison means something
    assert 0 < local.score < 1
    assert all(t.sandbox in ("nsjail", "bwrap") for t in remote.trajectories)  # jailed
    assert len(pids) == 2 and wait_dead(pids, 5) == []  # close() killed the actors
    assert ray.is_initialized()  # a cluster it did not start is left running


def test_a_killed_actor_costs_only_its_rollouts_once_and_nothing_is_recorded_twice(cluster):
    task = load_task("rg:basic_arithmetic", size=8, seed=4)
    qs = task.questions()
    ex = RayExecutor(actors=2, per_actor=2)
    killed: dict[str, object] = {}
    with StubServer([("ok", "Answer: 7")], delay_s=1.5) as s:
        rt = Runtime(model=OpenAICompatible("stub", s.base_url), executor=ex)

        def kill_one() -> None:
            deadline = time.monotonic() + 60
            while len(s.requests) < 4 and time.monotonic() < deadline:  # 4 rollouts in calls
                time.sleep(0.02)
            flying = ex.in_flight()
            victim = max(flying, key=lambda p: len(flying[p]))
            killed.update(pid=victim, ids=set(flying[victim]))
            os.kill(victim, signal.SIGKILL)

        killer = threading.Thread(target=kill_one)
        killer.start()
        done: list[str] = []
        try:
            r = evaluate(rt, load_harness("single_call"), task, qs, 2,
                         on_done=lambda o, t: done.append(o.question_id))  # fmt: skip
        finally:
            killer.join()
            pids = ex.actor_pids()
            rt.close()
        calls = len(s.requests)
    lost = killed["ids"]
    assert isinstance(lost, set) and len(lost) == 2
    assert sorted(done) == sorted(q.id for q in qs)  # on_done once per question
    assert [o.question_id for o in r.outcomes] == [q.id for q in qs]
    assert all(o.status == "ok" and o.answer == "7" for o in r.outcomes), r.outcomes
    assert {o.question_id for o in r.outcomes if o.retries == 1} == lost
    assert all(o.retries == 0 for o in r.outcomes if o.question_id not in lost)
    assert all(t.retries == o.retries for t, o in zip(r.trajectories, r.outcomes, strict=True))
    assert len(qs) <= calls <= len(qs) + len(lost)
    assert killed["pid"] not in pids and len(pids) == 2  # a replacement took its place


def test_ctrl_c_stops_promptly_and_no_actor_survives(cluster):
    task = load_task("rg:basic_arithmetic", size=6, seed=5)
    ex = RayExecutor(actors=2, per_actor=1)
    main = threading.main_thread().ident
    assert main is not None
    sent: list[float] = []
    seen: list[int] = []
    with StubServer([("sleep", 60, "Answer: 1")]) as s:
        rt = Runtime(model=OpenAICompatible("stub", s.base_url, timeout_s=90), executor=ex)

        def interrupt() -> None:
            deadline = time.monotonic() + 60
            while len(s.requests) < 2 and time.monotonic() < deadline:  # both actors busy
                time.sleep(0.02)
            seen.extend(ex.actor_pids())
            sent.append(time.monotonic())
            signal.pthread_kill(main, signal.SIGINT)

        t = threading.Thread(target=interrupt)
        t.start()
        done: list[str] = []
        try:
            with pytest.raises(KeyboardInterrupt):
                evaluate(rt, load_harness("single_call"), task, task.questions(), 2,
                         on_done=lambda o, tr: done.append(o.question_id))  # fmt: skip
            took = time.monotonic() - sent[0]
        finally:
            t.join()
            rt.close()
    assert took < 30.0  # a guard: cancelled, not waited out behind the 60 s replies
    assert done == [] and rt.cancelled
    assert len(seen) == 2 and wait_dead(seen, 5) == []


def test_a_model_the_actors_cannot_call_is_refused_and_a_cached_one_keeps_its_identity(tmp_path):
    with pytest.raises(ExecutorUnavailable, match="executor.kind=local"):
        describe_model(ScriptedModel())
    inner = OpenAICompatible("m", "http://10.0.0.1:8000/v1", api_key="sk-secret-1", retries=2)
    spec = describe_model(CachedModel(inner, tmp_path / "c.sqlite"))
    assert spec is not None and not spec.loopback() and spec.api_key == "sk-secret-1"
    assert "sk-secret-1" not in repr(spec)
    built = spec.build()
    assert isinstance(built, CachedModel) and built.inner.name == inner.name
    assert built.path == tmp_path / "c.sqlite" and built.inner.retries == 2



def test_the_actors_keep_the_embedded_servers_prefix_policy(tmp_path, monkeypatch):
    """An actor calls the driver's embedded llama-server over HTTP: it must send the prompt
    cache switch the driver's own calls send, and key its cache as the driver does, or a greedy
    reply made reusing a prefix (under "all") is cached as a default one."""
    from whale.models import EmbeddedLlama, Sampling
    from whale.models.cache import cache_key

    msgs = [{"role": "user", "content": "hi"}]
    with StubServer([("ok", "x")] * 4) as s:
        emb = EmbeddedLlama(tmp_path / "m.gguf", alias="solver", prefix_cache="all")
        client = OpenAICompatible("solver", s.base_url, request_fields=emb._fields)
        monkeypatch.setattr(emb, "start", lambda: client)
        driver = CachedModel(emb, tmp_path / "c.sqlite")
        spec = describe_model(driver)
        assert spec is not None and spec.prefix_cache == "all" and spec.cache_prompt
        built = spec.build()
        assert isinstance(built, CachedModel)
        built.chat(msgs, Sampling(temperature=0.0, seed=1))
        assert s.requests[-1]["cache_prompt"] is True
        key = cache_key(emb.name, msgs, Sampling(temperature=0.0, seed=1), "all")
        assert driver._get(key) is not None  # the actor's reply, under the driver's key
        built.close()
        driver.close()


def test_a_fleet_and_a_lazily_served_model_are_described_for_the_actors():
    """The weight phase's solver is served on demand (rsft's _Lazy: resolve_model) and a
    fleet routes over several URLs: both must reach the actors (the GPU recipe uses both)."""
    from whale.models import Fleet

    fleet = Fleet("m", ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"], api_key="k",
                  max_concurrency=3, probe_s=2.0)  # fmt: skip

    class Lazy:
        name = "solver:base"

        def resolve_model(self):
            return fleet

    spec = describe_model(Lazy())
    fleet.close()
    assert spec is not None and spec.endpoints == ("http://10.0.0.1:8000/v1",
                                                   "http://10.0.0.2:8000/v1")  # fmt: skip
    assert not spec.loopback() and spec.name == "fleet:m"
    built = spec.build()
    try:
        assert isinstance(built, Fleet) and built.urls() == list(spec.endpoints)
        assert built.max_concurrency == 3 and built.probe_s == 2.0 and built.api_key == "k"
    finally:
        built.close()


def test_concurrent_streams_on_one_executor_each_get_their_own_runs(cluster):
    """Two threads evaluating on one Runtime (the GRPO reward scores edits in parallel) share
    the actors: every run reaches the stream that asked for it, once, with no retry."""
    task = load_task("rg:basic_arithmetic", size=12, seed=6)
    qs = task.questions()
    ex = RayExecutor(actors=2, per_actor=2)
    results: dict[int, object] = {}
    with StubServer([("ok", "Answer: 7")], delay_s=0.2) as s:
        rt = Runtime(model=OpenAICompatible("stub", s.base_url), executor=ex)

        def one(k: int) -> None:
            results[k] = evaluate(rt, load_harness("single_call"), task, qs[k::2], 2)

        threads = [threading.Thread(target=one, args=(k,)) for k in (0, 1)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        finally:
            rt.close()
    for k in (0, 1):
        r = results[k]
        assert [o.question_id for o in r.outcomes] == [q.id for q in qs[k::2]]
        assert all(o.status == "ok" and o.retries == 0 for o in r.outcomes), r.outcomes


def test_an_actor_that_died_idle_costs_no_rollout_a_try(cluster):
    task = load_task("rg:basic_arithmetic", size=4, seed=7)
    qs = task.questions()
    ex = RayExecutor(actors=2, per_actor=1)
    with StubServer([("ok", "Answer: 7")]) as s:
        rt = Runtime(model=OpenAICompatible("stub", s.base_url), executor=ex)
        try:
            evaluate(rt, load_harness("single_call"), task, qs[:2], 2)
            victim = ex.actor_pids()[0]
            os.kill(victim, signal.SIGKILL)
            assert wait_dead([victim], 5) == []
            r = evaluate(rt, load_harness("single_call"), task, qs, 2)
        finally:
            rt.close()
    assert [o.retries for o in r.outcomes] == [0, 0, 0, 0]
    assert all(o.status == "ok" for o in r.outcomes)


TWO_CALLS = """
def run(question, env):
    env.llm([{"role": "user", "content": "first " + question}])
    return env.llm([{"role": "user", "content": "second " + question}]).text.split(":")[-1].strip()
"""


def test_the_model_calls_of_a_lost_try_are_counted_in_the_ledger_tokens(cluster):
    # issue 20: a rollout retried after its actor died paid for its first try's calls, but
    # the ledger's tokens counted only the retry's. Each stub completion is 5 tokens; the
    # actor is killed while the first try's second call is in flight (its first came back).
    task = load_task("rg:basic_arithmetic", size=1, seed=3)
    ex = RayExecutor(actors=1, per_actor=1)
    killed: list[int] = []
    with StubServer([("ok", "Answer: 7")], delay_s=1.0) as s:
        rt = Runtime(model=OpenAICompatible("stub", s.base_url), executor=ex)

        def kill_in_second_call() -> None:
            deadline = time.monotonic() + 60  # a guard against a hang only
            while len(s.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            victim = ex.actor_pids()[0]
            killed.append(victim)
            os.kill(victim, signal.SIGKILL)

        killer = threading.Thread(target=kill_in_second_call)
        killer.start()
        try:
            r = evaluate(rt, TWO_CALLS, task, task.questions(), 1)
        finally:
            killer.join()
            rt.close()
        calls = len(s.requests)
    (o,), (t,) = r.outcomes, r.trajectories
    assert killed and o.retries == 1 and o.status == "ok" and o.answer == "7"
    assert calls == 4  # two paid by the lost try (one answered before the kill), two by the retry
    assert len(t.model_calls()) == 2 and t.lost_tokens == 5
    assert o.tokens == 2 * 5 + 5


REAPER_DRIVER = """
import subprocess, sys
from tests.servers import StubServer
from whale.evaluation import evaluate
from whale.harness import Runtime, load_harness
from whale.harness.ray_executor import RayExecutor
from whale.models import OpenAICompatible
from whale.tasks import load_task
bystander = subprocess.Popen(["sleep", "300"])
task = load_task("rg:basic_arithmetic", size=2, seed=0)
with StubServer([("ok", "Answer: 1")]) as s:
    rt = Runtime(model=OpenAICompatible("stub", s.base_url), executor=RayExecutor(actors=1, num_cpus=1))
    evaluate(rt, load_harness("single_call"), task, task.questions(), 1)
    rt.close()
print(bystander.pid, bystander.poll(), flush=True)
bystander.kill()
"""


def test_shutting_down_its_cluster_spares_the_drivers_other_children():
    """The reaper kills what ray.init started, not a model server the driver started before."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", REAPER_DRIVER], cwd=root, capture_output=True,
                         text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    pid, rc = out.stdout.split()
    assert rc == "None"  # still running after the cluster's shutdown


def test_cancelling_one_runtime_spares_the_streams_of_another_on_the_same_actors(cluster):
    """Runtimes made from one config share one executor (shared_executor): a cancel of one
    (its Ctrl-C handler, a stopped phase) must not kill, cancel or starve the others' runs."""
    task = load_task("rg:basic_arithmetic", size=8, seed=3)
    qs = task.questions()
    ex = RayExecutor(actors=2, per_actor=2)
    res: dict[str, object] = {}
    with StubServer([("ok", "Answer: 7")], delay_s=1.5) as s:
        ra = Runtime(model=OpenAICompatible("stub", s.base_url), executor=ex)
        rb = Runtime(model=OpenAICompatible("stub", s.base_url), executor=ex)

        def run(k: str, rt: Runtime, q: list) -> None:
            res[k] = evaluate(rt, load_harness("single_call"), task, q, 2)

        ta = threading.Thread(target=run, args=("A", ra, qs[:4]))
        tb = threading.Thread(target=run, args=("B", rb, qs[4:]))
        try:
            ta.start()
            deadline = time.monotonic() + 60
            while len(s.requests) < 4 and time.monotonic() < deadline:  # A fills every slot
                time.sleep(0.02)
            tb.start()
            time.sleep(0.3)
            ra.cancel()
            ta.join(60)
            tb.join(60)
            assert not ta.is_alive() and not tb.is_alive()
        finally:
            ex.close()
    a, b = res["A"], res["B"]
    assert all(o.status == "killed" for o in a.outcomes)  # type: ignore[attr-defined]
    assert [(o.status, o.retries) for o in b.outcomes] == [("ok", 0)] * 4  # type: ignore[attr-defined]


def test_a_stream_closed_early_keeps_its_running_rollout_counted_until_it_ends(cluster):
    """A rollout still running on its actor after its stream was closed holds its place: the
    next stream's rollouts go to free actors instead of queueing behind it."""
    from whale.harness.executor import Rollout

    src = "def run(question, env):\n    return env.llm([{'role': 'user', 'content': question}]).text\n"
    ex = RayExecutor(actors=2, per_actor=1)
    with StubServer([("ok", "fast"), ("sleep", 20, "slow"), ("ok", "x")]) as s:
        rt = Runtime(model=OpenAICompatible("stub", s.base_url, timeout_s=60), executor=ex)
        try:
            gen = ex.stream(rt, src, [Rollout("c0", "q0"), Rollout("c1", "q1")], 2, None)
            next(gen)
            gen.close()  # c1 still decodes on its actor
            out = list(ex.stream(rt, src, [Rollout("d0", "q"), Rollout("d1", "q")], 2, None))
            orphan_running = s.in_flight  # its 20 s reply has not come yet
        finally:
            ex.close()
    assert sorted(t.status for _, t in out) == ["ok", "ok"]
    assert orphan_running == 1  # the second stream ended before the orphan: not behind it
