"""Allowed packages inside the real jail (`runtime.packages`), on nsjail and on bubblewrap: what
is in the set imports (pure Python, compiled, through .pth files), nothing else does, the
folder is read-only, and a runtime without packages starts its worker exactly as before.
Sets are built from wheels made here (tests/harness/wheels.py), pip with no index."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.wheels import rewheel, write_wheel
from whale.harness import Runtime
from whale.harness.packages import PACKAGES_INSIDE, PackageSet, build_folder, venv_packages
from whale.harness.sandbox import Sandbox, SandboxKind

HERE = os.path.dirname(os.path.abspath(__file__))

# A .pth that adds a folder, and one that runs an import line, as `site` processes them.
PTH_FILES = {
    "pthpkg.pth": "extra\nimport pth_hook\n",
    "extra/pth_only.py": "WHERE = 'extra'\n",
    "pth_hook.py": "import sys\nsys.whale_pth_ran = True\n",
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("wheels")
    made = [
        write_wheel(folder, "allowed", "1.0", {"allowed/__init__.py": "VALUE = 42\n"}),
        write_wheel(folder, "pthpkg", "1.0", PTH_FILES),
        rewheel("pydantic_core", folder),  # compiled (a cpython-311 .so), as PyPI built it
        rewheel("typing_extensions", folder),  # pydantic_core's one requirement
    ]
    return [str(w) for w in made]


@pytest.fixture(scope="module")
def built(wheels, tmp_path_factory) -> PackageSet:
    """One set for every test of this module: pip from these wheels only."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_NO_INDEX", "1")
        folder = build_folder(wheels, tmp_path_factory.mktemp("cache"))
    return PackageSet(str(folder), ("allowed", "pthpkg", "pydantic_core", "typing_extensions"))


def run(sandbox: SandboxKind, body: str, packages: PackageSet | None) -> str:
    src = "def run(q, env):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    t = Runtime(sandbox=Sandbox(sandbox), packages=packages).run(src, "q")
    assert t.status == "ok" and t.answer is not None, t.error
    return t.answer


def test_an_allowed_package_imports_from_the_read_only_folder(sandbox, built):
    body = "import allowed\nreturn f'{allowed.VALUE} {allowed.__file__}'"
    assert run(sandbox, body, built) == f"42 {PACKAGES_INSIDE}/allowed/__init__.py"


def test_a_compiled_package_imports_and_runs(sandbox, built):
    body = ("import pydantic_core\n"
            "v = pydantic_core.SchemaValidator({'type': 'int'}).validate_python('5')\n"
            "return f'{v!r} {pydantic_core._pydantic_core.__file__}'")  # fmt: skip
    value, where = run(sandbox, body, built).split(" ")
    assert value == "5" and where.startswith(f"{PACKAGES_INSIDE}/pydantic_core/")
    assert where.endswith(".so")


def test_pth_files_are_processed_as_site_does(sandbox, built):
    body = (
        "import sys, pth_only\nreturn f'{pth_only.WHERE} {getattr(sys, \"whale_pth_ran\", False)}'"
    )
    assert run(sandbox, body, built) == "extra True"


def test_the_folder_comes_after_the_standard_library(sandbox, built):
    path = json.loads(run(sandbox, "import json, sys\nreturn json.dumps(sys.path)", built))
    stdlib = [i for i, p in enumerate(path) if p.endswith("/lib-dynload")]
    assert stdlib and path.index(PACKAGES_INSIDE) > stdlib[0]


THIRD_PARTY = ("numpy", "pydantic", "reasoning_gym", "whale", "pytest", "tomli_w", "yaml")


