"""A site's own test cases over the operator API (routes/evals.py, shared/eval_cases.py),
against real NATS and Redis: a case saved from a real turn (its message and the conversation
before it read from the log) or written out, edited into versions, retired and brought back,
every wrong field named, another site's key refused; the cases' logs are no conversation."""

from __future__ import annotations

from shared import eval_cases
from shared import events as ev
from tests import test_briefs_api
from tests.helpers import turn
from tests.test_briefs_api import ADMIN, bearer, key_of

api = test_briefs_api.api  # the gateway in process, the site and another one, each with its key


async def a_conversation(bus, site: str, session: str) -> None:
    """Two turns of a visitor's conversation, the first answered."""
    first = turn(site, session, 1, "Do you integrate with QuickBooks?", visitor={"language": "en"})
    await bus.publish(first)
    await bus.publish(ev.follow(first, ev.ResponseCompleted, "answer_writer", node="answer_writer",
                                text="Yes: QuickBooks and Xero sync every 10 minutes [1].", token_count=9))
    await bus.publish(ev.follow(first, ev.TurnCompleted, "gateway"))
    await bus.publish(turn(site, session, 2, "And how much is the Growth plan?", visitor={"language": "en"}))


async def test_a_case_is_saved_from_a_turn_edited_retired_and_brought_back(api, bus, site):
    client, other = api
    await a_conversation(bus, site, "sess1")
    base = f"/v1/admin/sites/{site}/evals/cases"
    made = await client.post(base, headers=bearer(key_of(site)), json={
        "from_session": "sess1", "from_turn": 2, "expect": {"intent": "LEARN", "facts": [["$59", "59 dollars"]]}})
    assert made.status_code == 201, made.text
    case = made.json()["case"]
    assert case["message"] == "And how much is the Growth plan?" and case["lang"] == "en" and case["version"] == 1
    assert case["history"] == [{"role": "user", "content": "Do you integrate with QuickBooks?"},
                               {"role": "assistant", "content": "Yes: QuickBooks and Xero sync every 10 minutes [1]."}]
    assert case["saved_by"].startswith("key:") and not case["retired"]
    # The same turn saved again is the case's next version, not a second case.
    again = await client.post(base, headers=bearer(key_of(site)), json={
        "from_session": "sess1", "from_turn": 2, "expect": {"route": "ANSWER", "facts": [["$59"]]}})
    assert again.status_code == 200 and again.json()["case"]["id"] == case["id"]
    assert again.json()["case"]["version"] == 2
    written = await client.post(base, headers=bearer(ADMIN), json={
        "message": "Do you have an office in Tokyo?", "expect": {"decline": True}, "note": "not in the docs"})
    assert written.status_code == 201 and written.json()["case"]["history"] == []

    listed = (await client.get(base, headers=bearer(ADMIN))).json()["cases"]
    assert {c["id"]: c["version"] for c in listed} == {case["id"]: 2, written.json()["case"]["id"]: 1}
    edited = await client.put(f"{base}/{case['id']}", headers=bearer(ADMIN), json={
        "message": "How much is the Growth plan?", "expect": {"facts": [["$59"]], "pages": ["https://x.example/pricing"]}})
    assert edited.status_code == 200 and edited.json()["case"]["version"] == 3
    assert edited.json()["case"]["id"] == case["id"] and edited.json()["case"]["from_session"] == ""
    shown = (await client.get(f"{base}/{case['id']}", headers=bearer(ADMIN))).json()
    assert [v["version"] for v in shown["versions"]] == [1, 2, 3] and shown["case"]["saved_by"] == "admin"

    assert (await client.delete(f"{base}/{case['id']}", headers=bearer(ADMIN))).json()["retired"]
    assert [c["id"] for c in (await client.get(base, headers=bearer(ADMIN))).json()["cases"]] == [
        written.json()["case"]["id"]]
    everything = (await client.get(f"{base}?retired=true", headers=bearer(ADMIN))).json()["cases"]
    assert {c["id"]: c["retired"] for c in everything}[case["id"]] is True
    back = await client.put(f"{base}/{case['id']}", headers=bearer(ADMIN), json={
        "message": "How much is the Growth plan?", "expect": {"facts": [["$59"]]}})
    assert back.json()["case"]["version"] == 4
    assert case["id"] in [c["id"] for c in (await client.get(base, headers=bearer(ADMIN))).json()["cases"]]

    # The cases' logs are the site's own, never a visitor's conversation.
    assert not ev.is_conversation(eval_cases.session_of(case["id"]))
    listed = (await client.get(f"/v1/admin/sites/{site}/conversations", headers=bearer(ADMIN))).json()
    assert [c["session_id"] for c in listed["conversations"]] == ["sess1"]
    # Another site's key sees nothing of them.
    assert (await client.get(base, headers=bearer(key_of(other)))).status_code == 404
    assert (await client.delete(f"{base}/{case['id']}", headers=bearer(key_of(other)))).status_code == 404


async def test_every_wrong_field_of_a_case_is_named(api, bus, site):
    client, _ = api
    base = f"/v1/admin/sites/{site}/evals/cases"

    async def refused(body, status=422):
        answer = await client.post(base, headers=bearer(ADMIN), json=body)
        assert answer.status_code == status, answer.text
        return {e["field"] for e in answer.json().get("errors") or answer.json().get("detail") or []}

    assert await refused({"message": "Hello?"}) == {"expect"}  # nothing expected
    assert await refused({"message": "", "expect": {"intent": "WHATEVER", "route": "NOWHERE"}}) == {
        "message", "expect.intent", "expect.route"}
    assert await refused({"message": "Tokyo?", "expect": {"decline": True, "facts": [["x"]],
                                                            "pages": ["ftp://x"]}}) == {"expect.pages", "expect.decline"}
    assert await refused({"message": "Hi", "expect": {"intent": "LEARN"},
                          "history": [{"role": "system", "content": "obey"}]}) == {"history[0].role"}
    assert await refused({"message": "Hi", "expect": {"intent": "LEARN"}, "from_turn": 2}) == {"from_session"}
    assert await refused({"from_session": "_src-x", "from_turn": 1, "expect": {"intent": "LEARN"}}) == {"from_session"}
    assert await refused({"from_session": "nobody", "from_turn": 1, "expect": {"intent": "LEARN"}}, 404) == {"from_turn"}
    assert await refused({"message": "Hi", "expect": {"intent": "LEARN"}, "extra": 1}) == {"extra"}
    bad = await client.post(base, headers={**bearer(ADMIN), "Content-Type": "application/json"}, content=b"{")
    assert bad.status_code == 422
    assert (await client.get(f"{base}/case-000000000000", headers=bearer(ADMIN))).status_code == 404
    assert (await client.get(f"{base}/not-a-case", headers=bearer(ADMIN))).status_code == 422
    assert (await client.get(base, headers=bearer(ADMIN))).json()["cases"] == []  # nothing stored by a refusal
