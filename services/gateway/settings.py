"""The gateway's settings, read once at start (main.py) and handed to `create_app`."""

from __future__ import annotations

import msgspec

from services.gateway import frames
from services.gateway.schemas import MAX_BODY_BYTES
from shared import redis_client
import os

from shared.config import BusConfig, Settings, env_bool, env_float, env_int, env_str, invalid
from shared.site_config import ACCOUNTS_KEY_PREFIX, ENV_NAME_RE
from shared.privacy import PrivacySettings
from shared.web import Outbound


class GatewaySettings(Settings):
    SECRETS = ("session_token_secret", "session_token_previous", "admin_token", "account_keys")

    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    turn_deadline_s: float = 60.0
    # A turn with no event, token or node at work on it for this long is ended (relay.py);
    # above CONSUMER_ACK_WAIT_S (5 s), the time a replica's dead work takes to move on. 0: off.
    turn_stall_s: float = 8.0
    rate_per_ip_per_min: int = 30
    rate_per_site_per_min: int = 1200
    max_body_bytes: int = MAX_BODY_BYTES
    guard_takeover_s: float = 3.0  # a held key this old, for a turn the log says ended, is taken over
    keepalive_s: float = frames.KEEPALIVE_S
    trusted_proxy_hops: int = 0  # proxies in front that append to X-Forwarded-For (an ingress: 1)
    site_config_ttl_s: float = 2.0
    redis_url: str = redis_client.DEFAULT_URL
    privacy: PrivacySettings = msgspec.field(default_factory=PrivacySettings)
    # Session tokens (sessions.py): the current key signs; the previous ones still verify.
    # No secret: a random one for this process, with a warning.
    session_token_secret: str = ""
    session_token_key_id: str = "1"
    session_token_previous: dict[str, str] = {}
    admin_token: str = ""  # the deployment operator's; empty: site API keys only (operators.py)
    console_session_s: int = 8 * 3600  # how long a console sign-in lasts (console_sessions.py)
    # The ops port, as every process's (shared/ops.py): /metrics there only, off the port the
    # ingress publishes; /healthz and /readyz there too. 0: none.
    ops_port: int = 9000
    ops_host: str = "0.0.0.0"
    ops_check_s: float = 5.0
    # The sites' account pull connectors (shared/accounts.py): every ACCOUNTS_KEY_* variable
    # (a site names its own in `accounts.pull_key_env`; no other variable can be named), and
    # which addresses they may fetch from besides public ones (the outbound guard,
    # shared/web.py: OUTBOUND_ALLOW_PRIVATE_NETWORKS, OUTBOUND_ALLOWED).
    account_keys: dict[str, str] = {}
    outbound: Outbound = msgspec.field(default_factory=Outbound)
    # A run of a site's test cases (eval_runner.py): cases asked at once; 0: this replica runs none.
    eval_run_concurrency: int = 2
    # Knowledge syncs and config changes this close together ask for one run (eval_trigger.py).
    eval_run_debounce_s: float = 30.0

    @classmethod
    def from_env(cls) -> "GatewaySettings":
        d = cls()
        return cls(
            bus=BusConfig.from_env(),
            host=env_str("GATEWAY_HOST", d.host),
            port=env_int("GATEWAY_PORT", d.port),
            turn_deadline_s=env_float("TURN_DEADLINE_S", d.turn_deadline_s),
            eval_run_concurrency=env_int("EVAL_RUN_CONCURRENCY", d.eval_run_concurrency),
            eval_run_debounce_s=env_float("EVAL_RUN_DEBOUNCE_S", d.eval_run_debounce_s),
            turn_stall_s=env_float("TURN_STALL_S", d.turn_stall_s),
            rate_per_ip_per_min=env_int("RATE_LIMIT_PER_IP_PER_MIN", d.rate_per_ip_per_min),
            rate_per_site_per_min=env_int("RATE_LIMIT_PER_SITE_PER_MIN", d.rate_per_site_per_min),
            max_body_bytes=env_int("GATEWAY_MAX_BODY_BYTES", d.max_body_bytes),
            guard_takeover_s=env_float("SESSION_GUARD_TAKEOVER_S", d.guard_takeover_s),
            keepalive_s=env_float("SSE_KEEPALIVE_S", d.keepalive_s),
            trusted_proxy_hops=env_int("TRUSTED_PROXY_HOPS", d.trusted_proxy_hops),
            site_config_ttl_s=env_float("SITE_CONFIG_TTL_S", d.site_config_ttl_s),
            redis_url=env_str("REDIS_URL", d.redis_url),
            privacy=PrivacySettings.from_env(),
            session_token_secret=env_str("SESSION_TOKEN_SECRET", d.session_token_secret),
            session_token_key_id=env_str("SESSION_TOKEN_KEY_ID", d.session_token_key_id),
            session_token_previous=_previous_keys(env_str("SESSION_TOKEN_PREVIOUS", "")),
            admin_token=env_str("ADMIN_TOKEN", d.admin_token),
            console_session_s=env_int("CONSOLE_SESSION_S", d.console_session_s),
            ops_port=env_int("OPS_PORT", d.ops_port),
            ops_host=env_str("OPS_HOST", d.ops_host),
            ops_check_s=env_float("OPS_CHECK_S", d.ops_check_s),
            account_keys={name: value for name, value in os.environ.items()
                          if name.startswith(ACCOUNTS_KEY_PREFIX) and ENV_NAME_RE.match(name)},
            outbound=Outbound.from_env(),
        )


def _previous_keys(value: str) -> dict[str, str]:
    """SESSION_TOKEN_PREVIOUS: `kid:secret[,kid:secret]`."""
    previous = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        kid, sep, secret = item.partition(":")
        if not sep:
            return invalid("SESSION_TOKEN_PREVIOUS: expected kid:secret[,kid:secret]", {})
        previous[kid] = secret
    return previous
