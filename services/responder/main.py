"""Responder service: writes the answer, post-processes it (dialog state, form fields,
suggestions) and closes the turn."""

from shared import service
from shared.llm import LLMClient
from services.responder import answer_writer, finalize, post_processing, suggesters


async def nodes(bus):
    llm = LLMClient.from_env(("answer", "suggestions"))
    return [
        answer_writer.make_node(llm),
        post_processing.dialog_state_extractor,
        post_processing.form_field_extractor,
        post_processing.suggestion_router,
        suggesters.make_node("follow_up", llm),
        suggesters.make_node("answers", llm),
        finalize.node,
    ]


def main() -> None:
    service.main("responder", nodes)


if __name__ == "__main__":
    main()
