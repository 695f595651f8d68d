"""An OpenAI-compatible HTTP server over one Engine, so chat apps and OpenAI SDKs run on edge unchanged.

    server = make_server(Engine(), port=8000)       # edge-serve [MODEL] --port 8000
    server.serve_forever()

Endpoints: GET /v1/models, POST /v1/chat/completions and POST /v1/completions (with "stream": true, server-sent
events as OpenAI sends them), GET /health, and GET /, a chat page for the browser (edge/chat.html). Errors come back
in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with a message that says what to change.

One model and one KV cache, so requests take turns (a lock): a chat app resends the whole conversation each turn,
and the engine then feeds only the new messages (Engine.chat's prefix reuse), which holds only while one
conversation has the cache at a time. A client that disconnects mid-stream stops its generation at the next piece;
the engine's cache is left exactly at the tokens it emitted. The standard library's threading server is enough
for that: a thread per connection, the lock serialising the model.
"""

from __future__ import annotations

import functools
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from edge.engine import Engine, GenerationConfig
from edge.errors import ContextOverflowError, EdgeError

MAX_BODY = 8 << 20  # bytes of a request body; a long conversation is a few hundred KB
ROLES = ("system", "user", "assistant", "tool", "developer")
# Fields that change what OpenAI would return and that edge does not implement: refused rather than ignored.
UNSUPPORTED = ("logprobs", "top_logprobs", "logit_bias", "tools", "functions", "echo", "suffix", "best_of")
PENALTIES = ("presence_penalty", "frequency_penalty")  # accepted at 0, OpenAI's default
PUBLIC = ("", "/health")  # no API key needed: the chat page (it asks for the key) and the liveness check


