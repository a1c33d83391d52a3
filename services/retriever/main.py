"""Retriever service. It connects, owns its consumers' lifecycle, and hosts no node yet:
its nodes arrive with their issue (see docs/architecture.md, "Not built yet")."""

from shared import service


async def nodes(bus):
    return []


def main() -> None:
    service.main("retriever", nodes)


if __name__ == "__main__":
    main()
