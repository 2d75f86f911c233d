"""A harness of several files, kept as one string: the bundle.

A harness is one `str` everywhere in whale (its hash keys outcomes, the ledger and the archive
store it, resume compares it, every operator edits it). A folder harness is made into that one
string by giving each file a header line of its own, in the folder's order (the entry first,
then the others sorted by path):

    # === whale file: harness.py ===
    import util

    def run(question, env):
        return util.ask(env, question)
    # === whale file: util.py ===
    def ask(env, question):
        ...

The entry is `harness.py` (ENTRY): it must define `run(question, env)` (the contract, on that
file). The other files are modules it imports by their names: `util.py` is `import util`,
`helpers/x.py` is `from helpers import x` (a folder is a package, with or without its
`__init__.py`). A harness that is one file is its source as it always was, with no header, so
one-file hashes and runs are unchanged; `files_of` reads it as {"harness.py": source}.

What a bundle may hold (BundleError says which rule broke, naming the file):
- file names: relative paths of Python module names (ASCII letters, digits and `_`, not
  starting with a digit) joined by "/", ending in `.py` (`PATH`): no `..`, no absolute path, no
  other kind of file, at most `MAX_DEPTH` parts and `MAX_PATH_CHARS` characters;
- at most `MAX_FILES` files, and `MAX_CHARS` characters in all (the contract's size limit);
- no two files that are one module (`util.py` and `util/__init__.py`, or `util.py` beside a
  folder `util/`), no two names that differ only in case, and `harness.py` among them;
- no line of a file's text may begin with the header's prefix (`HEAD`): such a line is read as
  a header, so a file cannot forge one (a proposer's REPLACE cannot either: Apply refuses it).

Each file's text is kept as it is, except that a final newline is added where it has none.
The worker in the jail reads a bundle with its own few lines (`worker._load_bundle`, standard
library only), after the broker checked it here (`contract.run_contract_fault`).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from whale.errors import WhaleError
from whale.records import replace_dir

ENTRY = "harness.py"
HEAD, TAIL = "# === whale file: ", " ==="
MAX_FILES = 64
MAX_DEPTH = 8
MAX_PATH_CHARS = 200
MAX_ENTRIES = 1000  # files and folders a folder harness's walk visits (hidden ones skipped)
MAX_CHARS = 1_000_000  # the whole harness, one file or a bundle (contract.MAX_SOURCE_CHARS)
PATH = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*/)*[A-Za-z_][A-Za-z0-9_]*\.py")


class BundleError(WhaleError, ValueError):
    """A bundle, a folder or a file name that breaks the rules of the module docstring."""


def is_bundle(source: str) -> bool:
    """Whether `source` is a bundle of files (it begins with a header) rather than one file."""
    return source.startswith(HEAD)


def header(path: str) -> str:
    return f"{HEAD}{path}{TAIL}"


def path_fault(path: object) -> str | None:
    """Why `path` cannot name a file of a harness, or None."""
    if not isinstance(path, str):
        return "a file name must be text"
    if len(path) > MAX_PATH_CHARS:
        return f"a file name is at most {MAX_PATH_CHARS} characters"
    if PATH.fullmatch(path) is None:
        return (
            "a file name is a relative path of Python module names ending in .py, such "
            "as util.py or helpers/text.py: no '..', no absolute path, no other characters"
        )
    if path.count("/") >= MAX_DEPTH:
        return f"a file name has at most {MAX_DEPTH} parts"
    if path == "__init__.py":
        return ("__init__.py at the top would make the folder a package; the harness's files "
                "are top-level modules")  # fmt: skip
    return None


def module_name(path: str) -> tuple[str, bool]:
    """The module a file is imported as, and whether it is a package (`__init__.py`)."""
    name = path[:-3].replace("/", ".")
    if name.endswith(".__init__"):
        return name[: -len(".__init__")], True
    return name, False


def has_header_line(text: str) -> bool:
    """Whether a line of `text` begins with the header's prefix (and would read as one)."""
    return text.startswith(HEAD) or ("\n" + HEAD) in text


