"""The report rendered in headless Chromium (Debian's `chromium`; `make install` installs it):
the rendered DOM holds the lineage nodes, the diff text and the curve images, no script ran
from a hostile harness source, and a screenshot is saved. Chromium runs in its own process
group, killed whole on a timeout, so nothing outlives the test."""

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.analysis.test_report import AUDIT, make_adapt
from whale.analysis.report import build_report

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists()
                                        else None)  # fmt: skip
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make chromium)"),
]


def chromium(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within {timeout} s: {cmd}")
    finally:
        try:  # helpers (zygote, gpu) left in the group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_rendered_dom_holds_lineage_diffs_and_curve_images(tmp_path):
    page = build_report(make_adapt(tmp_path / "run"), out=tmp_path / "report.html", audit=AUDIT)
    res = chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = res.stdout
    assert res.returncode == 0 and "</html>" in dom, res.stderr[-2000:]
    for node in ("node-seed", "node-r1.0", "node-r1.1", "node-r2.0"):
        assert f'id="{node}"' in dom
    assert "+# second edit" in dom  # a diff's text
    imgs = re.findall(r'<img class="curve"[^>]*src="data:image/png;base64,[A-Za-z0-9+/=]+"', dom)
    assert imgs
    assert "<script" not in dom and "&lt;script&gt;alert(1)" in dom  # parsed as text


def test_screenshot_is_a_png(tmp_path):
    page = build_report(make_adapt(tmp_path / "run"), out=tmp_path / "report.html", audit=AUDIT)
    shot = tmp_path / "shot.png"
    res = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
