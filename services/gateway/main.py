"""Gateway service: `python -m services.gateway` serves the HTTP API with uvicorn."""

import uvicorn

from shared import logs, telemetry
from shared.config import env_int, env_str
from services.gateway.app import create_app


def main() -> None:
    logs.setup("gateway")
    telemetry.setup("gateway")
    uvicorn.run(
        create_app(),
        host=env_str("GATEWAY_HOST", "127.0.0.1"),
        port=env_int("GATEWAY_PORT", 8000),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