class APIError(Exception):
    """An error reply: HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _number(body: dict, name: str, kind: type, default: Any, low: float, high: float | None = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise APIError(400, f"'{name}' must be {'a number' if kind is float else 'an integer'}, got {value!r}", name)
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise APIError(400, f"'{name}' must be {bounds}, got {value!r}", name)
    return kind(value)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError(400, "'stop' must be a non-empty string or a list of them", "stop")
    return tuple(stops)


def generation_config(body: dict, context: int, on_full: str = "error") -> GenerationConfig:
    """The sampling fields OpenAI defines (temperature defaults to 1 as there), plus top_k as llama.cpp's server
    takes it. No max_tokens: generate until the model stops or the context is full."""
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], {}):
            raise APIError(400, f"'{name}' is not supported by edge; leave it out", name)
    for name in PENALTIES:
        if body.get(name) not in (None, 0, 0.0):
            raise APIError(400, f"'{name}' is not supported by edge; leave it out or send 0", name)
    if body.get("n", 1) != 1:
        raise APIError(400, "'n' must be 1: edge generates one choice per request", "n")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise APIError(400, "only response_format {\"type\": \"text\"} is supported", "response_format")
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    temperature = _number(body, "temperature", float, 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", float, 1.0, 0.0, 1.0)
    return GenerationConfig(
        max_tokens=_number(body, limit, int, context, 1),
        temperature=temperature if top_p > 0 else 0.0,  # a nucleus of probability 0 keeps only the top token
        top_p=top_p or 1.0,
        top_k=_number(body, "top_k", int, 0, 0),
        seed=_number(body, "seed", int, None, 0),
        stop=_stop(body), on_full=on_full)


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts of which edge reads the text ones."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise APIError(400, f"{where}: only text content parts are supported (no images or audio)", "messages")
        return "".join(p["text"] for p in content)
    raise APIError(400, f"{where}: 'content' must be a string or a list of text parts", "messages")


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise APIError(400, f"messages[{i}] needs a 'role', one of {', '.join(ROLES)}", "messages")
        role = "system" if m["role"] == "developer" else m["role"]  # OpenAI's newer name for the system message
        out.append({"role": role, "content": _text(m.get("content", ""), f"messages[{i}]")})
    return out


def completion_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise APIError(400, "'prompt' must be a non-empty string (one prompt per request)", "prompt")
    return prompt


class Service:
    """The engine behind the server, shared by its request threads: one generation at a time."""

    def __init__(self, engine: Engine, model_id: str, api_key: str | None = None, on_full: str = "error",
                 allow_origins: tuple[str, ...] = ()):
        """on_full: a conversation longer than the context is refused ("error", OpenAI's behaviour) or its oldest
        turns are left out ("slide", Engine.chat). allow_origins: web pages (origins, or "*" for any) whose scripts
        may call the API from a browser (CORS); none by default, so a page on the web cannot use a local model."""
        self.engine, self.model_id, self.api_key, self.on_full = engine, model_id, api_key, on_full
        self.allow_origins = tuple(allow_origins)
        self.lock = threading.Lock()
        self.created = int(time.time())

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": self.created,
                                            "owned_by": "edge"}]}

    def start(self, chat: bool, body: dict) -> Reply:
        """The reply's pieces; the first is computed here, so a prompt the engine refuses is an error reply and not
        a broken stream. Call with the lock held, and close the iterator when done."""
        config = generation_config(body, self.engine.context_length, self.on_full)
        pieces = (self.engine.chat(chat_messages(body), config) if chat
                  else self.engine.stream(completion_prompt(body), config))
        try:
            first = next(pieces, "")
        except ContextOverflowError as e:
            raise APIError(400, str(e), "messages" if chat else "prompt", "context_length_exceeded") from e
        except EdgeError as e:
            raise APIError(400, str(e)) from e
        return Reply(first, pieces)

    def usage(self) -> dict:
        """OpenAI's counts (cached_tokens: the prompt's prefix reused from the cache), plus edge's own speeds and,
        when drafting, the speculative statistics under "edge"."""
        s = self.engine.stats
        own = {"prompt_tokens_per_second": round(s.prompt_tokens_per_second, 1),
               "tokens_per_second": round(s.generate_tokens_per_second, 1)}
        if s.speculative is not None:
            own["speculative"] = {k: v for k, v in s.speculative.as_dict().items() if k != "by_drafter"}
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated_tokens,
                "total_tokens": s.prompt_tokens + s.generated_tokens,
                "prompt_tokens_details": {"cached_tokens": s.reused_tokens}, "edge": own}

    def finish_reason(self) -> str:
        return "length" if self.engine.stats.finish_reason in ("length", "context") else "stop"


class Reply:
    """The pieces of a reply whose first piece is already computed. close() ends the engine's generation even when
    the reply was never iterated (a client gone before the headers went out): left to the garbage collector, the
    engine's loop would cut its cache back at some later moment, perhaps in the middle of another request."""

    def __init__(self, first: str, rest: Iterator[str]):
        self.first, self.rest = first, rest

    def __iter__(self) -> Iterator[str]:
        if self.first:
            yield self.first
        yield from self.rest

    def close(self) -> None:
        self.rest.close()  # the engine's loop cuts its cache back to what was emitted


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for JSON replies; streams are chunked
    server_version = "edge"
    # Seconds a read or write on the connection may block: a client that stops reading its stream would otherwise
    # hold the model (the lock) for good once the socket's buffers are full.
    timeout = 60
    service: Service  # set by make_server on a subclass

    def do_GET(self) -> None:
        self._handle(self._get)

    def do_POST(self) -> None:
        self._handle(self._post)

    def do_OPTIONS(self) -> None:
        """A browser's preflight: the allowed methods and headers (the origin header comes with end_headers)."""
        self.send_response(204)
        if self._allowed_origin():
            self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
            self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def end_headers(self) -> None:
        origin = self._allowed_origin()
        if origin:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def _allowed_origin(self) -> str | None:
        headers = getattr(self, "headers", None)  # None when the request line itself was refused
        allowed, origin = self.service.allow_origins, headers.get("Origin") if headers else None
        if "*" in allowed:
            return "*"
        return origin if origin in allowed else None

    def _handle(self, route) -> None:
        try:
            if self._route() not in PUBLIC:
                self._authorise()
            route()
        except APIError as e:
            self._json(e.status, e.body())
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client left or stopped reading; nothing to answer
        except Exception as e:  # a bug: answer 500 rather than drop the connection, and log it
            self.log_error("internal error: %r", e)
            self._json(500, APIError(500, f"internal error: {e}", kind="server_error").body())

    def _authorise(self) -> None:
        key = self.service.api_key
        sent = self.headers.get("Authorization", "").encode()
        if key is not None and not hmac.compare_digest(sent, f"Bearer {key}".encode()):  # no timing side channel
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", code="invalid_api_key",
                           kind="authentication_error")

    def _route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def _get(self) -> None:
        path = self._route()
        if path == "/v1/models":
            return self._json(200, self.service.models())
        if path == "/health":
            return self._json(200, {"status": "ok"})
        if path == "":
            return self._send(200, "text/html; charset=utf-8", chat_page())
        raise APIError(404, f"no such endpoint: GET {self.path}", code="not_found")

    def _post(self) -> None:
        path = self._route()
        if path not in ("/v1/chat/completions", "/v1/completions"):
            raise APIError(404, f"no such endpoint: POST {self.path}", code="not_found")
        body = self._body()
        chat = path == "/v1/chat/completions"
        with self.service.lock:
            pieces = self.service.start(chat, body)
            try:
                if body.get("stream"):
                    self._stream(chat, pieces, bool((body.get("stream_options") or {}).get("include_usage")))
                else:
                    text = "".join(pieces)
                    self._json(200, self._completion(chat, text))
            finally:
                pieces.close()

    def _body(self) -> dict:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise APIError(411, "send the request body with a Content-Length, not chunked")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise APIError(411, "the request needs a Content-Length header") from None
        if length > MAX_BODY:
            self.close_connection = True  # the unread body would be taken for the next request
            raise APIError(413, f"the request body has {length} bytes; the limit is {MAX_BODY}")
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return body

    def _completion(self, chat: bool, text: str) -> dict:
        s = self.service
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text, "logprobs": None})
        return {"id": _id(chat), "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": s.model_id,
                "choices": [choice | {"finish_reason": s.finish_reason()}], "usage": s.usage()}

    def _stream(self, chat: bool, pieces: Reply, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        s, head = self.service, {"id": _id(chat), "object": "chat.completion.chunk" if chat else "text_completion",
                                 "created": int(time.time()), "model": self.service.model_id}

        def choice(piece: str | None, finish: str | None = None) -> dict:
            part = ({"delta": {} if piece is None else {"content": piece}} if chat else {"text": piece or ""})
            return head | {"choices": [{"index": 0, **part, "finish_reason": finish}]}

        if chat:
            self._event(head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]})
        try:
            for piece in pieces:
                self._event(choice(piece))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            raise
        except Exception as e:  # the status line is sent: say it in the stream, then end it
            self.log_error("internal error mid-stream: %r", e)
            self._event(APIError(500, f"internal error: {e}", kind="server_error").body())
            self._chunk(b"")
            self.close_connection = True
            return
        self._event(choice(None, s.finish_reason()))
        if include_usage:
            self._event(head | {"choices": [], "usage": s.usage()})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, data: dict) -> None:
        self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, data: dict) -> None:
        self._send(status, "application/json", json.dumps(data).encode())

    def _send(self, status: int, kind: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@functools.cache
def chat_page() -> bytes:
    """The browser chat app (edge/chat.html): a page that talks to this server's own API."""
    return resources.files("edge").joinpath("chat.html").read_bytes()


def _id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def make_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000, model_id: str | None = None,
                api_key: str | None = None, on_full: str = "error",
                allow_origins: tuple[str, ...] = ()) -> ThreadingHTTPServer:
    """A server bound to host:port (port 0: any free one, see server.server_address), not yet serving."""
    service = Service(engine, model_id or engine.package.root.name, api_key, on_full, allow_origins)
    handler = type("EdgeHandler", (Handler,), {"service": service})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as e:  # the port is taken, or the address is not this machine's
        raise EdgeError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port or --host") from e
    server.daemon_threads = True
    return server