def check_files(files: Mapping[str, str]) -> None:
    """BundleError unless `files` (path -> text) can be a harness: the rules above."""
    if len(files) > MAX_FILES:
        raise BundleError(f"{len(files)} files, over the limit of {MAX_FILES}")
    if ENTRY not in files:
        raise BundleError(f"no {ENTRY}: the entry file that defines run(question, env)")
    modules: dict[str, str] = {}
    folded: dict[str, str] = {}
    for path, text in files.items():
        why = path_fault(path)
        if why is not None:
            raise BundleError(f"{str(path)[:MAX_PATH_CHARS]!r}: {why}")
        if not isinstance(text, str):
            raise BundleError(f"{path}: its text is a {type(text).__name__}, not text")
        if has_header_line(text):
            raise BundleError(f"{path}: a line begins with {HEAD.strip()!r}, which marks whale's "
                              "file headers and cannot be part of a file")  # fmt: skip
        other = folded.setdefault(path.lower(), path)
        if other != path:
            raise BundleError(f"{other} and {path} differ only in case")
        name, _ = module_name(path)
        if name in modules:
            raise BundleError(f"{modules[name]} and {path} are both the module {name}")
        modules[name] = path
    for name, path in modules.items():  # a module beside a folder of the same name
        parent = name.rpartition(".")[0]
        while parent:
            clash = modules.get(parent)
            if clash is not None and not clash.endswith("__init__.py"):
                raise BundleError(f"{clash} and {path}: {parent} is both a module and a folder")
            parent = parent.rpartition(".")[0]


def parse(source: str) -> dict[str, str]:
    """A bundle's files (path -> text, in the bundle's order); BundleError if it is none."""
    if not is_bundle(source):
        raise BundleError(f"not a bundle: it does not begin with a line {header('NAME')!r}")
    chunks: dict[str, list[str]] = {}
    lines = source.split("\n")
    if lines[-1] == "":
        lines.pop()  # the "\n" that ends the last line starts no line
    current: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.startswith(HEAD):
            current.append(line)
            continue
        path = line[len(HEAD) : -len(TAIL)] if line.endswith(TAIL) else None
        if path is None or len(line) < len(HEAD) + len(TAIL):
            raise BundleError(f"line {n}: a malformed file header {line[:120]!r}; a header "
                              f"is {header('NAME')!r}")  # fmt: skip
        if path in chunks:
            raise BundleError(f"line {n}: a second file {path[:MAX_PATH_CHARS]!r}")
        if len(chunks) >= MAX_FILES:
            raise BundleError(f"more than {MAX_FILES} files, the limit")
        current = chunks[path] = []
    files = {path: "".join(x + "\n" for x in chunk) for path, chunk in chunks.items()}
    check_files(files)
    return files


def render(files: Mapping[str, str]) -> str:
    """The bundle of `files` (path -> text), in their order; BundleError if they break a
    rule. A text that does not end with a newline gets one."""
    check_files(files)
    parts = []
    for path, text in files.items():
        parts.append(f"{header(path)}\n{text}" + ("\n" if text and not text.endswith("\n") else ""))
    return "".join(parts)


def files_of(source: str) -> dict[str, str]:
    """The files of a harness: a bundle's, or {"harness.py": source} for one file."""
    return parse(source) if is_bundle(source) else {ENTRY: source}


def from_files(files: Mapping[str, str]) -> str:
    """The harness of `files`: one file alone (harness.py) is its text as it is, unchanged;
    several are a bundle. BundleError when they break a rule."""
    if list(files) == [ENTRY]:
        text = files[ENTRY]
        if has_header_line(text):  # it would read back as a bundle
            raise BundleError(f"{ENTRY}: a line begins with {HEAD.strip()!r}, which marks "
                              "whale's file headers and cannot be part of a file")  # fmt: skip
        return text
    return render(files)


def syntax_tree(source: str) -> ast.Module:
    """`source`'s syntax tree, for the static checks (code screens, the audit): of one file,
    `ast.parse(source)`; of a bundle, its files' trees as one module, each node at the line it
    has in the bundle's text (so "line N" points into the harness as a run stores it), the
    entry's statements last (as Python binds `run`: its own, not a helper module's). Raises
    what `ast.parse` raises, and SyntaxError for a bundle that is not valid."""
    if not is_bundle(source):
        return ast.parse(source)
    try:
        files = parse(source)
    except BundleError as e:
        raise SyntaxError(f"not a valid bundle of files: {e}") from None
    body: list[ast.stmt] = []
    entry: list[ast.stmt] = []
    line = 1  # the header of the file at hand
    for path, text in files.items():
        tree = ast.increment_lineno(ast.parse(text, path), line)
        (entry if path == ENTRY else body).extend(tree.body)
        line += 1 + text.count("\n")
    return ast.Module(body=body + entry, type_ignores=[])


def flat_tree(source: str) -> ast.Module:
    """`syntax_tree(source)` with every call of a function of another of its files through
    the module's name (`util.ask(...)`) read as a call by the function's name (`ask(...)`):
    the view in which "what `run` reaches" (the audit's walk, the duplicate screen) crosses
    files. Not covered: two files that define functions of one name (the one later in the
    tree, the entry's last, is the one reached) and calls through other aliases."""
    tree = syntax_tree(source)
    own = own_modules(source)
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)] if own else []
    for node in calls:
        f = node.func
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                and f.value.id in own and f.attr in defs):  # fmt: skip
            node.func = ast.copy_location(ast.Name(f.attr, ast.Load()), f)
    return tree


