"""attn serve over plain HTTP: the endpoints the openai package does not
cover, hostile and malformed requests, batching against serial runs, load,
disconnects and shutdown. Each test bounds its own time."""
import concurrent.futures as cf
import http.client
import json
import signal
import socket
import threading
import time

import pytest

from conftest import GPT2, QWEN3, Server, metrics, request, wait_idle


def test_health_and_metrics(qwen):
    assert request(qwen.url, "/health")[:3:2] == (200, {"status": "ok"})
    request(qwen.url, "/v1/completions", {"prompt": "count me", "max_tokens": 3})
    status, headers, text = request(qwen.url, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name, kind in [("attn_requests_total", "counter"), ("attn_prompt_tokens_total", "counter"),
                       ("attn_generated_tokens_total", "counter"), ("attn_slots_busy", "gauge"),
                       ("attn_requests_waiting", "gauge"),
                       ("attn_time_to_first_token_seconds", "histogram"),
                       ("attn_time_per_output_token_seconds", "histogram")]:
        assert f"# TYPE {name} {kind}" in text
    m = metrics(qwen.url)
    assert m["attn_requests_total"] >= 1 and m["attn_generated_tokens_total"] >= 1
    assert m['attn_time_to_first_token_seconds_bucket{le="+Inf"}'] == m["attn_time_to_first_token_seconds_count"] >= 1


def test_tokenize_and_detokenize_round_trip(qwen, gpt2):
    for server in (qwen, gpt2):
        status, _, t = request(server.url, "/tokenize", {"prompt": "Hello world, héllo"})
        assert status == 200 and t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == 64
        status, _, d = request(server.url, "/detokenize", {"tokens": t["tokens"]})
        assert status == 200 and d["prompt"].endswith("Hello world, héllo")
    assert request(qwen.url, "/detokenize", {"tokens": [10 ** 9]})[0] == 400
    assert request(qwen.url, "/detokenize", {"tokens": [-1]})[0] == 400
    assert request(qwen.url, "/tokenize", {"prompt": 5})[2]["error"]["param"] == "prompt"


def test_unknown_paths_bad_json_wrong_types_and_big_bodies(qwen):
    status, _, body = request(qwen.url, "/v1/nothing")
    assert status == 404 and body["error"]["code"] == "unknown_url"
    assert request(qwen.url, "/v1/completions", method="GET")[0] == 404
    cases = [
        (b'{"prompt": "x", "max_tokens": ', "invalid_json", None),          # truncated
        (b'{"prompt": "\xff\xfe"}', "invalid_json", None),                 # invalid UTF-8
        (b'[1, 2, 3]', "invalid_json", None),
        (b'', "invalid_json", None),
        (b'{"prompt": "x", "max_tokens": 1e400}', "invalid_json", None),     # past a double (issue 46)
        (b'{"prompt": "x", "max_tokens": "5"}', None, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": -5}', None, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": 1e300}', None, "max_tokens"),
        (b'{"prompt": "x", "max_tokens": 99999999999999999999999}', None, "max_tokens"),
        (b'{"prompt": "x", "seed": "abc"}', None, "seed"),
        (b'{"prompt": "x", "temperature": -0.5}', None, "temperature"),
        (b'{"prompt": "x", "top_p": 1.5}', None, "top_p"),
        (b'{"prompt": "x", "top_k": -7}', None, "top_k"),
        (b'{"prompt": "x", "stream": "yes"}', None, "stream"),
        (b'{"prompt": "x", "n": 3}', None, "n"),
        (b'{"prompt": [1, 2, 1000000]}', None, "prompt"),
        (b'{"prompt": null}', None, "prompt"),
        (b'{"prompt": "x", "logprobs": 99}', None, "logprobs"),
    ]
    for raw, code, param in cases:
        status, _, body = request(qwen.url, "/v1/completions", raw=raw)
        assert status == 400, (raw, body)
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        if code:
            assert err["code"] == code, (raw, err)
        if param:
            assert err["param"] == param, (raw, err)
    status, _, body = request(qwen.url, "/v1/chat/completions", raw=b'{"messages": "hi"}')
    assert status == 400 and body["error"]["param"] == "messages"
    # The prompt past the context (64 positions).
    status, _, body = request(qwen.url, "/v1/completions", {"prompt": "word " * 200, "max_tokens": 1})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    # 10 MB: over the 8 MiB default limit.
    status, _, body = request(qwen.url, "/v1/completions", raw=b'{"prompt": "' + b"a" * (10 << 20) + b'"}')
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert request(qwen.url, "/health")[0] == 200  # still serving


def test_slow_and_headless_bodies_time_out_and_the_server_goes_on():
    s = Server(QWEN3, "--timeout", "1")
    try:
        t0 = time.time()
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"pro")
            data = sock.recv(4096)  # the server gives up on the rest of the body
            while data and b"\r\n\r\n" not in data:
                more = sock.recv(4096)
                if not more:
                    break
                data += more
        assert time.time() - t0 < 8
        assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:100]
        status, _, body = request(s.url, "/v1/completions", {"prompt": "still here", "max_tokens": 2})
        assert status == 200
    finally:
        assert s.stop() == 0