def test_a_package_not_in_the_set_does_not_import_by_any_path(sandbox, built):
    """As tests/harness/test_cleanup.py's test of the default jail, with a set mounted:
    pydantic_core is in it, pydantic (which needs it) is not."""
    import site
    import sysconfig

    paths = {*sys.path, *site.getsitepackages(), sysconfig.get_path("purelib"), HERE,
             os.path.dirname(built.folder)}  # fmt: skip
    body = (f"import importlib, sys\nsys.path[:0] = {sorted(p for p in paths if p)!r}\n"
            f"got = []\nfor name in {THIRD_PARTY!r}:\n"
            "    try:\n        importlib.import_module(name)\n        got.append(name)\n"
            "    except ImportError:\n        pass\nreturn ','.join(got)")  # fmt: skip
    assert run(sandbox, body, built) == ""


# What a harness tries on the set: each must raise (OSError: read-only file system).
WRITES = {
    "new file": "open(P + '/evil.py', 'w').write('x')",
    "overwrite": "open(P + '/allowed/__init__.py', 'w').write('VALUE = 0')",
    "append": "open(P + '/allowed/__init__.py', 'a').write('VALUE = 0')",
    "unlink": "os.unlink(P + '/allowed/__init__.py')",
    "rename": "os.rename(P + '/allowed', P + '/gone')",
    "replace": "open('/work/m.py', 'w').write('VALUE = 0'); os.replace('/work/m.py', P + '/allowed/__init__.py')",
    "mkdir": "os.mkdir(P + '/newpkg')",
    "chmod": "os.chmod(P + '/allowed/__init__.py', 0o777)",
    "pycache": "os.mkdir(P + '/allowed/__pycache__/x')",
    "utime": "os.utime(P + '/allowed/__init__.py', (0, 0))",
}


@pytest.fixture(scope="module")
def writable(built, tmp_path_factory) -> PackageSet:
    """The set, copied with every file and folder mode 0777: only the mount can stop a write
    (the jail's uid is not the owner, so plain permissions would stop it too)."""
    import shutil

    folder = tmp_path_factory.mktemp("open") / "set"
    shutil.copytree(built.folder, folder)
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o777)
    return PackageSet(str(folder), built.names)


def test_the_folder_cannot_be_written_or_a_module_replaced(sandbox, writable):
    body = (f"import json, os\nP = {PACKAGES_INSIDE!r}\ndone = []\n"
            f"for what, code in {WRITES!r}.items():\n"
            "    try:\n        exec(code)\n        done.append(what)\n"
            "    except OSError:\n        pass\n"
            "import allowed\nreturn json.dumps([done, allowed.VALUE])")  # fmt: skip
    assert json.loads(run(sandbox, body, writable)) == [[], 42]


def test_the_folder_is_mounted_read_only_nosuid_and_nodev(sandbox, built):
    body = (f"import os\nf = os.statvfs({PACKAGES_INSIDE!r}).f_flag\n"
            "return ','.join(str(bool(f & b)) for b in (os.ST_RDONLY, os.ST_NOSUID, os.ST_NODEV))")  # fmt: skip
    assert run(sandbox, body, built) == "True,True,True"


def test_the_network_stays_unreachable_with_packages(sandbox, built):
    body = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
            "    return 'connected'\nexcept OSError as e:\n    return type(e).__name__")  # fmt: skip
    assert run(sandbox, body, built) != "connected"


PROBE = (f"import os, sys\nthere = os.path.exists({PACKAGES_INSIDE!r})\n"
         "return f'{there} {\"site\" in sys.modules} {len(sys.argv)}'")  # fmt: skip


def test_without_packages_the_jail_is_as_before(sandbox, built):
    """No mount, no `site` import (its start-up cost), no extra argument; with packages, all
    three."""
    assert run(sandbox, PROBE, None) == "False False 4"  # the endpoint's file is the 4th
    assert run(sandbox, PROBE, built) == "True True 5"


