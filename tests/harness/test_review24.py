"""Hostile review of issue 24 (the in-jail endpoint, runtime.packages, folder harnesses): each
test is an attack that found a defect, kept so it stays fixed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fakes import ScriptedModel
from whale.config import ConfigError
from whale.harness import Budget, Limits, Runtime
from whale.harness.bundle import from_files
from whale.harness.packages import build_key, resolve_packages, venv_packages
from whale.harness.sandbox import Sandbox
from whale.revise.code_screens import interface_violations
from whale.revise.edits import apply_edits

# A harness that writes raw bytes to its endpoint (the key put in where "KEY" is) and answers
# with the status line of each reply ("" when the connection was dropped with no reply).
RAW = r"""
import json, os, socket

def send(raw):
    host, port = os.environ["OPENAI_BASE_URL"][len("http://"):].split("/")[0].split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(raw.replace(b"KEY", os.environ["OPENAI_API_KEY"].encode()))
    out = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            out += data
    except OSError:
        pass
    s.close()
    return out.decode("latin-1").split("\r\n", 1)[0]

def run(question, env):
    return json.dumps([send(r.encode("latin-1")) for r in json.loads(question)])
"""


def _post(body: str, length: str | None = None) -> str:
    n = str(len(body.encode("latin-1"))) if length is None else length
    return (f"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer KEY\r\n"
            f"Content-Length: {n}\r\nConnection: close\r\n\r\n{body}")  # fmt: skip


def test_endpoint_answers_every_forged_request_with_an_http_error(sandbox):
    """A Content-Length of digits that are not ASCII ('²' passes str.isdigit, int() refuses
    it) and a body nested deeper than the worker's pipe encoder can go (json.loads takes 600
    levels, the worker's recursive `dumps` does not) each killed the connection's thread with
    no reply (and a traceback on the run's stderr): an OpenAI client saw a dropped
    connection, and retried. Each is a 400, and the endpoint still serves a good request."""
    deep = ('{"messages": [{"role": "user", "content": "hi"}], "tools": '
            + "[" * 600 + "]" * 600 + "}")  # fmt: skip
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    requests = [_post("ab", length="\xb2"), _post(deep), _post(good)]
    runtime = Runtime(model=ScriptedModel(["fine"]), budget=Budget(run_timeout_s=20.0),
                      limits=Limits(cpu_s=20), sandbox=Sandbox(sandbox))  # fmt: skip
    traj = runtime.run(RAW, json.dumps(requests))
    assert traj.status == "ok", (traj.error, traj.stderr_tail)
    assert json.loads(traj.answer) == ["HTTP/1.1 400 Bad Request"] * 2 + ["HTTP/1.1 200 OK"]
    assert "Traceback" not in traj.stderr_tail


# -- code screens: a file named like a standard library module --------------------------------


def test_a_nested_file_named_like_a_stdlib_module_does_not_excuse_importing_it(sandbox):
    """The screens took every part of a file's path for an "own" module: a bundle holding an
    empty helpers/os.py passed `import os` as an import of its own file, but `import os` is
    the real os (os.popen and all) in the jail."""
    source = from_files({
        "harness.py": "import os\n\ndef run(question, env):\n"
                      "    return str(hasattr(os, 'popen'))\n",
        "helpers/os.py": "",
    })  # fmt: skip
    traj = Runtime(sandbox=Sandbox(sandbox)).run(source, "q")
    assert traj.answer == "True"  # the real module
    assert any("forbidden import: import os" in v for v in interface_violations(source))


def test_a_top_level_file_named_like_a_loaded_module_is_a_load_failure(sandbox):
    """A top-level os.py beside `import os`: os is loaded before the harness, so the import
    was the real os while the screens took it for the file. The worker refuses the file."""
    source = from_files({
        "harness.py": "import os\n\ndef run(question, env):\n"
                      "    return str(hasattr(os, 'popen'))\n",
        "os.py": "",
    })  # fmt: skip
    traj = Runtime(sandbox=Sandbox(sandbox)).run(source, "q")
    assert traj.status == "error" and traj.failure == "load", (traj.status, traj.answer)
    assert "os.py" in (traj.error or "") and "loaded before the harness" in (traj.error or "")


def test_own_modules_of_other_names_are_still_excused():
    source = from_files({"harness.py": "import util\n\ndef run(question, env):\n"
                                       "    return util.X\n", "util.py": "X = 'x'\n"})  # fmt: skip
    assert interface_violations(source) == []


# -- Apply: a fenced rewrite of a one-file harness ---------------------------------------------


def test_a_fenced_rewrite_of_one_file_cannot_make_it_a_folder():
    """Blocks and a bundle's rewrite refuse header lines; a one-file parent's fenced rewrite
    did not, so a rewrite that began with a header turned one file into a folder of new
    files (Apply makes no new files, and a rewrite replaces harness.py only)."""
    parent = "def run(question, env):\n    return 'a'\n"
    proposal = ("```python\n# === whale file: harness.py ===\nimport extra\n"
                "def run(question, env):\n    return extra.X\n"
                "# === whale file: extra.py ===\nX = 'b'\n```\n")  # fmt: skip
    res = apply_edits(parent, proposal)
    assert not res.ok and res.source == parent
    assert "whale file" in res.reason


# -- runtime.packages -------------------------------------------------------------------------


def test_a_relative_folder_requirement_is_keyed_by_where_it_is(tmp_path, monkeypatch):
    """A local folder is keyed by its path; "." was keyed by the text ".", so two projects
    that each name their own folder "." shared the build of whichever came first."""
    keys = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        keys.append(build_key(["."]))
    assert keys[0] != keys[1]


def _venv(root: Path, holds: dict[str, str]) -> Path:
    (root / "pyvenv.cfg").parent.mkdir(parents=True, exist_ok=True)
    import sys

    (root / "pyvenv.cfg").write_text(f"version = {sys.version_info[0]}.{sys.version_info[1]}.0\n")
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for path, text in holds.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    site.mkdir(parents=True, exist_ok=True)
    return root


def test_a_venv_that_holds_whale_is_refused(tmp_path):
    """whale's own environment is refused (whale and its task generators are an oracle in the
    jail); another venv with whale installed in it was taken, oracle and all."""
    venv = _venv(tmp_path / "project", {"whale/__init__.py": "", "openai/__init__.py": ""})
    with pytest.raises(ConfigError, match="whale"):
        venv_packages(str(venv))
    ok = _venv(tmp_path / "clean", {"openai/__init__.py": ""})
    assert venv_packages(str(ok)).folder.endswith("site-packages")


def test_a_built_set_that_holds_whale_is_refused(tmp_path, monkeypatch):
    """The same through a list of requirements (whale itself, or a package that needs it)."""
    import whale.harness.packages as packages

    def fake_pip(requirements, target):
        (Path(target) / "whale").mkdir()
        (Path(target) / "whale" / "__init__.py").write_text("")

    monkeypatch.setattr(packages, "pip_install", fake_pip)
    with pytest.raises(ConfigError, match="whale"):
        resolve_packages(["needs-whale"], tmp_path / "cache")
    assert os.path.isdir(tmp_path / "cache")


# -- a folder of harness.py alone and that file -----------------------------------------------


@pytest.mark.parametrize("text", ["def run(question, env):\n    return question",
                                  "def run(question, env):\r\n    return question\r\n"])
def test_a_folder_of_harness_py_alone_is_the_harness_its_file_is(tmp_path, text):
    """`--harness DIR` and `--harness DIR/harness.py` are one harness (one hash, one resume):
    the folder added a final newline the file read has not, and kept CRLF line ends that
    reading the file turns into newlines."""
    from whale.harness import harness_hash, load_harness

    (tmp_path / "harness.py").write_bytes(text.encode())
    assert harness_hash(load_harness(str(tmp_path))) == harness_hash(
        load_harness(str(tmp_path / "harness.py")))


IDLE = r"""
import os, socket, time

