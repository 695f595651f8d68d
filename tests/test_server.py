"""The OpenAI-compatible server: replies equal the engine's own, streams add up to them, bad requests get OpenAI's
error shape with a message, and a client that leaves mid-stream leaves the engine as if it had stopped there."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from edge.apps.serve import is_loopback, parser
from edge.engine import Engine, GenerationConfig
from edge.errors import EdgeError
from edge.export.pipeline import export_model
from edge.server import MAX_BODY, Reply, make_server
from tiny_models import tiny_chat_llama

MESSAGES = [{"role": "user", "content": "t5 t6 t7"}]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return export_model("tiny", tmp_path_factory.mktemp("s") / "pkg", quant="fp32", model=tiny_chat_llama())


@pytest.fixture(scope="module")
def reference(package):
    """A second engine on the same package: what the server's replies must equal."""
    return Engine(package, context_length=64, threads=1)


@pytest.fixture(scope="module")
def server(package):
    with serving(Engine(package, context_length=64, threads=1), model_id="tiny") as srv:
        yield srv


@contextlib.contextmanager
def serving(engine, **options):
    """A server on a free port, serving from a thread until the block ends."""
    srv = make_server(engine, port=0, **options)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def request(server, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def post(server, path: str, body: dict, **kw):
    status, data = request(server, "POST", path, body, **kw)
    return status, json.loads(data)


def events(data: bytes) -> list:
    """The server-sent events of a stream, [DONE] included, in order."""
    out = []
    for block in data.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def expected(reference, n: int, messages=MESSAGES) -> str:
    reference.reset()
    return "".join(reference.chat(messages, GenerationConfig(max_tokens=n)))


def test_lists_its_model(server):
    status, body = request(server, "GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["tiny"]


def test_chat_completion_equals_the_engines_reply(server, reference):
    status, body = post(server, "/v1/chat/completions", {"messages": MESSAGES, "temperature": 0, "max_tokens": 9})
    assert status == 200
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": expected(reference, 9)}
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 9
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 9
    assert body["usage"]["edge"]["tokens_per_second"] > 0 and "speculative" not in body["usage"]["edge"]


def test_a_continued_conversation_reports_its_cached_prompt(server):
    ask = {"messages": MESSAGES, "temperature": 0, "max_tokens": 3}
    _, first = post(server, "/v1/chat/completions", ask)
    turn = MESSAGES + [first["choices"][0]["message"], {"role": "user", "content": "t8 t9"}]
    _, second = post(server, "/v1/chat/completions", ask | {"messages": turn})
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] <= cached < second["usage"]["prompt_tokens"]


def test_stream_adds_up_to_the_reply(server, reference):
    status, data = request(server, "POST", "/v1/chat/completions",
                           {"messages": MESSAGES, "temperature": 0, "max_tokens": 7, "stream": True,
                            "stream_options": {"include_usage": True}})
    assert status == 200
    chunks = events(data)
    assert chunks[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2])
    assert text == expected(reference, 7)
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["usage"]["completion_tokens"] == 7 and chunks[-2]["choices"] == []
    assert len({c["id"] for c in chunks[:-1]}) == 1


def test_text_completion_takes_the_raw_prompt(server, reference):
    status, body = post(server, "/v1/completions", {"prompt": "t3 t4", "temperature": 0, "max_tokens": 5})
    assert status == 200
    reference.reset()
    assert body["choices"][0]["text"] == reference.generate("t3 t4", max_tokens=5)
    assert body["object"] == "text_completion"


def test_seeded_sampling_reproduces(server):
    ask = {"messages": MESSAGES, "temperature": 1.0, "seed": 3, "max_tokens": 8}
    first, second = post(server, "/v1/chat/completions", ask), post(server, "/v1/chat/completions", ask)
    assert first[1]["choices"][0]["message"] == second[1]["choices"][0]["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "t1"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": MESSAGES, "n": 2}, "n"),
    ({"messages": MESSAGES, "temperature": 3}, "temperature"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": MESSAGES, "stop": [""]}, "stop"),
    ({"messages": MESSAGES, "logprobs": True}, "logprobs"),
    ({"messages": MESSAGES, "presence_penalty": 0.5}, "presence_penalty"),
])
def test_bad_requests_say_which_field(server, body, param):
    status, reply = post(server, "/v1/chat/completions", body)
    assert status == 400
    assert reply["error"]["param"] == param and reply["error"]["message"]


