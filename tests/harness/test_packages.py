"""`runtime.packages`: the config value, building a set once (a lock, a temporary folder, a
key), checking a venv, the outcome fingerprint and resume, what proposers are told, and the
commands that take it. Wheels are made here (tests/harness/wheels.py); pip runs with no
index, but for the one test marked `network`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness.wheels import write_wheel
from whale import config as cfgmod
from whale.config import ConfigError
from whale.harness import Budget, Runtime, RuntimeConfig, make_runtime
from whale.harness import packages as pk
from whale.harness.packages import build_folder, build_key, resolve_packages

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No index for pip, and a cache of this test's own."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("WHALE_CACHE", str(tmp_path / "cache"))


def wheel(folder: Path, name: str = "allowed", value: str = "42") -> str:
    folder.mkdir(exist_ok=True)
    files = {f"{name}/__init__.py": f"VALUE = {value}\ndef add(a, b):\n    return a + b\n"}
    return str(write_wheel(folder, name, "1.0", files))


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))


# --- the config value -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    "", "  ", ["--index-url=http://evil"], ["-r", "reqs.txt"], ["-e ./pkg"], [""], ["a\nb"],
    ["x"] * (pk.MAX_REQUIREMENTS + 1), [1], {"a": 1}, "env\x00",
])  # fmt: skip
def test_a_bad_value_is_a_config_error_naming_the_field(value):
    with pytest.raises(ConfigError) as e:
        cfgmod.build(RuntimeConfig, {"packages": value})
    assert e.value.field == "packages"


def test_the_value_round_trips_through_the_saved_config(tmp_path):
    for value in (["openai>=1.40", "./w/x-1.0-py3-none-any.whl"], "/opt/venvs/agent", []):
        cfg = cfgmod.build(RuntimeConfig, {"packages": value})
        cfgmod.save(cfg, tmp_path / "c.toml")
        assert cfgmod.load(RuntimeConfig, tmp_path / "c.toml") == cfg


def test_a_dotted_override_sets_it():
    cfg = cfgmod.load(RuntimeConfig, None, ['packages=["openai>=1.40", "six"]'])
    assert cfg.packages == ["openai>=1.40", "six"]


def test_requirement_names_are_what_the_proposer_is_told():
    reqs = {"openai>=1.40": "openai", "smolagents[toolkit]==1.2": "smolagents",
            "x @ https://h/x-1.0.whl": "x", "./wheels/my_lib-1.0-py3-none-any.whl": "my_lib",
            "git+https://github.com/o/repo.git": "repo", "/src/pkg/": "pkg",
            "six; python_version > '3'": "six"}  # fmt: skip
    assert {r: pk.requirement_name(r) for r in reqs} == reqs


# --- building once ------------------------------------------------------------------------------


def test_the_empty_list_is_the_standard_library_and_builds_nothing(tmp_path):
    assert resolve_packages([], tmp_path / "root") is None
    assert not (tmp_path / "root").exists()
    rt = make_runtime(RuntimeConfig(), None)
    assert rt.packages is None and rt.package_names() == ()


def test_make_runtime_builds_the_set_and_names_it(tmp_path):
    rt = make_runtime(RuntimeConfig(packages=[wheel(tmp_path / "w")]), None)
    assert rt.package_names() == ("allowed",)
    assert rt.packages is not None
    folder = Path(rt.packages.folder)
    assert folder.parent == tmp_path / "cache" / "packages"
    assert (folder / "allowed" / "__init__.py").is_file()
    t = rt.run("def run(q, env):\n    import allowed\n    return str(allowed.add(2, 3))\n", "q")
    assert t.status == "ok" and t.answer == "5", t.error


def test_a_bad_requirement_is_a_config_error_with_pip_s_words(tmp_path):
    with pytest.raises(ConfigError) as e:
        make_runtime(RuntimeConfig(packages=["no-such-package-for-whale==9.9"]), None)
    assert e.value.field == "runtime.packages"
    assert "no-such-package-for-whale" in str(e.value)
    assert "No matching distribution" in str(e.value)  # pip's own last lines
    assert leftovers(tmp_path / "cache" / "packages") == []  # nothing half-made is left


def test_files_are_readable_by_the_jail_s_uid_under_a_strict_umask(tmp_path):
    old = os.umask(0o077)
    try:
        folder = build_folder([wheel(tmp_path / "w")], tmp_path / "root")
    finally:
        os.umask(old)
    for p in [folder, *folder.rglob("*")]:
        assert p.stat().st_mode & (0o555 if p.is_dir() else 0o444) == (
            0o555 if p.is_dir() else 0o444
        ), p


def test_a_second_command_reuses_the_folder_without_pip(tmp_path):
    """The second command is another process: it finds the folder, runs no pip (a marker
    dropped into the folder survives, and it says nothing of installing)."""
    req = wheel(tmp_path / "w")
    folder = build_folder([req], tmp_path / "cache" / "packages")
    (folder / "marker").write_text("first build")
    code = ("import sys\nfrom whale.harness.packages import resolve_packages\n"
            "print(resolve_packages(sys.argv[1:]).folder)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, req], capture_output=True, text=True,
                         cwd=ROOT, check=True, env=dict(os.environ))  # fmt: skip
    # no time bound: a slower machine is no fault; the marker and the silence show no pip ran
    assert out.stdout.strip() == str(folder) and (folder / "marker").read_text() == "first build"
    assert "installing" not in out.stderr


def test_concurrent_builds_of_one_set_run_pip_once(tmp_path, monkeypatch):
    calls = []
    real = pk.pip_install

    def slow_pip(reqs, target):  # noqa: ANN001
        calls.append(target)
        time.sleep(0.5)  # long enough that the other thread reaches the lock
        real(reqs, target)

    monkeypatch.setattr(pk, "pip_install", slow_pip)
    req, root, got = wheel(tmp_path / "w"), tmp_path / "root", []
    threads = [threading.Thread(target=lambda: got.append(build_folder([req], root)))
               for _ in range(3)]  # fmt: skip
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(calls) == 1 and len(set(got)) == 1 and len(got) == 3


KILLED_BUILD = """
import sys, time
from pathlib import Path
from whale.harness import packages as pk
def stuck(reqs, target):
    (Path(target) / "half.py").write_text("made by a build that was killed")
    print("installing", flush=True)
    time.sleep(120)
