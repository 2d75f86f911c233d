"""A scriptable OpenAI-compatible HTTP server on 127.0.0.1, for tests and benchmarks.

Each request takes the next behaviour from `script` (the last one repeats): ("ok", text),
("tool", name, arguments) a function call,
("status", code, message), ("sleep", seconds, text), ("close",) which drops the connection,
("json", value) a 200 whose body is that JSON value, whatever it is.
A request with `return_token_ids` gets made-up ids back, where vLLM puts them. A request with
`n` > 1 gets n choices, "TEXT#i"; with `n_probs`, each choice i gets i + 1 token logprobs (as
llama-server sends them).
`/v1/load_lora_adapter` and `/v1/unload_lora_adapter` act like vLLM's runtime LoRA endpoints
(200 with a text body; 400 for a name already loaded, 404 for one not loaded), keep `loras`
(name -> path) and record each call in `lora_requests` as (endpoint, body); they take no
script step.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubServer:
    def __init__(self, script: list[tuple[Any, ...]] | None = None, delay_s: float = 0.0) -> None:
        self.script = script or [("ok", "hello")]
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.gets = 0  # GET requests (a fleet's probes of /models)
        self.lora_requests: list[tuple[str, dict[str, Any]]] = []
        self.loras: dict[str, str] = {}
        # POST requests being handled now, the most at once, and each one's (start, end) in
        # time.monotonic() seconds: what a load balancer in front of several stubs sent.
        self.in_flight = 0
        self.max_in_flight = 0
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Without this, headers and body leave in two packets and Nagle + delayed ACK
                # add ~40 ms to every reply.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                with outer._lock:
                    outer.gets += 1
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})

            def do_POST(self) -> None:
                start = time.monotonic()
                with outer._lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    self._post()
                finally:
                    with outer._lock:
                        outer.in_flight -= 1
                        outer.spans.append((start, time.monotonic()))

            def _post(self) -> None:
                body = json.loads(
                    self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"
                )
                if self.path.rstrip("/") in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                    self._lora(self.path.rstrip("/").rsplit("/", 1)[-1], body)
                    return
                with outer._lock:
                    outer.requests.append(body)
                    step = outer.script[min(len(outer.requests) - 1, len(outer.script) - 1)]
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                kind = step[0]
                if kind == "close":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if kind == "status":
                    self._send(step[1], {"error": {"message": step[2], "type": "error"}})
                    return
                if kind == "json":
                    self._send(200, step[1])
                    return
                if kind == "sleep":
                    time.sleep(step[1])
                if kind == "tool":  # ("tool", name, arguments dict): an OpenAI function call
                    call = {"id": "call_1", "type": "function",
                            "function": {"name": step[1], "arguments": json.dumps(step[2])}}
                    self._send(200, {
                        "id": "x", "object": "chat.completion", "created": 0,
                        "model": body.get("model"),
                        "choices": [{"index": 0, "finish_reason": "tool_calls",
                                     "message": {"role": "assistant", "content": None,
                                                 "tool_calls": [call]}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                    })  # fmt: skip
                    return
                text = step[-1]
                reply = {
                    "id": "x", "object": "chat.completion", "created": 0,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                }  # fmt: skip
                n = body.get("n") or 1
                if n > 1:  # as llama-server answers `n`: choice i is "TEXT#i", i + 1 tokens
                    reply["choices"] = [
                        {"index": i, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"{text}#{i}"}}
                        for i in range(n)
                    ]  # fmt: skip
                if body.get("n_probs"):  # llama-server's per-token logprobs, one per token
                    for i, choice in enumerate(reply["choices"]):
                        token = {"id": 1, "token": "x", "bytes": [120], "prob": 1.0,
                                 "top_probs": []}  # fmt: skip
                        choice["logprobs"] = {"content": [token] * (i + 1)}
                if body.get("return_token_ids"):  # vLLM's sampled ids, made up here
                    reply["prompt_token_ids"] = [7, 8, 9]
                    reply["choices"][0]["token_ids"] = [41, 42]
                self._send(200, reply)

            def _lora(self, endpoint: str, body: dict[str, Any]) -> None:
                name = str(body.get("lora_name"))
                with outer._lock:
                    outer.lora_requests.append((endpoint, body))
                    if endpoint == "load_lora_adapter" and name in outer.loras:
                        code, msg = 400, f"The lora adapter '{name}' has already been loaded."
                    elif endpoint == "unload_lora_adapter" and name not in outer.loras:
                        code, msg = 404, f"The lora adapter '{name}' cannot be found."
                    elif endpoint == "load_lora_adapter":
                        outer.loras[name] = str(body.get("lora_path"))
                        code, msg = 200, f"Success: LoRA adapter '{name}' added successfully."
                    else:
                        del outer.loras[name]
                        code, msg = 200, f"Success: LoRA adapter '{name}' removed successfully."
                if code != 200:
                    self._send(code, {"object": "error", "message": msg, "code": code})
                    return
                data = msg.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.errors: list[str] = []  # what a handler raised (a client gone mid-reply, ...)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # Kept, not printed: socketserver prints to sys.stderr, which a CLI test's
                # runner captures into the command's output (a load-dependent reset then broke
                # `--json` parsing of `whale search`'s last line in a full suite).
                import traceback

                outer.errors.append(traceback.format_exc())

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 128
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_in_subprocess(text: str, delay_s: float) -> tuple[Any, str]:
    """Start a fixed-latency chat server in its own process; returns (Popen, base_url). It is
    asyncio, not http.server, so that the server's own CPU (on the same 2 cores as what is
    measured) stays small. The caller terminates the Popen."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers", text, str(delay_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def _fast_server(text: str, delay_s: float) -> None:
    import asyncio

    body = json.dumps({
        "id": "x", "object": "chat.completion", "created": 0, "model": "stub",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }).encode()  # fmt: skip
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip

    async def handle(reader: Any, writer: Any) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    import asyncio
    import sys

    asyncio.run(_fast_server(sys.argv[1], float(sys.argv[2])))
