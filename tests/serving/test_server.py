"""The OpenAI-compatible server end to end on CPU: the real SmolLM2 GGUF served on a loopback port in a background
thread, driven by the official `openai` client and by raw HTTP."""
import asyncio
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

MODEL = "smollm2"
PROMPTS = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(16)]
NO_EOS = {"ignore_eos": True}  # several of these prompts end at once with EOS: keep the comparisons non-trivial


class _ServerThread:
    """Runs an aiohttp app on 127.0.0.1:<free port> in its own event loop thread."""

    def __init__(self, app):
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(60)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
        fut.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PENALISED = dict(frequency_penalty=1.0, presence_penalty=0.5, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def served(smollm2_gguf):
    from jaxinfer import LLM, SamplingParams
    from serving.server import create_app

    llm = LLM(smollm2_gguf, dtype="float32", num_pages=256, max_model_len=512, max_num_batched_tokens=128,
              max_num_seqs=16, warmup=False, progress=False)
    # offline greedy references, computed before the server's engine thread owns the engine
    ref = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert all(o.outputs[0].text for o in ref)
    chat_ref = llm.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)[0].outputs[0]
    pen_ref = llm.generate(PROMPTS[4], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, **PENALISED),
                           use_tqdm=False)[0].outputs[0].text
    assert pen_ref != ref[4].outputs[0].text  # the penalties matter for this prompt
    srv = _ServerThread(create_app(llm, served_model_name=MODEL))
    srv.chat_ref, srv.penalty_ref = chat_ref, pen_ref
    yield srv, llm, [o.outputs[0].text for o in ref]
    srv.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="x", max_retries=0, timeout=120)


def _post(url, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def _get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def _running_or_zero(url):
    """jaxinfer_num_requests_running, or 0 when one poll times out: the first request compiles its programs
    (--no-warmup), and on the 2-core box running the suite on two workers a single /metrics answer took > 30 s
    while it did (the server's own threads and the compile share one starved process); the caller's deadline
    still bounds the wait."""
    try:
        return _metric(url, "jaxinfer_num_requests_running")
    except (TimeoutError, urllib.error.URLError):
        return 0


def _metric(url, name):
    for line in _get(url + "/metrics").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


# ---- openai client ---------------------------------------------------------------------------------------------
def test_models_health(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert _get(served[0].url + "/health") == "ok"


def test_completion_matches_offline_and_stream(served, client):
    _, _, ref = served
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0, extra_body=NO_EOS)
    assert r.choices[0].text == ref[0]
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=NO_EOS))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref[0]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason


def test_chat_and_chat_stream_match_offline_chat(served, client):
    ref = served[0].chat_ref  # LLM.chat, greedy, same chat template
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and text == ref.text and "Paris" in text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.completion_tokens == len(ref.token_ids) <= 16
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=16,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.finish_reason
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_penalties_match_offline(served, client):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=12, temperature=0,
                                  frequency_penalty=PENALISED["frequency_penalty"],
                                  presence_penalty=PENALISED["presence_penalty"],
                                  extra_body={"ignore_eos": True,
                                              "repetition_penalty": PENALISED["repetition_penalty"]})
    assert r.choices[0].text == served[0].penalty_ref


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) .startswith(r.choices[0].text[:1])
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and len(top) >= 3
        assert max(top.values()) == pytest.approx(l, abs=1e-4)  # greedy: the sampled token is the top one
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_n_and_multiple_prompts(client):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=6, temperature=1.0, seed=1, n=2,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert all(c.text is not None and c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 4 * 6
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=6, temperature=1.0,
                                            seed=1, n=3, stream=True, extra_body={"ignore_eos": True}))
    assert {c.choices[0].index for c in chunks} == {0, 1, 2}
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)}
    assert all(texts.values()), texts
    assert all(c.choices[0].finish_reason == "length" for c in chunks if c.choices[0].finish_reason)


def test_stop_string(served, client):
    _, _, ref = served
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    text = r.choices[0].text
    assert len(text) > 8, text
    stop = text[4:7]
    r2 = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    assert stop not in r2.choices[0].text and r2.choices[0].finish_reason == "stop"
    assert text.startswith(r2.choices[0].text)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r2.choices[0].text


