"""The system harness: what starts a whole Concierge on one machine and talks to it, for
`concierge run`, the measurements and the tests (tests/servers.py, the end-to-end tests).

- supervisor.py: nats-server, redis-server and the five services, started and stopped;
- scripted_llm.py: a deterministic OpenAI-compatible server (`concierge scripted-llm`);
- local_llm.py: the opt-in embedded llama.cpp model;
- sse.py: a visitor's client for the chat endpoint;
- visitor.py: a visitor's turn as the widget takes it (sent again, resumed; the rehearsals');
- webhook_receiver.py: a local lead webhook that counts deliveries by `webhook-id`;
- responder_standin.py: answers every turn with tokens, for the gateway's load test.
"""
