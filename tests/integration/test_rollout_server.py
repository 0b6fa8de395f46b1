"""The OpenAI-compatible server under real uvicorn on 127.0.0.1, driven by the official `openai` client:
completions, chat, SSE streaming, GRPO groups, prefix-cache reuse visible in usage, 413/429 with the
limit named in the body, and `temper serve` as a subprocess."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
import torch
import requests

from temper.rollout.client import ChatPolicy, RolloutClient
from temper.core.settings import RolloutSettings
from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine
from temper.rollout.server import EmbeddedServer
from tests.integration.conftest import free_port

LANES = [LaneConfig(name="short", max_prompt_tokens=200, max_queued=1, max_running=1),
         LaneConfig(name="long", max_prompt_tokens=400, max_queued=4, max_running=1, prefill_chunk_tokens=64,
                    time_share=0.2)]
PROMPT = "system: be brief.\nuser: what is 2 + 2?\nassistant: "


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_model(max_positions=4096)


@pytest.fixture(scope="module")
def server(tiny):
    engine = Engine(EngineConfig(model_dir=tiny, lanes=LANES, max_context_tokens=3000))
    with EmbeddedServer(engine) as url:
        yield engine, url


@pytest.fixture
def api(server):
    with openai.OpenAI(base_url=server[1], api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def test_completions_equal_the_engine_and_reuse_the_prefix(server, api):
    engine, _ = server
    want = engine.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0))[0].texts[0]
    r = api.completions.create(model="temper", prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.choices[0].text == want and r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == len(engine.encode(PROMPT))
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1  # the engine call cached it


def test_a_group_of_n_and_a_list_of_prompts(api):
    r = api.completions.create(model="temper", prompt=[PROMPT, PROMPT + "4"], max_tokens=6, temperature=1.0, n=3,
                               seed=1)
    assert [c.index for c in sorted(r.choices, key=lambda c: c.index)] == list(range(6))
    assert len({c.text for c in r.choices[:3]}) > 1  # sampled, not copies


def test_streaming_yields_the_same_text_as_a_plain_request(api):
    plain = api.completions.create(model="temper", prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(api.completions.create(model="temper", prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert len(chunks) > 3  # token by token, not one blob
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    chat = list(api.chat.completions.create(model="temper", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chat)
    plain_chat = api.chat.completions.create(model="temper", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=8, temperature=0)
    assert streamed == plain_chat.choices[0].message.content
    assert plain_chat.choices[0].message.role == "assistant"


def test_413_names_the_lane_limit_and_the_context(api):
    with pytest.raises(openai.APIStatusError) as e:
        api.completions.create(model="temper", prompt="x" * 401, max_tokens=4)
    assert e.value.status_code == 413
    # the openai client exposes the body's "error" object as .body
    assert e.value.body["type"] == "prompt_too_long" and e.value.body["code"] == 413
    limit = e.value.body["limit"]
    assert limit["name"] == "max_prompt_tokens" and limit["lane"] == "long" and limit["value"] == 400
    assert limit["prompt_tokens"] == 401
    with pytest.raises(openai.APIStatusError) as e:
        api.completions.create(model="temper", prompt="x" * 100, max_tokens=2950)
    assert e.value.status_code == 413
    assert e.value.body["limit"]["name"] == "max_context_tokens" and e.value.body["limit"]["value"] == 3000


def test_429_when_the_lane_queue_is_full(server, api):
    engine, url = server
    busy = api.completions.create(model="temper", prompt=PROMPT, max_tokens=2500, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True})
    next(iter(busy))  # it is running (max_running=1)
    queued = threading.Thread(target=lambda: api.completions.create(model="temper", prompt=PROMPT, max_tokens=2,
                                                                    temperature=0), daemon=True)
    queued.start()
    deadline = time.monotonic() + 20
    while requests.get(url.removesuffix("/v1") + "/metrics", timeout=5).json()["lanes"]["short"]["queued"] < 1:
        assert time.monotonic() < deadline, "second request never queued"
        time.sleep(0.05)
    with pytest.raises(openai.RateLimitError) as e:
        api.completions.create(model="temper", prompt=PROMPT, max_tokens=2)
    assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "1"
    assert e.value.body["type"] == "queue_full"
    assert e.value.body["limit"] == {"name": "max_queued", "lane": "short", "value": 1, "queued": 1}
    ok = api.completions.create(model="temper", prompt="y" * 250, max_tokens=2)  # the long lane still admits
    assert ok.usage.prompt_tokens == 250
    busy.close()  # client goes away: the engine cancels the stream's request
    queued.join(timeout=30)
    assert not queued.is_alive()
    deadline = time.monotonic() + 10
    while not any(ev.kind == "finish" and ev.detail == "cancelled" for ev in engine.step_log):
        assert time.monotonic() < deadline, "the abandoned stream was not cancelled"
        time.sleep(0.05)


def test_bad_requests_are_400_or_404_with_an_openai_error(api):
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="other", prompt=PROMPT, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        api.completions.create(model="temper", prompt=PROMPT, max_tokens=2, logprobs=2)
    assert [m.id for m in api.models.list().data] == ["temper"]


def test_rollout_client_and_chat_policy_against_the_server(server):
    settings = RolloutSettings(base_url=server[1], max_retries=0)
    with RolloutClient(settings) as client:
        groups = client.generate([PROMPT, PROMPT + "x"], max_tokens=5, temperature=1.0, n=4, seed=3)
        assert [len(g) for g in groups] == [4, 4] and all(c.finish_reason for g in groups for c in g)
        greedy = client.generate([PROMPT], max_tokens=5, temperature=0)[0][0].text
        assert greedy == server[0].generate([PROMPT], SamplingParams(max_tokens=5, temperature=0))[0].texts[0]
        policy = ChatPolicy(client, system_prompt="you run shell commands", max_tokens=6, stop_word="__never__")
        turn = type("Turn", (), {})
        first = policy("list the files", [])
        t1 = turn()
        t1.action, t1.observation = first, "a.txt b.txt"
        second_messages = policy.messages("a.txt b.txt", [t1])
        assert second_messages[1]["content"] == "list the files" and second_messages[2]["content"] == first
        reply = client.chat_one(second_messages, max_tokens=4, temperature=0)[0]
        assert reply.cached_tokens > 0  # the episode's history came from the prefix cache


def test_temper_serve_subprocess(tiny, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "temper.cli", "serve", "--model", str(tiny), "--port", str(port),
                             "--threads", "1", "--log-level", "warning"], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
                            env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as client:
            r = client.chat.completions.create(model="temper", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, temperature=0)
            assert r.usage.completion_tokens >= 1
    finally:
        proc.terminate()
        proc.wait(20)


def test_prompt_token_ids_are_checked(api):
    with pytest.raises(openai.BadRequestError, match="token ids"):
        api.completions.create(model="temper", prompt=[5, 6, 10**6], max_tokens=2)
    ok = api.completions.create(model="temper", prompt=[5, 6, 7], max_tokens=2, temperature=0)
    assert ok.usage.prompt_tokens == 3


def test_logprobs_and_token_ids_are_the_models_own(server, api):
    engine, _ = server
    r = api.completions.create(model="temper", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0,
                               extra_body={"return_token_ids": True})
    c = r.choices[0]
    prompt_ids = engine.encode(PROMPT)
    assert c.prompt_token_ids == prompt_ids and len(c.token_ids) == r.usage.completion_tokens
    assert engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text
    with torch.no_grad():  # teacher-forced: the log-probabilities the model gives the returned tokens
        logits = engine.model(torch.tensor([prompt_ids + c.token_ids])).logits[0, len(prompt_ids) - 1:-1]
    want = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(c.logprobs.token_logprobs), want, atol=1e-4)
    chat = api.chat.completions.create(model="temper", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       temperature=0, logprobs=True)
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        api.chat.completions.create(model="temper", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                    logprobs=True, top_logprobs=3)


def test_trl_rollout_func_returns_one_entry_per_completion(server):
    from types import SimpleNamespace

    from temper.rollout.client import trl_rollout_func

    engine, url = server
    trainer = SimpleNamespace(num_generations=3, num_generations_eval=1, model=SimpleNamespace(training=True),
                              processing_class=engine.tokenizer)
    with RolloutClient(RolloutSettings(base_url=url, max_retries=0)) as client:
        out = trl_rollout_func(client, max_tokens=4)([PROMPT, [{"role": "user", "content": "hi"}]], trainer)
    assert [len(out[k]) for k in ("prompt_ids", "completion_ids", "logprobs")] == [6, 6, 6]
    assert out["prompt_ids"][0] == engine.encode(PROMPT) and out["prompt_ids"][3] == out["prompt_ids"][5]
    assert all(len(ids) == len(lp) and all(x <= 0 for x in lp) for ids, lp in zip(out["completion_ids"],
                                                                                    out["logprobs"]))