def test_without_packages_the_worker_is_spawned_with_the_same_arguments(monkeypatch):
    from whale.harness import workers

    seen = []

    def spawn(self, argv, limits, **kw):  # noqa: ANN001
        seen.append((list(argv), dict(kw["ro_files"])))
        raise RuntimeError("stop here")

    monkeypatch.setattr(Sandbox, "spawn", spawn)
    for packages in (None, "/some/folder"):
        with pytest.raises(RuntimeError):
            workers.spawn_worker(Sandbox("nsjail"), Runtime().limits, packages)
    (argv, ro), (argv_p, ro_p) = seen
    assert argv[1:4] == ["-I", "-S", workers.WORKER_INSIDE] and len(argv) == 7
    assert ro == {workers.worker_file(): workers.WORKER_INSIDE,
                  workers.endpoint_file(): workers.ENDPOINT_INSIDE}  # fmt: skip
    assert argv_p == [*argv[:4], argv_p[4], argv_p[5], workers.ENDPOINT_INSIDE, PACKAGES_INSIDE]
    assert ro_p == {**ro, "/some/folder": PACKAGES_INSIDE}


def test_unsafe_mode_reads_the_host_folder(built):
    assert run("unsafe", "import allowed\nreturn str(allowed.VALUE)", built) == "42"


# --- a virtual environment --------------------------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A real venv of this Python (no pip), holding one module and its dist-info."""
    path = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "venvmod.py").write_text("VALUE = 'from the venv'\n")
    (site / "venvmod-1.0.dist-info").mkdir()
    return path


def test_a_venv_s_site_packages_is_mounted(sandbox, venv):
    packages = venv_packages(str(venv))
    assert packages.names == ("venvmod",)
    body = "import venvmod\nreturn f'{venvmod.VALUE} {venvmod.__file__}'"
    assert run(sandbox, body, packages) == f"from the venv {PACKAGES_INSIDE}/venvmod.py"


# --- Ray ----------------------------------------------------------------------------------------


def test_ray_actors_get_the_set_and_mount_the_same_folder(built):
    """What an actor does with the spec it is sent (RuntimeSpec.build, then run), without a
    cluster: the spec crosses by pickle, as Ray sends it."""
    pytest.importorskip("ray")
    from whale.harness.ray_executor import RuntimeSpec

    spec = pickle.loads(pickle.dumps(RuntimeSpec.of(Runtime(packages=built), 1)))
    assert spec.packages == built
    t = spec.build().run(
        "def run(q, env):\n    import allowed\n    return str(allowed.VALUE)\n", "q"
    )
    assert t.status == "ok" and t.answer == "42", t.error


def test_an_actor_without_the_folder_says_so(built):
    pytest.importorskip("ray")
    from whale.harness.ray_executor import RuntimeSpec
    from whale.harness.runtime import ExecutorUnavailable

    spec = RuntimeSpec.of(Runtime(packages=PackageSet("/no/such/folder", ("x",))), 1)
    with pytest.raises(ExecutorUnavailable, match="runtime.packages: /no/such/folder"):
        spec.build()


@pytest.mark.slow
def test_a_ray_actor_imports_the_allowed_package(built):
    """A real local cluster (one actor): the rollout runs jailed on the actor, importing the
    set the driver built."""
    pytest.importorskip("ray")
    from whale.harness.ray_executor import RayExecutor
    from whale.harness.runtime import Rollout

    ex = RayExecutor(actors=1, per_actor=1, num_cpus=1)
    rt = Runtime(packages=built, executor=ex)
    src = "import allowed\n\ndef run(q, env):\n    return str(allowed.VALUE) + q\n"
    sigterm = signal.getsignal(signal.SIGTERM)  # ray.init installs its own
    try:
        got = list(ex.stream(rt, src, [Rollout("a", "!"), Rollout("b", "?")], 1, None))
    finally:
        rt.close()  # shuts down the local cluster it started
        signal.signal(signal.SIGTERM, sigterm)
    assert sorted((i, t.status, t.answer) for i, t in got) == [(0, "ok", "42!"), (1, "ok", "42?")]
