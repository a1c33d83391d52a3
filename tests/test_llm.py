"""The LLM client against the scripted OpenAI-compatible server over real HTTP."""

from __future__ import annotations

import re
import sys

import pytest

from shared.config import LLMRoleConfig
from shared.llm import LLMClient, LLMError, _lines


def client_with_fallback(llm, fallback) -> LLMClient:
    config = LLMRoleConfig(role="answer", base_url=llm.base_url, api_key="k", model="scripted", max_retries=1,
                           backoff_base_s=0.01, timeout_s=5, fallback_base_url=fallback.base_url,
                           fallback_model="backup")
    return LLMClient({"answer": config})


def client(llm, **over) -> LLMClient:
    config = LLMRoleConfig(role="answer", base_url=llm.base_url, api_key="k", model="scripted",
                           max_retries=over.pop("max_retries", 2), backoff_base_s=0.01, timeout_s=over.pop("timeout_s", 5), **over)
    return LLMClient({"answer": config})


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Ping"}]


async def collect(c, records):
    async def record(call):
        records.append(call)

    return [part async for part in c.stream("answer", MESSAGES, record, temperature=0.2)]


async def test_stream_yields_tokens_and_records_the_call(llm):
    llm.clear()
    records = []
    parts = await collect(client(llm), records)
    text = "".join(parts)
    assert text.startswith("You said: Ping.") and len(parts) > 3
    (rec,) = records
    assert rec.response_text == text and rec.attempts == 1 and rec.error is None
    assert rec.messages == MESSAGES and rec.params == {"temperature": 0.2} and rec.model == "scripted"
    assert rec.ttft_ms is not None and rec.latency_ms >= rec.ttft_ms
    # The stream asked for its usage, which came in the last chunk; and what answered.
    sent = llm.requests()[-1]
    assert sent["stream_options"] == {"include_usage": True}
    assert (sent["messages"], sent["temperature"], sent["stream"]) == (MESSAGES, 0.2, True)  # in extra_body
    assert rec.usage == {"prompt_tokens": 10, "completion_tokens": len(parts)}
    assert (rec.served_model, rec.system_fingerprint) == ("scripted", "fp_scripted")


async def test_a_stream_leaves_no_generator_for_the_loop_to_close(llm):
    """The stream ends at `[DONE]` with its line generators closed in place: none is left to
    the event loop's async-generator finalizer (a wake-up and a task apiece)."""
    finalized = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen):
        finalized.append(agen.__qualname__)
        hooks.finalizer(agen)

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)  # for generators made from now on
    try:
        parts = await collect(client(llm), [])
    finally:
        sys.set_asyncgen_hooks(*hooks)
    assert "".join(parts).startswith("You said: Ping.")
    assert finalized == []


async def test_lines_split_the_body_wherever_its_pieces_break():
    class Body:
        def __init__(self, pieces):
            self.pieces = pieces

        async def aiter_bytes(self):
            for piece in self.pieces:
                yield piece

    text = 'data: {"a": "é"}\r\n\r\n: comment\r\rdata: [DONE]\n\nlast'.encode()
    expected = re.split(rb"\r\n|\r|\n", text)  # SSE's line ends: CRLF, LF or CR
    assert expected[:3] == [b'data: {"a": "\xc3\xa9"}', b"", b": comment"] and expected[-1] == b"last"
    for cut in range(1, len(text)):
        assert [line async for line in _lines(Body([text[:cut], b"", text[cut:]]))] == expected
    assert [line async for line in _lines(Body([b"data: x\r", b"\ndata: y\r"]))] == [b"data: x", b"data: y"]


def test_a_chunk_that_is_not_utf8_is_read_with_replacement_characters():
    from shared.llm import _parse_line

    chunk = _parse_line(b'data: {"choices": [{"delta": {"content": "caf\xe9"}}]}')
    assert chunk.choices[0].delta.content == "caf\ufffd"


async def test_transient_errors_are_retried(llm):
    llm.clear()
    llm.fail_next({"status": 503}, {"status": 429})
    records = []
    parts = await collect(client(llm), records)
    assert "".join(parts).startswith("You said: Ping.")
    assert records[0].attempts == 3
    assert len(llm.requests()) == 3