def own_modules(source: str) -> set[str]:
    """The names of a harness's own modules and folders (`util`, `helpers`, `text` for
    helpers/text.py): what an import of one of its files binds. Empty for one file."""
    try:
        files = parse(source) if is_bundle(source) else {}
    except BundleError:
        return set()
    return {part for p in files for part in module_name(p)[0].split(".")}


def top_modules(source: str) -> set[str]:
    """The names by which `import NAME` loads one of a harness's files: its top-level files and
    folders (`util`, `helpers`), not the names of nested files (`os` of helpers/os.py, which
    `import os` does not reach: that is the standard library's). Empty for one file."""
    try:
        files = parse(source) if is_bundle(source) else {}
    except BundleError:
        return set()
    return {module_name(p)[0].split(".")[0] for p in files}


def read_folder(folder: str | Path) -> str:
    """The harness in `folder`: `harness.py` and every other `.py` file under it, as a bundle
    (or as one file's text, when harness.py is the only one). Hidden entries (a name that
    begins with ".") and `__pycache__` folders are skipped; any other file that is not a `.py`
    file, a symbolic link or anything but a regular file is refused (BundleError naming it),
    and so is a folder past the limits, before more of it is read."""
    root = Path(folder)
    if not root.is_dir():
        raise BundleError(f"{root}: not a folder")
    found: dict[str, str] = {}
    size = seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel = here.relative_to(root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        if prefix.count("/") >= MAX_DEPTH:
            raise BundleError(f"{root}: {prefix} is nested past {MAX_DEPTH} folders")
        for d in dirnames:
            if not d.startswith(".") and (here / d).is_symlink():
                raise BundleError(f"{root}: {prefix}{d} is a symbolic link; not followed")
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        seen += len(dirnames) + len(filenames)
        if seen > MAX_ENTRIES:  # empty folders by the thousand: refused before all are walked
            raise BundleError(f"{root}: more than {MAX_ENTRIES} files and folders, the limit")
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = f"{prefix}{name}"
            mode = os.lstat(here / name).st_mode
            if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
                raise BundleError(f"{root}: {path} is not a regular file (a link, a FIFO, ...)")
            if not name.endswith(".py"):
                raise BundleError(f"{root}: {path} is not a .py file: a harness folder holds "
                                  "Python modules only (they run from memory, with no files "
                                  "beside them); move it out of the folder")  # fmt: skip
            why = path_fault(path)
            if why is not None:
                raise BundleError(f"{root}: {path!r}: {why}")
            if len(found) >= MAX_FILES:
                raise BundleError(f"{root}: more than {MAX_FILES} .py files, the limit")
            size += os.lstat(here / name).st_size
            if size > 4 * MAX_CHARS:  # bytes: no text of MAX_CHARS characters is longer
                raise BundleError(f"{root}: over {MAX_CHARS} characters of source, the limit")
            try:
                text = (here / name).read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise BundleError(f"{root}: {path} is not UTF-8 text ({e.reason})") from None
            # Read as `--harness FILE` reads a file (Path.read_text: universal newlines), and
            # with no newline added (render adds one to a bundle's file): a folder of
            # harness.py alone is that file's harness, hash and all, where a missing final
            # newline or CRLF line ends made it another one (outcomes not reused, resume
            # refused as "edited").
            found[path] = text.replace("\r\n", "\n").replace("\r", "\n")
    if ENTRY not in found:
        raise BundleError(f"{root}: no {ENTRY}, the entry file that defines run(question, env)")
    ordered = {ENTRY: found.pop(ENTRY), **dict(sorted(found.items()))}
    try:
        source = from_files(ordered)
    except BundleError as e:
        raise BundleError(f"{root}: {e}") from None
    if len(source) > MAX_CHARS:
        raise BundleError(f"{root}: {len(source)} characters of source, over the limit of "
                          f"{MAX_CHARS}")  # fmt: skip
    return source


def write_folder(source: str, dest: str | Path) -> Path:
    """Write the harness `source` (a bundle or one file) as a folder at `dest`, whole: into a
    new hidden folder beside it, then renamed into place (a folder already at `dest` is
    replaced; a link there is refused, never written through). Every name is checked
    (`parse`) before anything is written, so nothing lands outside `dest`."""
    files = files_of(source)
    check_files(files)
    dest = Path(dest)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise BundleError(f"{dest}: not a folder (a link or a file); not written")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for path, text in files.items():
            target = tmp.joinpath(*path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with open(os.open(target, flags, 0o644), "wb") as f:
                f.write(text.encode("utf-8"))
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