def _tiny_with_tokenizer(tiny_llama_dir, dst):
    """The tiny random Llama (vocab 512) plus a byte-level BPE tokenizer of exactly 512 ids trained here, so
    string prompts work and outputs decode to text (loading SmolLM2's GGUF tokenizer would cost ~15 s)."""
    import shutil

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    shutil.copytree(tiny_llama_dir, dst)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "question", "answer", "plus"]
    corpus = [" ".join(words[(i * k) % len(words)] for k in range(1, 9)) + f" {i}" for i in range(300)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.add_tokens([f"<pad{i}>" for i in range(512 - len(fast))], special_tokens=True)
    assert len(fast) == 512
    fast.save_pretrained(dst)
    return str(dst)


@pytest.fixture(scope="module")
def tiny_served(tiny_llama_dir, tmp_path_factory):
    from jaxinfer import LLM, SamplingParams
    from serving.server import create_app

    path = _tiny_with_tokenizer(tiny_llama_dir, tmp_path_factory.mktemp("tiny_tok") / "model")
    llm = LLM(path, dtype="float32", num_pages=400, max_model_len=256, max_num_batched_tokens=256,
              max_num_seqs=64, min_bucket_tokens=16, warmup=False, progress=False)  # buckets 16, 64, 256
    prompts = [f"Question {i}: the quick brown fox {i * 7} jumps" for i in range(64)]
    ref = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    srv = _ServerThread(create_app(llm, served_model_name="tiny"))
    yield srv, llm, prompts, [o.outputs[0].text for o in ref]
    srv.stop()


def test_64_concurrent_streams_match_offline(tiny_served):
    srv, llm, prompts, ref = tiny_served
    assert sum(bool(t) for t in ref) > 50  # real text to compare

    async def main():
        ac = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)

        async def one(p):
            s = await ac.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=NO_EOS)
            chunks = [c async for c in s]
            return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens

        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await ac.close()

    got = asyncio.run(main())
    assert [t for t, _ in got] == ref
    assert all(n == 8 for _, n in got)
    assert llm.engine.kv.num_used_pages == 0


def test_prefix_cache_metrics(tiny_served):
    """Exact counter deltas: B shares A's first 48 tokens (3 pages of 16) and finds them cached."""
    srv = tiny_served[0]
    names = ["queries_total", "hits_total", "hit_requests_total"]
    before = {n: _metric(srv.url, "jaxinfer_prefix_cache_" + n) for n in names}
    assert _metric(srv.url, "jaxinfer_prefix_cache_enabled") == 1
    rng = np.random.default_rng(123)
    shared = rng.integers(17, 512, 48).tolist()
    a, b = shared + [20, 21, 22, 23, 24], shared + [30, 31, 32, 33, 34]
    for p in (a, b):
        status, _, body = _post(srv.url + "/v1/completions", {"prompt": p, "max_tokens": 2, "temperature": 0})
        assert status == 200, body
    after = {n: _metric(srv.url, "jaxinfer_prefix_cache_" + n) for n in names}
    assert after["queries_total"] - before["queries_total"] == len(a) + len(b)
    assert after["hits_total"] - before["hits_total"] == 48
    assert after["hit_requests_total"] - before["hit_requests_total"] == 1
    rate = _metric(srv.url, "jaxinfer_prefix_cache_hit_rate")
    assert rate == pytest.approx(after["hits_total"] / after["queries_total"])
    assert _metric(srv.url, "jaxinfer_prefix_cache_cached_pages") >= 3


