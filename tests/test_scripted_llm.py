"""The scripted LLM's recorded replies, in-process: which entry answers, streamed and not."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest

from cli.harness.scripted_llm import Recorded, Script, conforming, create_app, read_recording

REPLIES = [
    Recorded(when=["You review an account brief", "ana@a.example", "Reviewer feedback:"], reply="retry verdict"),
    Recorded(when=["You review an account brief", "ana@a.example"], reply="first verdict"),
    Recorded(when=["You write an account brief", "ana@a.example"], reply="brief for ana"),
    Recorded(when=["You write an account brief"], reply="any brief"),
]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {
    "type": "object", "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]}}}}}


def messages(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@pytest.fixture
async def llm():
    transport = httpx.ASGITransport(app=create_app(Script(recorded=REPLIES)))
    async with httpx.AsyncClient(transport=transport, base_url="http://scripted") as client:
        yield client


async def complete(client: httpx.AsyncClient, msgs: list[dict], **body) -> str:
    response = await client.post("/v1/chat/completions", json={"model": "scripted", "messages": msgs, **body})
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


async def stream(client: httpx.AsyncClient, msgs: list[dict]) -> str:
    response = await client.post("/v1/chat/completions",
                                 json={"model": "scripted", "messages": msgs, "stream": True})
    response.raise_for_status()
    chunks = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return "".join(c["choices"][0]["delta"].get("content", "") for c in map(json.loads, chunks[:-1]))


async def test_the_first_entry_whose_substrings_all_occur_answers(llm):
    sent = messages("You review an account brief.", "Lead ana@a.example\nReviewer feedback: too long")
    assert await complete(llm, sent) == "retry verdict"
    assert await complete(llm, messages("You review an account brief.", "Lead ana@a.example")) == "first verdict"


async def test_substrings_may_be_in_different_messages_and_all_must_occur(llm):
    assert await complete(llm, messages("You write an account brief.", "for ana@a.example")) == "brief for ana"
    assert await complete(llm, messages("You write an account brief.", "for bo@b.example")) == "any brief"


async def test_a_streamed_answer_carries_the_recorded_reply(llm):
    reply = await stream(llm, messages("You write an account brief.", "for ana@a.example"))
    assert reply == "brief for ana"


async def test_a_recorded_reply_wins_over_the_schema_object(llm):
    sent = messages("You review an account brief.", "Lead ana@a.example")
    assert await complete(llm, sent, response_format=SCHEMA) == "first verdict"


async def test_without_a_match_the_schema_object_and_the_echo_answer(llm):
    sent = messages("You review an account brief.", "Lead bo@b.example")
    assert json.loads(await complete(llm, sent, response_format=SCHEMA)) == {"verdict": "pass"}
    assert (await complete(llm, sent)).startswith("You said: Lead bo@b.example.")
    assert (await stream(llm, sent)).startswith("You said: Lead bo@b.example.")


async def test_a_queued_fault_reply_wins_over_the_recording(llm):
    await llm.post("/_faults", json=[{"reply": "from the fault"}])
    sent = messages("You write an account brief.", "for ana@a.example")
    assert await complete(llm, sent) == "from the fault"
    assert await complete(llm, sent) == "brief for ana"


def test_a_recording_file_is_read_and_validated(tmp_path):
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps({"_comment": "ignored", "replies": [{"when": ["x"], "reply": "y"}]}))
    assert read_recording(path) == [Recorded(when=["x"], reply="y")]
    path.write_text(json.dumps({"replies": [{"when": "x", "reply": "y"}]}))
    with pytest.raises(msgspec.ValidationError, match="Expected `array`"):
        read_recording(path)


def test_a_prompt_asking_for_sections_gets_them_and_numbers_their_minimum():
    script = Script()
    messages = [{"role": "system", "content": "Write markdown with exactly these sections:\n## Talk track\n(x)\n## Close"},
                {"role": "user", "content": "Lead e-mail: a@b.example"}]
    assert script.answer(messages) == "## Talk track\nYou said: Lead e-mail: a@b.example\n\n## Close\nYou said: Lead e-mail: a@b.example"
    assert conforming({"properties": {"priority": {"type": "integer", "minimum": 1, "maximum": 10}}}) == {"priority": 1}
