"""Configuration from environment variables, read once at start-up.

Every variable is read by a settings Struct's `from_env` (these helpers, the Structs below,
each service's `services/<service>/settings.py` and a few shared ones), which its service's
`main.py` calls once and hands to what it builds; nothing else reads the environment
(tests/test_settings.py checks). Every variable is listed in docs/operations.md. A bad value
stops the process with a message naming the variable, rather than running with a surprise.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from typing import Callable, ClassVar, Mapping, TypeVar

import msgspec

T = TypeVar("T")


class ConfigError(Exception):
    pass


# Set while `every_problem` reads settings: the bad values noted so far.
_problems: ContextVar[list[str] | None] = ContextVar("config_problems", default=None)


def invalid(message: str, instead: T) -> T:
    """A bad setting: raised as a ConfigError, or, while `every_problem` gathers them, noted
    and `instead` used so that reading goes on to the next variable."""
    problems = _problems.get()
    if problems is None:
        raise ConfigError(message)
    problems.append(message)
    return instead


def every_problem(checks: Mapping[str, Callable[[], object]]) -> list[str]:
    """Run each check (a process's settings, read as its start reads them) and list every bad
    setting at once, rather than the first: one line per problem, naming the processes it
    stops (`gateway: ADMIN_TOKEN ...`, `router, retriever: NATS_URL ...`). A ConfigError a
    check raises on its own ends that check and is listed too. Empty: nothing wrong."""
    stopped: dict[str, list[str]] = {}
    for name, check in checks.items():
        problems: list[str] = []
        token = _problems.set(problems)
        try:
            check()
        except ConfigError as exc:
            problems.append(str(exc))
        finally:
            _problems.reset(token)
        for problem in dict.fromkeys(problems):
            stopped.setdefault(problem, []).append(name)
    return [f"{'every process' if len(names) == len(checks) > 1 else ', '.join(names)}: {problem}"
            for problem, names in stopped.items()]


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    """Base of the settings Structs: read once by `from_env`, then passed to what uses them.
    Fields named in `SECRETS` show as `***` in the repr (settings end up in logs and
    tracebacks; secrets must not)."""

    SECRETS: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return without_secrets(self, self.SECRETS)


def without_secrets(struct: msgspec.Struct, secrets: tuple[str, ...]) -> str:
    """`struct`'s repr with the fields named in `secrets` shown as `***` when set."""

    def shown(name: str) -> str:
        value = getattr(struct, name)
        return "***" if name in secrets and value else repr(value)

    return f"{type(struct).__name__}({', '.join(f'{name}={shown(name)}' for name in struct.__struct_fields__)})"


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        return invalid(f"{name}={raw!r} is not a number", default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        return invalid(f"{name}={raw!r} is not an integer", default)


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name, "")
    if not value:
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    return invalid(f"{name}={value!r}: use true or false", default)


def env_choice(name: str, default: str, choices: tuple[str, ...], message: str = "") -> str:
    """`name`'s value, one of `choices`; anything else stops the process naming the variable."""
    value = env_str(name, default)
    if value not in choices:
        return invalid(f"{name}={value!r}: {message or 'use ' + ' or '.join(choices)}", default)
    return value


class BusConfig(msgspec.Struct, kw_only=True):
    url: str = "nats://127.0.0.1:4222"
    request_timeout: float = 5.0
    replicas: int = 1
    dedupe_window_s: float = 600.0
    conv_max_age_s: float = 0.0  # 0: keep the conversation log forever
    tokens_max_age_s: float = 600.0
    tokens_max_bytes: int = 256 * 1024 * 1024
    dlq_max_age_s: float = 14 * 24 * 3600.0
    snapshot_ttl_s: float = 0.0
    kb_vectors_ttl_s: float = 30 * 86400.0  # knowledge-base text vectors (shared/kb_vectors.py)
    snapshot_every: int = 64  # the gateway writes a snapshot when this many events are past the last one
    # Credentials, at most one kind: a .creds file (JWT + nkey seed), an nkey seed file, a
    # user and password, or a token. None: the embedded default, an open server on loopback.
    creds_file: str = ""
    nkey_seed_file: str = ""
    user: str = ""
    password: str = ""
    token: str = ""

    def __repr__(self) -> str:
        # Configs end up in logs and tracebacks; secrets must not.
        return f"BusConfig(url={self.url!r}, auth={self.auth_method()!r})"

    def servers(self) -> list[str]:
        """`url` as a server list: one URL, or several comma-separated (a cluster's servers;
        the client picks one and reconnects to another when it goes)."""
        servers = [server.strip() for server in self.url.split(",") if server.strip()]
        if not servers:
            raise ConfigError("NATS_URL is empty")
        return servers

    def auth_method(self) -> str:
        """Which credentials the connection presents: creds, nkey, user, token or none."""
        for method, value in (("creds", self.creds_file), ("nkey", self.nkey_seed_file), ("user", self.user),
                              ("token", self.token)):
            if value:
                return method
        return "none"

    def connect_options(self) -> dict:
        """The credentials as nats-py `connect` options."""
        return {"creds": {"user_credentials": self.creds_file}, "nkey": {"nkeys_seed": self.nkey_seed_file},
                "user": {"user": self.user, "password": self.password}, "token": {"token": self.token},
                "none": {}}[self.auth_method()]

    def check_credentials(self) -> None:
        """One kind of credentials, complete and readable; a mistake stops the process at
        start rather than as an endless reconnect loop."""
        given = [name for name, value in (("NATS_CREDS", self.creds_file), ("NATS_NKEY_SEED", self.nkey_seed_file),
                                          ("NATS_USER", self.user), ("NATS_TOKEN", self.token)) if value]
        if len(given) > 1:
            invalid(f"set one kind of NATS credentials, not {' and '.join(given)}", None)
        if bool(self.user) != bool(self.password):
            invalid("NATS_USER and NATS_PASSWORD go together", None)
        for name, path in (("NATS_CREDS", self.creds_file), ("NATS_NKEY_SEED", self.nkey_seed_file)):
            if not path:
                continue
            if not os.access(path, os.R_OK):
                invalid(f"{name}={path!r} is not a readable file", None)
                continue
            try:
                import nkeys  # noqa: F401  # nats-py signs the server's nonce with it
            except ImportError:
                raise ConfigError(f"{name} needs the nkeys package (pip install nkeys)") from None

    @classmethod
    def from_env(cls) -> "BusConfig":
        d = cls()
        config = cls(
            url=env_str("NATS_URL", d.url),
            request_timeout=env_float("NATS_REQUEST_TIMEOUT_S", d.request_timeout),
            replicas=env_int("NATS_REPLICAS", d.replicas),
            dedupe_window_s=env_float("CONV_DEDUPE_WINDOW_S", d.dedupe_window_s),
            conv_max_age_s=env_float("CONV_MAX_AGE_S", d.conv_max_age_s),
            tokens_max_age_s=env_float("TOKENS_MAX_AGE_S", d.tokens_max_age_s),
            dlq_max_age_s=env_float("DLQ_MAX_AGE_S", d.dlq_max_age_s),
            snapshot_every=env_int("SNAPSHOT_EVERY", d.snapshot_every),
            snapshot_ttl_s=env_float("SNAPSHOT_TTL_S", d.snapshot_ttl_s),
            kb_vectors_ttl_s=env_float("KB_VECTORS_TTL_S", d.kb_vectors_ttl_s),
            tokens_max_bytes=env_int("TOKENS_MAX_BYTES", d.tokens_max_bytes),
            creds_file=env_str("NATS_CREDS", ""),
            nkey_seed_file=env_str("NATS_NKEY_SEED", ""),
            user=env_str("NATS_USER", ""),
            password=env_str("NATS_PASSWORD", ""),
            token=env_str("NATS_TOKEN", ""),
        )
        config.check_credentials()
        return config


class ConsumerConfig(msgspec.Struct, kw_only=True):
    """Delivery policy of one node's durable consumer."""

    max_deliver: int = 4
    # Short, with `in_progress` heartbeats every third of it while a handler runs: a replica
    # that dies mid-turn gives its message to a live one within this many seconds.
    ack_wait_s: float = 5.0
    backoff_s: tuple[float, ...] = (0.5, 2.0, 5.0)
    concurrency: int = 32
    drain_timeout_s: float = 30.0
    # A handler still running after this long is cancelled, what it awaited logged, and the
    # attempt counted as failed (retried, then the node's failure event): a handler waiting
    # for ever would otherwise hold its message, heartbeat and all, with nothing to show.
    # Far above any handler's own timeouts (a model call's, a fetch's, a large upload's).
    handler_deadline_s: float = 600.0

    @classmethod
    def from_env(cls, node: str) -> "ConsumerConfig":
        """`CONSUMER_<NODE>_<FIELD>` beats `CONSUMER_<FIELD>` beats the default."""
        d = cls()

        def name(field: str) -> list[str]:
            return [f"CONSUMER_{node.upper()}_{field}", f"CONSUMER_{field}"]

        def pick(field: str, default, parse):
            for var in name(field):
                if os.environ.get(var):
                    return parse(var, default)
            return default

        backoff = d.backoff_s
        for var in name("BACKOFF_S"):
            if os.environ.get(var):
                try:
                    backoff = tuple(float(x) for x in os.environ[var].split(","))
                except ValueError:
                    invalid(f"{var} must be comma-separated seconds", None)
                break
        config = cls(
            max_deliver=pick("MAX_DELIVER", d.max_deliver, env_int),
            ack_wait_s=pick("ACK_WAIT_S", d.ack_wait_s, env_float),
            backoff_s=backoff,
            concurrency=pick("CONCURRENCY", d.concurrency, env_int),
            drain_timeout_s=pick("DRAIN_TIMEOUT_S", d.drain_timeout_s, env_float),
            handler_deadline_s=pick("HANDLER_DEADLINE_S", d.handler_deadline_s, env_float),
        )
        if config.max_deliver < 1 or config.concurrency < 1:
            invalid(f"consumer {node}: max_deliver and concurrency must be >= 1", None)
        if config.handler_deadline_s <= 0:
            invalid(f"consumer {node}: HANDLER_DEADLINE_S must be > 0", None)
        return config


LLM_ROLES = ("classifier", "answer", "redirect", "suggestions", "profiler", "extraction", "briefs")


class LLMRoleConfig(msgspec.Struct, kw_only=True):
    role: str
    base_url: str
    api_key: str
    model: str
    fallback_base_url: str = ""
    fallback_api_key: str = ""
    fallback_model: str = ""
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_base_s: float = 0.5
    concurrency: int = 64
    # How structured output is asked for: OpenAI's `json_schema` response format, or
    # `json_object` with the schema beside it (llama-cpp-python's server, the embedded LLM).
    json_mode: str = "json_schema"
    # The conversation history a prompt of this role may carry (shared/history.py: ~4
    # characters a token, oldest turns dropped first, the current turn always kept).
    history_tokens: int = 8000

    def __repr__(self) -> str:
        return without_secrets(self, ("api_key", "fallback_api_key"))

    @classmethod
    def from_env(cls, role: str) -> "LLMRoleConfig":
        """`LLM_<ROLE>_<FIELD>` beats `LLM_<FIELD>`: one endpoint for all roles by default."""
        if role not in LLM_ROLES:
            raise ConfigError(f"unknown LLM role {role!r}; roles are {', '.join(LLM_ROLES)}")

        def get(field: str, default: str) -> str:
            return os.environ.get(f"LLM_{role.upper()}_{field}") or os.environ.get(f"LLM_{field}") or default

        def num(field: str, default: float) -> float:
            raw = get(field, "")
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError:
                return invalid(f"LLM_{field} / LLM_{role.upper()}_{field} must be a number, got {raw!r}", default)

        defaults = cls(role=role, base_url="", api_key="", model="")
        return cls(
            role=role,
            base_url=get("BASE_URL", ""),
            api_key=get("API_KEY", "not-needed"),
            model=get("MODEL", "default"),
            fallback_base_url=get("FALLBACK_BASE_URL", ""),
            fallback_api_key=get("FALLBACK_API_KEY", ""),
            fallback_model=get("FALLBACK_MODEL", ""),
            timeout_s=num("TIMEOUT_S", defaults.timeout_s),
            max_retries=int(num("MAX_RETRIES", defaults.max_retries)),
            backoff_base_s=num("BACKOFF_BASE_S", defaults.backoff_base_s),
            concurrency=int(num("CONCURRENCY", defaults.concurrency)),
            json_mode=_json_mode(get("JSON_MODE", defaults.json_mode)),
            history_tokens=_non_negative(role, "HISTORY_TOKENS", int(num("HISTORY_TOKENS", defaults.history_tokens))),
        )


def _non_negative(role: str, field: str, value: int) -> int:
    if value < 0:
        return invalid(f"LLM_{field} / LLM_{role.upper()}_{field} must be >= 0, got {value}", 0)
    return value


def _json_mode(value: str) -> str:
    if value not in ("json_schema", "json_object"):
        return invalid(f"LLM_JSON_MODE={value!r}: use json_schema or json_object", "json_schema")
    return value
