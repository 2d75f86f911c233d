"""Every read-only system folder the jail binds (/usr/bin, the libraries, the interpreter and
its standard library), the masks, the scratch folder and the files passed in are nosuid and
nodev on nsjail as on bubblewrap (issue 20; defence in depth behind no_new_privs). Read inside
the jail with statvfs (there is no /proc there): the mount flags the kernel applies."""

import json
import shutil

import pytest

from whale.harness.budget import Limits
from whale.harness.sandbox import Sandbox, jail_mounts, nsjail_binary, python_executable

PROBE = """
import json, os, sys
flags = {}
for p in json.loads(sys.argv[1]):
    f = os.statvfs(p).f_flag
    flags[p] = [bool(f & os.ST_NOSUID), bool(f & os.ST_NODEV)]
print(json.dumps(flags))
"""

KINDS = [
    pytest.param("nsjail", marks=pytest.mark.skipif(nsjail_binary() is None,
                                                    reason="nsjail is not installed")),
    pytest.param("bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None,
                                                   reason="bubblewrap is not installed")),
]  # fmt: skip


def flags_inside(kind, paths, ro_files):
    j = Sandbox(kind).spawn([python_executable(), "-I", "-c", PROBE, json.dumps(paths)],
                            Limits(), ro_files=ro_files)  # fmt: skip
    try:
        out, err = j.proc.communicate(timeout=120)  # a guard against a hang only
    finally:
        j.kill()
    assert j.proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return json.loads(out)


@pytest.mark.parametrize("kind", KINDS)
def test_system_folders_scratch_and_passed_files_are_nosuid_and_nodev(kind, tmp_path):
    passed = tmp_path / "data.txt"
    passed.write_text("x")
    m = jail_mounts()
    paths = [*m.binds, *m.masks, "/work", "/data.txt"]
    flags = flags_inside(kind, paths, {str(passed): "/data.txt"})
    assert "/usr/bin" in flags
    assert {p: f for p, f in flags.items() if f != [True, True]} == {}


@pytest.mark.parametrize("kind", KINDS)
def test_the_two_devices_are_nosuid_and_still_devices(kind):
    flags = flags_inside(kind, ["/dev/null", "/dev/urandom"], {})
    assert all(nosuid for nosuid, _ in flags.values())
