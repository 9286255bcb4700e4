"""The engine against the official `openai` Python client (a client no one here wrote):
chat and completions, streaming with usage, log probabilities parsed into the client's own
types, and the client's own error types.

Run by scripts/test-openai-client.sh, which starts `pacer-engine serve` and sets
PACER_BASE_URL and PACER_SERVED_MODEL.
"""

import os

import openai
import pytest

BASE = os.environ["PACER_BASE_URL"]
MODEL = os.environ["PACER_SERVED_MODEL"]


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_completion(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    assert r.choices[0].message.role == "assistant"
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_chat_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_streaming_completion_matches_non_streaming(client):
    kw = dict(model=MODEL, prompt="The quick brown fox", max_tokens=10, temperature=0)
    whole = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == whole


def test_log_probabilities_parse_into_the_clients_types(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    # The end-of-turn token, when it ends the answer, is not listed.
    assert len(content) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    assert "".join(bytes(t.bytes).decode() for t in content) == r.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    assert all(t.token == t.top_logprobs[0].token for t in content)
    c = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=4, temperature=0, logprobs=1)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == 4
    assert lp.text_offset[0] == 0 and all(len(t) == 1 for t in lp.top_logprobs)


def test_errors_map_to_the_clients_exception_types(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=1, n=2)
    assert "n = 1" in str(e.value)
