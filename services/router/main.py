"""Router service: turns a `TurnRequested` into a `RouteDecided`."""

from shared import service
from services.router import intent_router


async def nodes(bus):
    return [intent_router.node]


def main() -> None:
    service.main("router", nodes)


if __name__ == "__main__":
    main()
