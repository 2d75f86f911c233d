"""The program that runs inside the jail: loads one harness and calls `run(question, env)`.

Standard library only, and imported by nothing inside the jail but itself (it runs with
`python -I -S`). Every `env` call is a request over a pipe to the broker in the parent, which
enforces the budget, makes the call and records it; this side keeps no record that counts.

Wire format: 4-byte big-endian length, then the payload. Worker to parent: JSON (the parent
decodes untrusted bytes only with `json`). Parent to worker: `marshal` (trusted, and it needs
no import: `json` pulls in `re`, which slows every run's start-up; docs/measurements.md).
For the same reason it uses `posix`, not `os` (with -S nothing has imported os, which pulls in
posixpath, stat and _collections_abc: 0.9 ms of every run's CPU), and int.to_bytes, not
`struct`; a harness that imports them pays for them itself.
"""

from __future__ import annotations

import _json
import _thread
import marshal
import posix
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs start-up time
if TYPE_CHECKING:
    from typing import Any

# One request and its reply at a time on the run's pipe: the endpoint's threads share it.
_PIPE = _thread.allocate_lock()


def dumps(obj: Any) -> str:
    """JSON for plain data, without importing `json`; anything else is sent as its str()."""
    if isinstance(obj, str):
        return _json.encode_basestring_ascii(obj)  # type: ignore[no-any-return]
    if obj is None or obj is True or obj is False:
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, int | float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            # Sent as JSON's NaN/Infinity, which the broker refuses with a clear error (not
            # a silent null that would stand for "use the default").
            return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
        return repr(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(dumps(str(k)) + ":" + dumps(v) for k, v in obj.items()) + "}"
    if isinstance(obj, list | tuple):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return dumps(str(obj))


def _write(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        n = posix.write(fd, view)
        view = view[n:]


def send(fd: int, obj: Any) -> None:
    """Worker to parent."""
    _write(fd, dumps(obj).encode("ascii"))


def recv(fd: int) -> Any:
    """Worker side: read one frame from the parent."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    return marshal.loads(_read_exact(fd, size))


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = posix.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("broker closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# --- what the harness sees ------------------------------------------------------------------


class BudgetExceeded(BaseException):
    """Raised by env calls once a budget is spent. A BaseException so that a harness's broad
    `except Exception` does not swallow it; the run is recorded as budget_exceeded either way."""


class ToolError(Exception):
    """A brokered call failed (model error, timeout, bad arguments). `kind`: what the broker
    said went wrong ("invalid", "model", "timeout"), "" where it did not say."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


class Reply(str):
    """A model reply: usable as the text itself, with `.text` and `.finish_reason`.

    `.tool_calls`: the functions the model called (when `env.llm` offered `tools=`), each a
    dict {"id", "name", "arguments"}, arguments a dict when the model wrote a JSON object,
    else the text it wrote (check with isinstance); [] when it called none (finish_reason is
    then usually not "tool_calls"). `.message`: this reply as the assistant message to append
    to the conversation before the `{"role": "tool", "tool_call_id": id, "content": result}`
    messages that answer its calls."""

    text: str
    finish_reason: str
    tool_calls: list[dict[str, Any]]
    message: dict[str, Any]

    def __new__(
        cls,
        text: str,
        finish_reason: str,
        tool_calls: list[dict[str, Any]] | None = None,
        message: dict[str, Any] | None = None,
    ) -> Reply:
        obj = super().__new__(cls, text)
        obj.text = text
        obj.finish_reason = finish_reason
        obj.tool_calls = list(tool_calls or [])
        obj.message = message if message is not None else {"role": "assistant", "content": text}
        return obj


class PythonResult(str):
    """Result of `env.tools.python`: the text is stdout (then stderr and any exception)."""

    stdout: str
    stderr: str
    error: str | None
    timed_out: bool

    def __new__(cls, d: dict[str, Any]) -> PythonResult:
        parts = [d.get("stdout", "")]
        if d.get("stderr"):
            parts.append(d["stderr"])
        if d.get("error"):
            parts.append(d["error"])
        obj = super().__new__(cls, "\n".join(p for p in parts if p))
        obj.stdout = d.get("stdout", "")
        obj.stderr = d.get("stderr", "")
        obj.error = d.get("error")
        obj.timed_out = bool(d.get("timed_out"))
        return obj


class Budget:
    """What is left of this run's budget, as last reported by the broker (read-only)."""

    def __init__(self, left: dict[str, Any]) -> None:
        self._left = dict(left)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._left[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"Budget({self._left})"


class _Link:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.budget = Budget({})

    def call(self, op: str, **args: Any) -> Any:
        with _PIPE:
            send(self.wfd, {"op": op, "args": args})
            reply = recv(self.rfd)
        self.budget = Budget(reply.get("budget", {}))
        if reply.get("ok"):
            return reply["result"]
        if reply.get("budget_exceeded"):
            raise BudgetExceeded(reply["error"])
        raise ToolError(reply["error"], str(reply.get("kind") or ""))


class _Tool:
    """A user or MCP tool: `env.tools.NAME(...)` or `env.tools.SERVER.TOOL(...)`. Positional
    arguments are named by the tool's parameter order; the broker checks the rest."""

    def __init__(self, link: _Link, name: str, params: list[str]) -> None:
        self._link, self._name, self._params = link, name, params

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self._params):
            raise ToolError(f"{self._name}() takes {len(self._params)} positional arguments "
                            f"({len(args)} given)")  # fmt: skip
        for p, v in zip(self._params, args, strict=False):
            if p in kwargs:
                raise ToolError(f"{self._name}() got two values for argument {p!r}")
            kwargs[p] = v
        return self._link.call("tool", name=self._name, kwargs=kwargs)

    def __repr__(self) -> str:
        return f"<tool {self._name}>"


class _Server:
    """An MCP server's tools: `env.tools.SERVER.TOOL(...)`."""

    def __init__(self, link: _Link, name: str, tools: dict[str, list[str]]) -> None:
        self._link, self._name, self._tools = link, name, tools

    def __getattr__(self, attr: str) -> _Tool:
        if attr.startswith("__") or attr not in self._tools:
            raise AttributeError(f"MCP server {self._name} has no tool {attr!r} (tools: "
                                 f"{', '.join(self._tools)})")  # fmt: skip
        return _Tool(self._link, f"{self._name}.{attr}", self._tools[attr])

    def __dir__(self) -> list[str]:
        return list(self._tools)


class Tools:
    def __init__(self, link: _Link, names: list[str],
                 params: dict[str, list[str]] | None = None) -> None:  # fmt: skip
        self._link = link
        self._names = names
        self._params = params or {}

    def python(self, code: str, timeout: float | None = None) -> PythonResult:
        return PythonResult(self._link.call("python", code=code, timeout=timeout))

    def retrieve(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        if "retrieve" not in self._names:
            raise ToolError("this task provides no retriever")
        return list(self._link.call("retrieve", query=query, k=k))

    def __getattr__(self, name: str) -> Any:
        """A user tool (`_Tool`), or an MCP server (`_Server`), as the broker declared them."""
        if not name.startswith("__"):
            if name in self._params and "." not in name:
                return _Tool(self._link, name, self._params[name])
            prefix = name + "."
            tools = {n[len(prefix) :]: p for n, p in self._params.items() if n.startswith(prefix)}
            if tools:
                return _Server(self._link, name, tools)
        raise AttributeError(f"env.tools has no {name!r} (tools: {', '.join(dir(self))})")

    def __dir__(self) -> list[str]:
        return list(dict.fromkeys(n.split(".")[0] for n in self._names))


class Env:
    def __init__(self, link: _Link, tools: list[str],
                 params: dict[str, list[str]] | None = None,
                 openai_base_url: str | None = None) -> None:  # fmt: skip
        self._link = link
        self.tools = Tools(link, tools, params)
        # The run's OpenAI-compatible endpoint (endpoint.py), as in $OPENAI_BASE_URL; None
        # where the jail has no loopback to serve it on.
        self.openai_base_url = openai_base_url

    @property
    def budget(self) -> Budget:
        return self._link.budget

    def llm(
        self,
        messages: Any,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: Any = None,
        tools: Any = None,
        tool_choice: str | None = None,
    ) -> Reply:
        """`tools`: OpenAI function schemas ({"type": "function", "function": {"name",
        "description", "parameters"}}) the model may call; `tool_choice`: "auto" (the
        default), "none" or "required". The reply's calls are in `.tool_calls`."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        args = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                "stop": stop}  # fmt: skip
        if tools is not None:  # only when given: a request without them stays as it was
            args["tools"] = tools
        if tool_choice is not None:
            args["tool_choice"] = tool_choice
        r = self._link.call("llm", **args)
        return Reply(r["text"], r["finish_reason"], r.get("tool_calls"), r.get("message"))


# --- main -----------------------------------------------------------------------------------


def _load(source: str) -> Any:
    if source.startswith(_BUNDLE_HEAD):
        return _load_bundle(source)
    code = compile(source, "harness.py", "exec")
    namespace: dict[str, Any] = {"__name__": "harness"}
    exec(code, namespace)
    # The broker checked the contract (whale/harness/contract.py) on the source before this
    # worker started; this catches only a module that rebinds run at run time.
    run = namespace.get("run")
    if not callable(run):
        raise TypeError("harness defines no callable run(question, env)")
    return run


# whale.harness.bundle.HEAD and TAIL (this file imports nothing of whale; a test keeps them equal)
_BUNDLE_HEAD, _BUNDLE_TAIL = "# === whale file: ", " ==="


def _load_bundle(source: str) -> Any:
    """A harness of several files (whale/harness/bundle.py; the broker checked its form and
    its names before this worker started): each file is a module importable by its name,
    served from memory (nothing is written), and the entry, harness.py, is imported as the
    module `harness`. Tracebacks name the file ("util.py", line 3) and show its lines."""
    files: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in source.split("\n"):
        if line.startswith(_BUNDLE_HEAD):
            lines = files[line[len(_BUNDLE_HEAD) : -len(_BUNDLE_TAIL)]] = []
        else:
            lines.append(line)
    modules: dict[str, tuple[str, str, bool]] = {}  # name -> (file, text, is a package)
    for path, body in files.items():
        name = path[:-3].replace("/", ".")
        package = name.endswith(".__init__")
        name = name.removesuffix(".__init__")
        modules[name] = (path, "\n".join(body), package)
        parent = name.rpartition(".")[0]
        while parent:  # a folder without __init__.py is a package all the same
            modules.setdefault(parent, (parent.replace(".", "/") + "/__init__.py", "", True))
            parent = parent.rpartition(".")[0]
    # Loaded now, not on the finder's first call: a bundle's importlib/ folder would be found
    # by the finder while it imports this (a RecursionError), and is refused below instead.
    import importlib.machinery  # noqa: F401

    # And the modules a one-file run does without (see the top): a bundle's os.py is refused
    # below, as it was while every run loaded os, rather than shadowing the standard library's.
    import os  # noqa: F401
    import struct  # noqa: F401

    for name, (path, _, _) in modules.items():
        # A module loaded before the harness (os, sys, _socket, ...: the worker's and the
        # interpreter's) is never imported from the bundle: `import os` beside an os.py was
        # the real os, which the code screens took for the harness's own file.
        if name in sys.modules:
            raise ImportError(f"{path}: the module {name} is loaded before the harness (the "
                              "standard library's), so this file would never be imported; "
                              "rename it")  # fmt: skip
    sys.meta_path.insert(0, _Files(modules))  # first, as a script's own folder is
    run = getattr(__import__("harness"), "run", None)
    if not callable(run):
        raise TypeError("harness defines no callable run(question, env)")
    return run


class _Files:
    """The import system's finder and loader for a bundle's modules (no importlib.abc: the
    protocol is these four methods)."""

    def __init__(self, modules: dict[str, tuple[str, str, bool]]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.modules:
            return None
        from importlib.machinery import ModuleSpec

        spec = ModuleSpec(name, self, origin=self.modules[name][0],  # type: ignore[arg-type]
                          is_package=self.modules[name][2])  # fmt: skip
        spec.has_location = True  # __file__ is the file's name in the bundle
        return spec

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        path, text, _ = self.modules[module.__spec__.name]
        exec(compile(text, path, "exec"), module.__dict__)

    def get_source(self, name: str) -> str:
        return self.modules[name][1]  # what tracebacks show (linecache asks the loader)


def _endpoint_code(path: str) -> dict[str, Any] | None:
    """endpoint.py's namespace, from its compiled file (the jail has no whale to import), and
    its socket listening: made before the run's question comes, so that a warm worker pays
    for it ahead of need. None where either cannot be had."""
    try:
        with open(path, "rb") as f:
            code = marshal.loads(f.read()[16:])  # past the .pyc header
        namespace: dict[str, Any] = {"__name__": "whale_endpoint"}
        exec(code, namespace)
    except Exception:  # noqa: BLE001 - the run goes on without an endpoint
        return None
    sock = namespace["listen"]()
    if sock is None:
        return None
    namespace["sock"] = sock
    return namespace


def _start_endpoint(ns: dict[str, Any], link: _Link, spec: dict[str, Any]) -> str:
    """Serve the endpoint on its thread; its base URL, also put in the run's environment."""

    def call(args: dict[str, Any]) -> Any:
        try:
            return link.call("llm", **args)
        except BudgetExceeded as e:
            raise ns["Refusal"]("budget", str(e)) from None
        except ToolError as e:
            raise ns["Refusal"](e.kind or "invalid", str(e)) from None

    endpoint = ns["Endpoint"](ns["sock"], call, spec["key"], spec["model"], spec["body_bytes"])
    endpoint.start()
    url = f"http://127.0.0.1:{ns['sock'].getsockname()[1]}/v1"
    _setenv("OPENAI_BASE_URL", url)
    _setenv("OPENAI_API_KEY", spec["key"])
    return url


def _setenv(key: str, value: str) -> None:
    """os.environ[key] = value without importing os (os.environ, once the harness imports os,
    is a view of posix.environ; putenv is what child processes see)."""
    k, v = key.encode(), value.encode()
    posix.putenv(k, v)
    posix.environ[k] = v


def main() -> None:
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 4:  # runtime.packages: their read-only folder, after the stdlib
        import site  # only then: a run without packages does not pay for it

        site.addsitedir(sys.argv[4])  # on sys.path, with its .pth files run as site does
    endpoint = _endpoint_code(sys.argv[3]) if len(sys.argv) > 3 else None
    init = recv(rfd)
    link = _Link(rfd, wfd)
    link.budget = Budget(init.get("budget", {}))
    url = None
    if endpoint is not None and init.get("endpoint"):
        url = _start_endpoint(endpoint, link, init["endpoint"])
    elif endpoint is not None:  # no model: the run has no endpoint, and holds no socket
        endpoint["sock"].close()
    try:
        run = _load(init["source"])
    except BaseException as e:  # noqa: BLE001 - every failure is data
        # "failure": the broker's Failure.LOAD (this file imports nothing of whale)
        _done(wfd, {"op": "done", "status": "error", "failure": "load",
                    "error": f"load: {_describe(e)}"})  # fmt: skip
        return
    try:
        env = Env(link, init.get("tools", []), init.get("tool_params"), url)
        answer = run(init["question"], env)
    except BudgetExceeded as e:
        _done(wfd, {"op": "done", "status": "budget_exceeded", "error": f"harness: {e}"})
        return
    except BaseException as e:  # noqa: BLE001
        _done(wfd, {"op": "done", "status": "error", "error": f"harness: {_describe(e)}"})
        return
    if not isinstance(answer, str):
        _done(
            wfd,
            {
                "op": "done",
                "status": "error",
                "error": f"harness: run() returned {type(answer).__name__}, expected str",
            },
        )
        return
    _done(wfd, {"op": "done", "status": "ok", "answer": str(answer)})


def _done(wfd: int, msg: dict[str, Any]) -> None:
    """Flush what the harness printed (a pipe is block-buffered) before the broker, on reading
    this message, ends the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream loses only its tail
            pass
    # Not inside an endpoint thread's request and reply (two frames must not interleave);
    # the lock is taken for good: nothing is sent after `done`.
    _PIPE.acquire()
    send(wfd, msg)


def _describe(e: BaseException) -> str:
    import traceback  # only on failure: it costs start-up time

    tb = traceback.format_exception(type(e), e, e.__traceback__)
    text = "".join(tb[-6:])
    return text[-3000:]


if __name__ == "__main__":
    main()
    # `done` is sent and the output flushed; the broker ends the jail on reading it. Skip the
    # interpreter's teardown (a full collection, every object freed: about 0.5 ms of CPU).
    posix._exit(0)