def test_prompt_longer_than_the_context_is_refused(server):
    long = [{"role": "user", "content": " ".join(f"t{i % 80}" for i in range(200))}]
    status, reply = post(server, "/v1/chat/completions", {"messages": long, "max_tokens": 4})
    assert status == 400
    assert reply["error"]["code"] == "context_length_exceeded" and "context holds 64" in reply["error"]["message"]


def test_malformed_bodies_and_paths(server):
    status, data = request(server, "POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(data)["error"]["message"]
    status, data = request(server, "POST", "/v1/chat/completions", raw=b"[1, 2]")
    assert status == 400
    status, data = request(server, "GET", "/v1/nothing")
    assert status == 404
    status, data = request(server, "POST", "/v1/chat/completions", raw=b"{}",
                           headers={"Content-Length": str(MAX_BODY + 1)})
    assert status == 413


@pytest.fixture
def slow_server(package):
    """A server whose engine takes 20 ms a step, so a generation outlasts a client that hangs up early."""
    engine = Engine(package, context_length=64, threads=1)
    step = engine.decoder.step

    def slow_step(*args, **kwargs):
        time.sleep(0.02)
        return step(*args, **kwargs)

    engine.decoder.step = slow_step
    with serving(engine) as srv:
        yield srv


def test_a_client_that_leaves_mid_stream_stops_the_generation(slow_server, reference):
    body = json.dumps({"messages": MESSAGES, "temperature": 0, "max_tokens": 40, "stream": True}).encode()
    with socket.create_connection(slow_server.server_address[:2], timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while received.count(b"data: ") < 3:  # the role chunk and two pieces, then hang up
            received += sock.recv(4096)
    service = slow_server.RequestHandlerClass.service
    with service.lock:  # free once the generation has ended
        assert service.engine.stats.generated_tokens < 40  # it stopped when the client left
    status, reply = post(slow_server, "/v1/chat/completions",
                         {"messages": MESSAGES, "temperature": 0, "max_tokens": 12})
    assert status == 200
    assert reply["choices"][0]["message"]["content"] == expected(reference, 12)  # the cache was left consistent


def test_requests_at_once_take_turns(server, reference):
    want = expected(reference, 10)
    results = []

    def ask():
        results.append(post(server, "/v1/chat/completions", {"messages": MESSAGES, "temperature": 0,
                                                              "max_tokens": 10}))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r[1]["choices"][0]["message"]["content"] for r in results] == [want] * 3


def test_api_key_is_required_when_set(package):
    with serving(Engine(package, context_length=64, threads=1), api_key="secret") as srv:
        status, data = request(srv, "GET", "/v1/models")
        assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        status, _ = request(srv, "GET", "/v1/models", headers={"Authorization": "Bearer secret"})
        assert status == 200


def test_a_taken_port_is_a_clear_error(server, reference):
    with pytest.raises(EdgeError, match="choose another --port"):
        make_server(reference, port=server.server_address[1])


def test_listens_on_this_machine_only_by_default():
    assert parser().parse_args([]).host == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")


@pytest.mark.slow
def test_edge_serve_answers_on_the_default_model():
    """`edge-serve` as a user starts it: the default model, a free port, a chat request, Ctrl-C."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # -X faulthandler: should it ever hang, SIGABRT below prints every thread's stack into the failure message
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "edge.apps.serve", "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()  # printed once the model is loaded and the port bound
        match = re.search(r"http://([\d.]+):(\d+)/v1", line)
        assert match, line + proc.stderr.read()
        conn = http.client.HTTPConnection(match[1], int(match[2]), timeout=120)
        conn.request("POST", "/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
            "temperature": 0, "max_tokens": 16}), {"Content-Type": "application/json"})
        reply = json.loads(conn.getresponse().read())
        assert "Paris" in reply["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)  # reads stderr to the end: a full pipe cannot block the exit
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate()
        assert proc.returncode == 130, err  # interrupted: a clean exit, not a traceback


def test_serves_the_chat_page_without_a_key(package):
    with serving(Engine(package, context_length=64, threads=1), api_key="secret") as srv:
        status, page = request(srv, "GET", "/")
        assert status == 200 and b"/v1/chat/completions" in page and b"innerHTML" not in page
        assert request(srv, "GET", "/health")[0] == 200
        assert request(srv, "POST", "/v1/chat/completions", {"messages": MESSAGES})[0] == 401


def test_a_reply_never_iterated_still_ends_the_generation():
    """A client gone before the headers: the engine's generator must end now, not when garbage-collected."""
    ended = []

    def generation():
        try:
            yield "a"
            yield "b"
        finally:
            ended.append(True)

    rest = generation()
    reply = Reply(next(rest), rest)
    reply.close()
    assert ended == [True]


def test_a_sliding_server_drops_the_oldest_turns(package):
    turn = " ".join(f"t{i}" for i in range(10, 30))  # ~20 tokens a message: five turns overflow 64
    conversation = [{"role": "user" if i % 2 == 0 else "assistant", "content": turn} for i in range(5)]
    with serving(Engine(package, context_length=64, threads=1), on_full="slide") as srv:
        status, reply = post(srv, "/v1/chat/completions", {"messages": conversation, "max_tokens": 4,
                                                            "temperature": 0})
        assert status == 200 and reply["usage"]["completion_tokens"] == 4
        assert reply["usage"]["prompt_tokens"] < 64


class EndlessEngine:
    """Stands in for an Engine whose reply never ends and comes in megabyte pieces."""

    context_length = 64

    def __init__(self):
        self.ended = threading.Event()

    def chat(self, messages, config):
        try:
            while True:
                yield "x" * (1 << 20)
        finally:
            self.ended.set()


def test_a_client_that_stops_reading_releases_the_model(monkeypatch):
    from edge.server import Handler

    monkeypatch.setattr(Handler, "timeout", 0.5)
    engine = EndlessEngine()
    body = json.dumps({"messages": MESSAGES, "stream": True}).encode()
    with serving(engine, model_id="endless") as srv:
        with socket.create_connection(srv.server_address[:2], timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            sock.recv(1024)  # the stream has started; now read no more
            assert engine.ended.wait(timeout=30)  # the server gave up on the client and ended the generation
            service = srv.RequestHandlerClass.service
            assert service.lock.acquire(timeout=10)
            service.lock.release()


def test_speculative_server_answers_as_plain_decoding(package, reference):
    """Conversations taking turns on a server that drafts with prompt lookup: each reply is plain greedy's."""
    engine = Engine(package, context_length=64, threads=1, speculator="prompt-lookup")
    engine.speculator.draft_length = 4  # fixed: the adaptive policy may judge drafting a loss on this tiny model
    first = [{"role": "user", "content": "t5 t6 t7 t5 t6 t7 t5 t6"}]
    other = [{"role": "user", "content": "t40 t41 t40 t41 t40"}]
    drafted = 0
    with serving(engine) as srv:
        for messages in (first, other, first, other):
            status, reply = post(srv, "/v1/chat/completions", {"messages": messages, "temperature": 0,
                                                                "max_tokens": 12})
            assert status == 200
            assert reply["choices"][0]["message"]["content"] == expected(reference, 12, messages)
            drafted += engine.stats.speculative.drafted
            assert reply["usage"]["edge"]["speculative"]["drafted"] == engine.stats.speculative.drafted
        assert drafted > 0  # the drafter took part


def test_browsers_may_call_it_only_from_the_origins_allowed(package):

    def origin_header(method, origin, body=None):
        conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
        conn.request(method, "/v1/chat/completions", body=body, headers={"Origin": origin,
                                                                          "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status, response.getheader("Access-Control-Allow-Origin"), response.getheader(
            "Access-Control-Allow-Headers")

    ask = json.dumps({"messages": MESSAGES, "max_tokens": 2, "temperature": 0})
    with serving(Engine(package, context_length=64, threads=1), allow_origins=("http://app.local",)) as srv:
        assert origin_header("OPTIONS", "http://app.local") == (204, "http://app.local", "Authorization, Content-Type")
        assert origin_header("POST", "http://app.local", ask)[:2] == (200, "http://app.local")
        assert origin_header("OPTIONS", "http://evil.example")[1:] == (None, None)
        assert origin_header("POST", "http://evil.example", ask)[1] is None


def test_no_origin_is_allowed_by_default(server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request("GET", "/v1/models", headers={"Origin": "http://app.local"})
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200 and response.getheader("Access-Control-Allow-Origin") is None


def test_clients_taking_turns_keep_their_cached_conversations(package, reference):
    chats = [[{"role": "user", "content": " ".join(f"t{(k + 7 * i) % 80}" for i in range(40))}] for k in (1, 2)]
    with serving(Engine(package, context_length=160, threads=1, prefix_slots=2)) as srv:
        for turn in range(2):
            for messages in chats:
                _, body = post(srv, "/v1/chat/completions", {"messages": messages, "temperature": 0,
                                                             "max_tokens": 4})
                usage = body["usage"]
                if turn:
                    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 12
                messages += [body["choices"][0]["message"], {"role": "user", "content": "t5"}]