pk.pip_install = stuck
pk.build_folder(sys.argv[2:], Path(sys.argv[1]))
"""


def test_a_killed_build_leaves_nothing_that_is_trusted(tmp_path):
    """SIGKILL mid-install: no folder under the key, the lock is free, and the next build
    removes the half-made one and makes its own."""
    req, root = wheel(tmp_path / "w"), tmp_path / "root"
    p = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(root), req], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "installing"
    p.send_signal(signal.SIGKILL)
    p.wait()
    key = build_key([req])
    assert not (root / key).exists() and len(list(root.glob(f"{key}.tmp-*"))) == 1
    folder = build_folder([req], root)
    assert folder == root / key and not (folder / "half.py").exists()
    assert (folder / "allowed").is_dir() and leftovers(root) == [key]


def test_an_interrupted_build_removes_its_folder(tmp_path, monkeypatch):
    def interrupted(reqs, target):  # noqa: ANN001
        (Path(target) / "half.py").write_text("x")
        raise KeyboardInterrupt

    monkeypatch.setattr(pk, "pip_install", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_folder([wheel(tmp_path / "w")], tmp_path / "root")
    assert leftovers(tmp_path / "root") == []


def test_the_key_covers_the_requirements_a_local_file_s_bytes_and_the_interpreter(tmp_path,
                                                                                  monkeypatch):  # fmt: skip
    a = wheel(tmp_path / "a")
    assert build_key(["six", a]) == build_key([a, "six", "six "])
    before = build_key([a])
    wheel(tmp_path / "a", value="43")  # the same file name, rebuilt
    assert build_key([a]) != before and build_key(["six"]) != build_key(["six==1.17"])
    plain = build_key(["six"])
    monkeypatch.setattr(pk.platform, "python_version", lambda: "3.12.0")
    assert build_key(["six"]) != plain


# --- a virtual environment ----------------------------------------------------------------------


def fake_venv(path: Path, version: str) -> Path:
    major_minor = ".".join(version.split(".")[:2])
    (path / "lib" / f"python{major_minor}" / "site-packages").mkdir(parents=True)
    (path / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {version}\n")
    return path


def test_a_venv_of_another_python_version_is_refused(tmp_path):
    other = "3.9.18" if sys.version_info[:2] != (3, 9) else "3.12.1"
    with pytest.raises(ConfigError, match=f"Python {other} environment") as e:
        make_runtime(RuntimeConfig(packages=str(fake_venv(tmp_path / "v", other))), None)
    assert e.value.field == "runtime.packages"


def test_a_venv_of_this_version_is_taken_and_its_distributions_named(tmp_path):
    version = ".".join(map(str, sys.version_info[:3]))
    venv = fake_venv(tmp_path / "v", version)
    site = venv / "lib" / f"python{version.rsplit('.', 1)[0]}" / "site-packages"
    for i in range(pk.MAX_NAMES + 3):
        (site / f"dist{i:03d}-1.0.dist-info").mkdir()
    ps = resolve_packages(str(venv))
    assert ps is not None and ps.folder == str(site)
    assert ps.names[0] == "dist000" and len(ps.names) == pk.MAX_NAMES + 1
    assert ps.names[-1] == "3 more"  # the proposer's line stays bounded


THIS = ".".join(map(str, sys.version_info[:3]))


def no_venv(p: Path) -> Path:  # a folder without pyvenv.cfg
    return p


def no_site(p: Path) -> Path:  # this version's pyvenv.cfg, no lib/pythonX.Y/site-packages
    (p / "pyvenv.cfg").write_text(f"version = {THIS}\n")
    return p


@pytest.mark.parametrize("make", [lambda p: p / "missing", no_venv, no_site,
                                  lambda p: Path(sys.prefix)])  # fmt: skip
def test_what_is_not_a_usable_venv_is_refused_naming_the_field(tmp_path, make):
    """A missing path, a folder that is no venv, a venv without this Python's site-packages,
    and whale's own environment (it holds whale and the tasks' packages)."""
    with pytest.raises(ConfigError) as e:
        resolve_packages(str(make(tmp_path)))
    assert e.value.field == "runtime.packages"


# --- keyed runs: fingerprint and resume ---------------------------------------------------------


def fingerprint(packages: object) -> str:
    from whale.models import ModelConfig
    from whale.runs import outcome_fingerprint
    from whale.tasks import TaskConfig

    return outcome_fingerprint(TaskConfig(id="rg:gcd"), ModelConfig(),
                               cfgmod.build(RuntimeConfig, {"packages": packages}))  # fmt: skip


def test_packages_enter_the_outcome_fingerprint():
    prints = {fingerprint([]), fingerprint(["six"]), fingerprint(["six==1.17"]),
              fingerprint("/opt/venvs/a")}  # fmt: skip
    assert len(prints) == 4


def test_without_packages_the_fingerprint_is_the_one_from_before_them():
    """Ledgers written before runtime.packages existed are reused by the same config."""
    assert fingerprint([]) == "80cf2173dc4f0117"


def test_packages_cannot_change_on_resume(tmp_path):
    from whale.revise.run import AdaptConfig
    from whale.runs import ResumeMismatch, refuse_changes

    saved = cfgmod.build(AdaptConfig, {"runtime": {"packages": ["six"]}})
    for value in (["six", "attrs"], [], "/opt/venvs/a"):
        requested = cfgmod.build(AdaptConfig, {"runtime": {"packages": value}})
        with pytest.raises(ResumeMismatch) as e:
            refuse_changes(saved, requested, tmp_path)
        assert e.value.field == "runtime.packages"


# --- what proposers are told --------------------------------------------------------------------


def test_the_api_section_names_the_packages_in_one_line():
    from whale.revise.proposer import api_section

    plain = api_section(("python",), Budget())
    named = api_section(("python",), Budget(), ("openai", "smolagents"))
    assert named == plain + ("\nPackages the harness may import beside the standard library: "
                             "openai, smolagents.")  # fmt: skip


def test_the_search_agent_s_system_prompt_names_them():
    from whale.metaharness.agent import SYSTEM, imports

    assert SYSTEM.replace("{imports}", imports(())).count("may use the standard library only.")
    assert imports(("openai",)) == "the standard library and these packages only: openai"


def test_adapt_runs_a_harness_that_imports_an_allowed_package_and_tells_the_proposer(tmp_path):
    """Through the Python API (whale.adapt, as `whale adapt --set runtime.packages=...`): the
    seed imports the package in every run, and x_t names it."""
    import whale
    from tests.fakes import ScriptedModel
    from tests.revise.conftest import GOOD_EDIT, SumTask, prose_solver
    from whale.revise.run import AdaptConfig

    seed = ("import re\n\nimport allowed\n\ndef run(question, env):\n"
            "    env.llm(question)\n"
            "    a, b = map(int, re.findall(r'\\d+', question)[:2])\n"
            "    return str(allowed.add(a, b))\n")  # fmt: skip
    run = whale.adapt(SumTask(), seed, prose_solver(), ScriptedModel([GOOD_EDIT]),
                      out=tmp_path / "a", rounds=1, g=1, dev=4, eval=4, feedback=2, workers=2,
                      fields={"runtime.packages": [wheel(tmp_path / "w")]})  # fmt: skip
    prompts = list(run.run_dir.rglob("prompt.txt"))
    assert prompts and all("beside the standard library: allowed." in p.read_text()
                           for p in prompts)  # fmt: skip
    assert run.held_out["seed"].correct == run.held_out["seed"].n == 4  # it imported, each run
    saved = cfgmod.load(AdaptConfig, run.run_dir / "config.toml")
    assert saved.runtime.packages == [str(tmp_path / "w" / "allowed-1.0-py3-none-any.whl")]


def test_whale_eval_takes_them_from_set_and_refuses_a_bad_one(tmp_path):
    from typer.testing import CliRunner

    from tests.servers import StubServer
    from whale.cli import app
    from whale.evaluation import read_jsonl

    harness = tmp_path / "h.py"
    harness.write_text("import allowed\n\ndef run(q, env):\n    return str(allowed.VALUE)\n")
    runner = CliRunner()
    for reqs, out in ([wheel(tmp_path / "w")], "good"), (["no-such-package-for-whale"], "bad"):
        with StubServer([("ok", "Answer: 1")]) as s:
            r = runner.invoke(app, ["eval", "--task", "rg:basic_arithmetic", "--harness",
                                    str(harness), "--model", f"stub@{s.base_url}", "-n", "2",
                                    "--out", str(tmp_path / out), "--no-cache", "--set",
                                    cfgmod.override_text("runtime.packages", reqs)])  # fmt: skip
        if out == "good":
            assert r.exit_code == 0, r.output
            assert [row["answer"] for row in read_jsonl(tmp_path / out / "outcomes.jsonl")] == [
                "42", "42"]  # fmt: skip
        else:
            assert r.exit_code == 2 and "runtime.packages" in r.output, r.output


# --- a real package from an index ---------------------------------------------------------------


@pytest.mark.network
def test_a_real_package_from_the_index_imports_in_the_jail(tmp_path, monkeypatch):
    """`openai` and its dependencies (pydantic_core compiled among them), from the index pip
    is configured with; deselected from the default run (-m network to run it)."""
    monkeypatch.delenv("PIP_NO_INDEX")
    rt = make_runtime(RuntimeConfig(packages=["openai>=1.40"]), None)
    src = ("def run(q, env):\n    import openai\n"
           "    c = openai.OpenAI(api_key='x', base_url='http://127.0.0.1:9/v1')\n"
           "    return type(c).__name__ + ' ' + openai.__file__\n")  # fmt: skip
    t = rt.run(src, "q")
    assert t.status == "ok" and t.answer == f"OpenAI {pk.PACKAGES_INSIDE}/openai/__init__.py", (
        t.error
    )
    assert rt.package_names() == ("openai",)


def test_runtime_packages_default_is_empty():
    assert RuntimeConfig().packages == [] and Runtime().packages is None


@pytest.mark.parametrize("value", [[1], [None], ["ok", 2], 3, {"a": "b"}])
def test_resolve_packages_from_the_python_api_refuses_what_is_not_requirements(value, tmp_path):
    # the config builder checks types; the Python API may hand resolve_packages anything
    with pytest.raises(ConfigError) as e:
        pk.resolve_packages(value, tmp_path)
    assert e.value.field == "runtime.packages"
    assert not list(tmp_path.iterdir())  # nothing was built