def run(question, env):
    port = int(os.environ["OPENAI_BASE_URL"].split(":")[2].split("/")[0])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(9)]
    time.sleep(0.3)
    idle[8].settimeout(5)
    head = idle[8].recv(4096).decode("latin-1").lower()
    for s in idle:
        s.close()
    return head.split("\r\n\r\n")[0]
"""


def test_a_connection_turned_away_may_be_retried(sandbox):
    """A 503 (the connections or the run's threads are all taken: a harness of 8 threads
    calling at once meets it) said x-should-retry: false like every error, so the OpenAI
    client raised at once; nothing reached the broker and nothing was spent, so it may retry."""
    runtime = Runtime(model=ScriptedModel(["x"]), budget=Budget(run_timeout_s=20.0),
                      limits=Limits(cpu_s=20), sandbox=Sandbox(sandbox))  # fmt: skip
    traj = runtime.run(IDLE, "q")
    assert traj.status == "ok", traj.error
    assert traj.answer.startswith("http/1.1 503") and "x-should-retry: true" in traj.answer


def test_a_folder_named_importlib_is_refused_by_name_not_by_a_recursion_error(sandbox):
    """The finder imported importlib.machinery on its first call, which the bundle's own
    importlib/ folder then answered: the load failed with a RecursionError."""
    source = from_files({"harness.py": "from importlib import helper\n\n"
                                       "def run(question, env):\n    return helper.X\n",
                         "importlib/helper.py": "X = 'mine'\n"})  # fmt: skip
    traj = Runtime(sandbox=Sandbox(sandbox)).run(source, "q")
    assert traj.status == "error" and traj.failure == "load"
    assert "RecursionError" not in (traj.error or "")
    assert "the module importlib is loaded before the harness" in (traj.error or "")
