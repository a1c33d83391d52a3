"""An operator's message sent again (services/gateway/routes/handoffs.py `send_message`): a
client whose answer was lost (its gateway killed after storing the message) sends the same
request again with its `client_message_id`, and the message is stored once. In process
against real NATS and Redis, as tests/test_handoffs.py."""

from __future__ import annotations

from shared import events as ev
from tests import test_briefs_api
from tests.helpers import events_of
from tests.test_briefs_api import ADMIN, bearer
from tests.test_handoffs import admin, waiting

api = test_briefs_api.api


async def operator_texts(bus, site: str, session: str) -> list[str]:
    return [e.text for e in await events_of(bus, site, session) if isinstance(e, ev.OperatorMessage)]


async def test_a_message_sent_again_with_its_client_id_is_stored_once(bus, site, api):
    client, _ = api
    session = await waiting(bus, site)
    auth = bearer(ADMIN)
    assert (await client.post(admin(site, session, "claim"), json={"operator": "Ada"}, headers=auth)).status_code == 201
    body = {"operator": "Ada", "text": "Hello again", "client_message_id": "m-1"}
    first = await client.post(admin(site, session, "messages"), json=body, headers=auth)
    again = await client.post(admin(site, session, "messages"), json=body, headers=auth)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert first.json()["new"] is True and again.json()["new"] is False
    other = await client.post(admin(site, session, "messages"), json={**body, "client_message_id": "m-2"},
                              headers=auth)
    assert other.json()["new"] is True  # the same words under another id: another message
    # Without an id each request is a message of its own, as before.
    for _ in range(2):
        await client.post(admin(site, session, "messages"), json={"operator": "Ada", "text": "No id"}, headers=auth)
    assert await operator_texts(bus, site, session) == ["Hello again", "Hello again", "No id", "No id"]
    bad = await client.post(admin(site, session, "messages"), json={**body, "client_message_id": "not an id"},
                            headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "client_message_id", bad.text
