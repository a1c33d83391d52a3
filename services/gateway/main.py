"""Gateway service: `python -m services.gateway` serves the HTTP API with uvicorn."""

import logging

import uvicorn

from shared import logs, telemetry
from shared.config import ConfigError
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


def main() -> None:
    logs.setup("gateway")
    telemetry.setup("gateway")
    try:
        settings = GatewaySettings.from_env()  # the only read of the environment: start-up
        app = create_app(settings)
    except ConfigError as exc:
        log.error("configuration error", extra={"error": str(exc)})
        raise SystemExit(f"gateway: {exc}") from None
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        loop="uvloop",  # as every service (shared/service.main); "auto" would pick it only when installed
        timeout_graceful_shutdown=30,
        proxy_headers=proxy_headers(settings),
    )


def proxy_headers(settings: GatewaySettings) -> bool:
    """Whether uvicorn reads the proxy headers. X-Forwarded-For is read only behind
    TRUSTED_PROXY_HOPS proxies, by access.client_ip counting from the right: uvicorn's own
    (on by default, trusting a 127.0.0.1 peer) would hand the client's left-most, self-written
    entry to every per-address limit. Behind an ingress they give the scheme too (https in
    the embed snippet; FORWARDED_ALLOW_IPS names the ingress's addresses)."""
    return settings.trusted_proxy_hops > 0


if __name__ == "__main__":
    main()
