"""A tiny OpenAI-compatible server in its own process, on a port the caller chooses, so that a
test can SIGKILL it mid-batch and start it again on the same port (tests/models/test_fleet.py).

`python -m tests.fleet_server PORT DELAY_S` answers `GET /v1/models` and every chat request
after DELAY_S seconds with the text `port PORT`, and prints its base URL once it listens.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve(port: int, delay_s: float) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": "stub", "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            time.sleep(delay_s)
            self._send({
                "id": "x", "object": "chat.completion", "created": 0, "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"port {port}"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            })  # fmt: skip

        def _send(self, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # allow_reuse_address is on
    httpd.daemon_threads = True
    httpd.request_queue_size = 128
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
