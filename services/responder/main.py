"""Responder service: writes the answer and closes the turn."""

from shared import service
from shared.llm import LLMClient
from services.responder import answer_writer, finalize


async def nodes(bus):
    llm = LLMClient.from_env(("answer",))
    return [answer_writer.make_node(llm), finalize.node]


def main() -> None:
    service.main("responder", nodes)


if __name__ == "__main__":
    main()