async def test_retries_are_bounded(llm):
    llm.clear()
    llm.fail_next({"status": 500}, {"status": 500}, {"status": 500})
    records = []
    with pytest.raises(LLMError, match="after 3 attempt"):
        await collect(client(llm), records)
    assert records[0].error and records[0].response_text == ""


async def test_client_errors_are_not_retried(llm):
    llm.clear()
    llm.fail_next({"status": 400})
    records = []
    with pytest.raises(LLMError, match="after 1 attempt"):
        await collect(client(llm), records)
    assert len(llm.requests()) == 1


async def test_a_stream_broken_after_tokens_is_not_retried(llm):
    llm.clear()
    llm.fail_next({"break_after": 3})
    records = []
    with pytest.raises(LLMError) as info:
        await collect(client(llm), records)
    assert info.value.after_tokens
    assert len(llm.requests()) == 1
    assert records[0].response_text  # what did arrive is on record


async def test_a_provider_slower_than_the_timeout_is_given_up_on_and_retried(llm):
    """The role's `timeout_s` holds on the HTTP transport the clients use (aiohttp's)."""
    import time

    llm.clear()
    llm.fail_next({"delay_s": 3})
    records = []
    started = time.monotonic()
    parts = await collect(client(llm, timeout_s=0.5), records)
    assert "".join(parts).startswith("You said: Ping.") and time.monotonic() - started < 2.5
    assert records[0].attempts == 2 and len(llm.requests()) == 2


async def test_fallback_endpoint_answers_when_the_primary_is_down(llm, fallback_llm):
    llm.clear(), fallback_llm.clear()
    llm.fail_next({"status": 503}, {"status": 502})
    records = []
    parts = await collect(client_with_fallback(llm, fallback_llm), records)
    assert "".join(parts).startswith("You said: Ping.")
    (rec,) = records
    assert rec.fallback_used and rec.model == "backup" and rec.base_url == fallback_llm.base_url
    assert rec.attempts == 3 and len(fallback_llm.requests()) == 1


async def test_no_fallback_for_client_errors_or_after_tokens(llm, fallback_llm):
    llm.clear(), fallback_llm.clear()
    llm.fail_next({"status": 400})
    with pytest.raises(LLMError):
        await collect(client_with_fallback(llm, fallback_llm), [])
    llm.fail_next({"break_after": 2})
    with pytest.raises(LLMError):
        await collect(client_with_fallback(llm, fallback_llm), [])
    assert fallback_llm.requests() == []


@pytest.mark.parametrize("json_mode", ["json_schema", "json_object"])
async def test_structured_output_in_either_request_form(llm, json_mode):
    import msgspec

    class Pick(msgspec.Struct):
        options: list[str]

    llm.clear()
    picked = await client(llm, json_mode=json_mode).structured("answer", MESSAGES, _ignore, Pick)
    assert isinstance(picked, Pick)
    sent = llm.requests()[-1]["response_format"]
    assert sent["type"] == json_mode
    schema = sent["json_schema"]["schema"] if json_mode == "json_schema" else sent["schema"]
    assert schema["properties"]["options"]["type"] == "array"


async def _ignore(_call):
    return None


def test_prepare_makes_the_configured_roles_clients_before_the_first_call():
    """A service makes its roles' clients at start (`prepare`): an openai client loads its
    TLS trust store when made, which the first turn using the role would otherwise wait for."""
    client = LLMClient({"answer": LLMRoleConfig(role="answer", base_url="http://127.0.0.1:9/v1", api_key="k", model="m",
                                                fallback_base_url="http://127.0.0.1:10/v1"),
                        "redirect": LLMRoleConfig(role="redirect", base_url="", api_key="k", model="m")})
    assert client._endpoints == {}
    assert client.prepare() is client
    assert set(client._endpoints) == {"answer"}  # made now; an unconfigured role gets none
    assert [e.name for e in client.endpoints("answer")] == ["primary", "fallback"]