def test_unknown_fields_ignored_user_accepted(tiny_served):
    srv, _, prompts, ref = tiny_served
    body = {"prompt": prompts[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True, "user": "alice",
            "some_future_field": {"x": [1, 2]}}
    status, _, out = _post(srv.url + "/v1/completions", body)
    assert status == 200 and out["choices"][0]["text"] == ref[0]
    status, _, err = _post(srv.url + "/v1/completions", dict(body, user=5))
    assert status == 400 and err["error"]["param"] == "user"


# ---- raw HTTP: errors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": 5}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "stop": 3}, "stop"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 50}, "logprobs"),
    ({"model": MODEL, "prompt": "hi", "n": 0}, "n"),
    ({"model": MODEL, "prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": MODEL, "prompt": "hi", "frequency_penalty": "a"}, "frequency_penalty"),
    ({"model": "gpt-4", "prompt": "hi"}, "model"),
])
def test_bad_completion_requests(served, body, param):
    status, _, err = _post(served[0].url + "/v1/completions", body)
    assert status == 400, err
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param
    assert err["error"]["code"] is None and err["error"]["message"]


def test_bad_chat_and_json(served):
    url = served[0].url
    status, _, err = _post(url + "/v1/chat/completions", b"{not json", raw=True)
    assert status == 400 and "JSON" in err["error"]["message"]
    status, _, err = _post(url + "/v1/chat/completions", {"model": MODEL, "messages": "hi"})
    assert status == 400 and err["error"]["param"] == "messages"
    status, _, err = _post(url + "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
                                                         "content": "x"}], "top_logprobs": 2})
    assert status == 400 and err["error"]["param"] == "top_logprobs"
    status, _, _ = _post(url + "/v1/completions", [1, 2])
    assert status == 400


def test_too_long_prompt(served):
    url = served[0].url
    status, _, err = _post(url + "/v1/completions", {"model": MODEL, "prompt": [1] * 500, "max_tokens": 100})
    assert status == 400
    msg = err["error"]["message"]
    assert "500" in msg and "512" in msg and err["error"]["param"] == "prompt", msg