def completion_ids(url, body):
    status, _, r = request(url, "/v1/completions", dict(body, logprobs=0))
    assert status == 200, r
    return r["choices"][0]["logprobs"]["tokens"], r["choices"][0]["text"]


def test_batching_gives_each_request_what_it_gets_alone(qwen):
    bodies = [{"prompt": p, "max_tokens": 12, "temperature": 0.9, "seed": 40 + i, "top_k": 30 if i % 2 else 0}
              for i, p in enumerate(["a b c", "Hello", "The quick brown fox jumps", "x", "1 2 3 4 5 6 7 8",
                                     "Zebra", "one two", "it was the best of times"])]
    alone = [completion_ids(qwen.url, b) for b in bodies]
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: completion_ids(qwen.url, b), bodies))
    assert together == alone


def stream_lines(port, body, read_all=True, timeout=30):
    """The SSE data lines of one streaming completion."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    lines = []
    if r.status != 200:
        return r.status, [r.read().decode()]
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if line.startswith("data: "):
            lines.append(line[6:])
            if not read_all:
                break
            if line == "data: [DONE]":
                break
    conn.close()
    return r.status, lines


def test_32_streaming_clients_for_a_few_seconds(qwen):
    deadline = time.time() + 4
    done = []

    def client(i):
        n = 0
        while time.time() < deadline:
            status, lines = stream_lines(qwen.port, {"prompt": f"client {i}", "max_tokens": 20,
                                                     "temperature": 0.7, "seed": i})
            assert status == 200, lines
            assert lines[-1] == "[DONE]"
            final = json.loads(lines[-2])
            assert final["choices"][0]["finish_reason"] in ("stop", "length")
            n += 1
        done.append(n)

    with cf.ThreadPoolExecutor(32) as pool:
        list(pool.map(client, range(32)))
    assert len(done) == 32 and min(done) >= 1
    m = wait_idle(qwen.url)
    assert m["attn_kv_cache_blocks_free"] + m["attn_kv_cache_blocks_cached"] == m["attn_kv_cache_blocks_total"]


def test_clients_that_disconnect_mid_stream_free_their_slots(qwen):
    def leave(i):
        status, lines = stream_lines(qwen.port, {"prompt": f"leaving {i}", "max_tokens": 50,
                                                 "temperature": 1.0, "seed": i}, read_all=False)
        return status

    with cf.ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(leave, range(50)))
    assert statuses.count(200) + statuses.count(503) == 50
    m = wait_idle(qwen.url)
    assert m["attn_kv_cache_blocks_free"] + m["attn_kv_cache_blocks_cached"] == m["attn_kv_cache_blocks_total"]
    assert request(qwen.url, "/v1/completions", {"prompt": "after", "max_tokens": 2})[0] == 200


def test_a_full_queue_answers_503_with_retry_after():
    s = Server(GPT2, "--parallel", "1", "--queue-size", "0")
    try:
        with cf.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: request(s.url, "/v1/completions",
                                                      {"prompt": f"busy {i}", "max_tokens": 40,
                                                       "temperature": 1.0, "seed": i}), range(16)))
        codes = [r[0] for r in results]
        assert set(codes) <= {200, 503} and 200 in codes and 503 in codes, codes
        for status, headers, body in results:
            if status == 503:
                assert headers["Retry-After"] == "1"
                assert body["error"]["code"] == "server_overloaded"
    finally:
        assert s.stop() == 0


def test_sigterm_during_streams_exits_0():
    s = Server(QWEN3, "--shutdown-grace", "0.2")
    stop = threading.Event()
    outcomes = []

    def client(i):
        while not stop.is_set():
            try:
                status, lines = stream_lines(s.port, {"prompt": f"shut {i}", "max_tokens": 50,
                                                      "temperature": 1.0, "seed": i}, timeout=10)
                outcomes.append((status, lines[-1] if lines else ""))
            except (ConnectionError, http.client.HTTPException, OSError):
                outcomes.append(("closed", ""))
                return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    s.proc.send_signal(signal.SIGTERM)
    code = s.proc.wait(15)
    stop.set()
    for t in threads:
        t.join(15)
    assert code == 0, "\n".join(s.log[-20:])
    assert outcomes and all(o[0] in (200, 503, "closed") for o in outcomes)
    assert any("SIGTERM" in line for line in s.log) and s.log[-1] == "attn serve: stopped"


def test_one_log_line_per_request_without_prompt_text():
    s = Server(QWEN3)
    try:
        request(s.url, "/v1/completions", {"prompt": "secret words", "max_tokens": 2})
        request(s.url, "/nowhere")
    finally:
        assert s.stop() == 0
    posts = [l for l in s.log if "POST /v1/completions" in l]
    gets = [l for l in s.log if "GET /nowhere" in l]
    assert len(posts) == 1 and len(gets) == 1, s.log
    assert " 200 prompt_tokens=" in posts[0] and "completion_tokens=2 finish=length" in posts[0]
    assert " 404 " in gets[0]
    assert not any("secret words" in l for l in s.log)
    s = Server(QWEN3, "--log-prompts")
    try:
        request(s.url, "/v1/completions", {"prompt": "secret words", "max_tokens": 2})
    finally:
        assert s.stop() == 0
    assert any('prompt="secret words"' in l for l in s.log)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_two_thousand_requests_in_a_row_leak_nothing():
    # Few connection threads: each thread's first requests grow its malloc arena.
    s = Server(QWEN3, "--parallel", "2", "--http-threads", "4")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)

        def one(i):
            body = {"prompt": f"request number {i}", "max_tokens": 4, "temperature": 1.0, "seed": i,
                    "stream": i % 2 == 1, "logprobs": 2}
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200

        # The first few hundred grow the allocator's arenas and the threads' caches
        # (about +3 MB, measured flat from ~1,500 requests on); then no growth.
        for i in range(500):
            one(i)
        warm = rss_kib(s.proc.pid)
        for i in range(500, 2000):
            one(i)
        after = rss_kib(s.proc.pid)
        conn.close()
        assert after <= warm * 1.05, (warm, after)
        assert metrics(s.url)["attn_requests_total"] == 2000
    finally:
        assert s.stop() == 0


def test_a_shared_prompt_beginning_is_read_from_the_prefix_cache():
    system = [10 + (7 * i) % 900 for i in range(40)]  # 2 full blocks of 16, and 8 more
    # The second request reads the first's two full blocks and the 8 rows of
    # its third that it shares (40 of its 41 tokens); the third, the same two
    # blocks and 9 rows (41 of 42: all but its last token).
    for flags, hits in [((), 2 * 16 + 8 + 2 * 16 + 9), (("--no-prefix-caching",), 0)]:
        s = Server(QWEN3, *flags)
        try:
            texts = []
            for tail in ([901, 902], [903], [901, 902]):
                status, _, r = request(s.url, "/v1/completions",
                                       {"prompt": system + tail, "max_tokens": 8, "temperature": 0})
                assert status == 200, r
                texts.append(r["choices"][0]["text"])
            m = metrics(s.url)
            assert m["attn_prefix_cache_hit_tokens_total"] == hits
            assert texts[0] == texts[2]
        finally:
            assert s.stop() == 0
