"""The README and docs/ hold what they claim: the example harness of the harness contract
(docs/harness.md) runs under the runtime as shown, every relative link resolves to a file, and
the README stays a short front door that opens with the two set-up commands (a hook and CI run
its `make test` line)."""

import re
from pathlib import Path

from tests.fakes import ScriptedModel
from whale.harness import Runtime

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```.*?^```$", re.DOTALL | re.MULTILINE)
# [text](target) and ![alt](target); the text may span lines, the target may not.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def doc_pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def contract_harness() -> str:
    text = (ROOT / "docs" / "harness.md").read_text()
    match = re.search(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
    assert match is not None, "docs/harness.md has no python example"
    return match.group(1)


def relative_links(page: Path) -> list[str]:
    """Targets of the page's Markdown links outside code blocks, minus URLs and anchors."""
    prose = FENCE.sub("", page.read_text())
    targets = [t.split("#", 1)[0] for t in LINK.findall(prose)]
    return [t for t in targets if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def test_readme_example_harness_runs_the_code_the_model_writes():
    """The harness of the contract (moved from the README to docs/harness.md)."""
    src = contract_harness()
    assert len(src.strip().splitlines()) <= 12
    model = ScriptedModel(["```python\nprint(6 * 7)\n```"])
    t = Runtime(model=model).run(src, "What is 6 * 7?")
    assert t.status == "ok" and t.answer == "42" and t.tool_calls()[0].name == "python"


def test_every_relative_link_in_the_readme_and_docs_resolves_to_a_file():
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in doc_pages()
        for target in relative_links(page)
        if not (page.parent / target).resolve().is_file()
    ]
    assert broken == []


def test_the_link_check_sees_links_across_lines_and_skips_urls(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[the\nlayout](docs/layout.md) ![x](a.png#top) [u](https://x.org/y)\n"
                    "```\n[not](in-code.md)\n```\n")
    assert relative_links(page) == ["docs/layout.md", "a.png"]


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) < 250


def test_the_readme_opens_with_the_two_set_up_commands():
    first_block = FENCE.search(README.read_text())
    assert first_block is not None
    lines = first_block.group(0).splitlines()
    assert any(line.startswith("make demo") for line in lines)
    assert any(line.startswith("make test") for line in lines)