def test_disconnect_mid_stream_frees_pages(served):
    import socket

    url = served[0].url
    body = json.dumps({"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 400, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", served[0].port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    assert _metric(url, "jaxinfer_kv_pages_used") > 0
    s.close()
    deadline = time.time() + 120  # generous: CI machines are loaded
    while time.time() < deadline and _metric(url, "jaxinfer_kv_pages_used") > 0:
        time.sleep(0.1)
    assert _metric(url, "jaxinfer_kv_pages_used") == 0
    assert _metric(url, "jaxinfer_num_requests_running") == 0


def test_metrics(served, client):
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
    text = _get(served[0].url + "/metrics")
    for name in ("jaxinfer_requests_total", "jaxinfer_time_to_first_token_seconds_bucket",
                 "jaxinfer_time_per_output_token_seconds_bucket", "jaxinfer_e2e_request_latency_seconds_count",
                 "jaxinfer_prompt_tokens_total", "jaxinfer_generation_tokens_total",
                 "jaxinfer_num_requests_waiting", "jaxinfer_kv_pages_used", "jaxinfer_prefix_cache_hits_total",
                 "jaxinfer_prefix_cache_queries_total", "jaxinfer_prefix_cache_hit_rate"):
        assert name in text, name
    assert 'status="200"' in text and 'status="400"' in text


def test_max_waiting_503(tiny_llama_dir):
    """max_num_seqs=1, max_waiting=0: while one slow request runs, the next gets 503 + Retry-After."""
    from jaxinfer import LLM
    from serving.server import create_app

    llm = LLM(tiny_llama_dir, dtype="float32", num_pages=64, max_model_len=512, max_num_batched_tokens=64,
              max_num_seqs=1, min_bucket_tokens=4, warmup=False, progress=False)  # one bucket for all its steps
    srv = _ServerThread(create_app(llm, served_model_name="tiny", max_waiting=0))
    try:
        result = {}

        def slow():
            result["slow"] = _post(srv.url + "/v1/completions", {"prompt": [1, 5, 7], "max_tokens": 480,
                                                                 "ignore_eos": True, "temperature": 0})

        t = threading.Thread(target=slow)
        t.start()
        deadline = time.time() + 120
        while time.time() < deadline and _metric(srv.url, "jaxinfer_num_requests_running") == 0:
            time.sleep(0.01)
        status, headers, err = _post(srv.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        assert status == 503 and "Retry-After" in headers, err
        t.join(300)
        assert result["slow"][0] == 200
        assert result["slow"][2]["usage"]["completion_tokens"] == 480
        status, _, _ = _post(srv.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})
        assert status == 200
    finally:
        srv.stop()


@pytest.mark.parametrize("value", ["0", "-1", "fast"])
def test_switch_interval_must_be_positive_seconds(value, capsys):
    from serving.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--switch-interval", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--switch-interval" in err and "positive number of seconds" in err
    assert build_parser().parse_args(["--switch-interval", "0.0005"]).switch_interval == 0.0005


def test_switch_interval_reaches_the_call_thread(monkeypatch, restore_switch_interval):
    """serve --switch-interval sets the process's interval and the one a call thread (on with a GPU) would
    set at its first call, so the flag is not undone by the engine."""
    from jaxinfer.runner.call_thread import CallThread
    from serving.cli import apply_switch_interval

    monkeypatch.setenv("JAXINFER_SWITCH_INTERVAL", "0.005")  # (restored after: apply_switch_interval writes it)
    apply_switch_interval(0.0003)
    assert sys.getswitchinterval() == pytest.approx(0.0003)
    ct = CallThread()
    ct.submit(lambda: None).result()
    assert sys.getswitchinterval() == pytest.approx(0.0003)
    ct.close()


def test_serve_lowers_the_switch_interval_by_default(monkeypatch, capsys, restore_switch_interval):
    """Without --switch-interval, serve sets JAXINFER_SWITCH_INTERVAL or 0.1 ms before it builds the engine (Python's
    5 ms served 11% fewer requests, 12-07 e); a bad JAXINFER_SWITCH_INTERVAL is a clear start-up error (exit 2)."""
    from serving.cli import main

    monkeypatch.setenv("JAXINFER_SWITCH_INTERVAL", "0.005")  # (records the variable's state to restore: main writes it)
    monkeypatch.delenv("JAXINFER_SWITCH_INTERVAL")
    sys.setswitchinterval(0.005)
    assert main(["--model", "/nonexistent/model"]) == 2  # (fails after the interval is set: no model)
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert "not found" in capsys.readouterr().err
    monkeypatch.setenv("JAXINFER_SWITCH_INTERVAL", "fast")
    sys.setswitchinterval(0.005)
    assert main(["--model", "/nonexistent/model"]) == 2
    err = capsys.readouterr().err
    assert "JAXINFER_SWITCH_INTERVAL='fast' is not a positive number of seconds" in err
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_cli_serve_sigterm_graceful(smollm2_gguf):
    """`python -m serving` serves; SIGTERM lets the in-flight request finish, then exits 0. The grace period is far
    longer than the request needs even on a loaded machine, and every wait polls with a generous deadline. The
    engine shape is tests/test_cli.py's SMALL (same programs: one compile in the suite, JAX's persistent cache)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # The server's output goes to a file, not a pipe: nobody reads a pipe while the test waits, and a server that
    # writes more than the pipe's buffer (64 KiB) would block on its own log.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "serving", "--model", smollm2_gguf, "--dtype", "float32",
                             "--port", str(port), "--num-pages", "64", "--max-model-len", "256",
                             "--max-num-batched-tokens", "64", "--max-num-seqs", "4", "--no-warmup",
                             "--served-model-name", MODEL, "--shutdown-grace", "300",
                             "--switch-interval", "0.0005"],  # (the A/B knob: serving works under it too)
                            stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ))

    def output() -> str:
        log.seek(0)
        return log.read().decode(errors="replace")[-3000:]

    try:
        deadline = time.time() + 300
        while True:
            try:
                assert _get(url + "/health") == "ok"
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.time() < deadline, output()
                time.sleep(0.3)
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", _post(url + "/v1/completions", {
            "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": True})))
        t.start()
        deadline = time.time() + 300
        while time.time() < deadline and _running_or_zero(url) == 0:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(400) == 0, output()
        t.join(60)
        status, _, body = result["r"]
        assert status == 200 and body["usage"]["completion_tokens"] == 40
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
