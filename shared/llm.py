"""LLM calls through the `openai` package, one configuration per role.

Transient failures (rate limit, connection, timeout, 5xx) are retried with exponential
backoff; others are not. A stream is only retried before its first token: once text
has reached the visitor, a failure is final. Every call, successful or not, is handed
to `record` as an `events.LLMCall`, which nodes store as an `LLMCallRecorded` event so a
conversation can be replayed without the provider, and counted in the `concierge_llm_*`
metrics (shared/metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx2
import msgspec
import openai
from openai import AsyncOpenAI, DefaultAioHttpClient

from shared import metrics
from shared.config import LLM_ROLES, ConfigError, LLMRoleConfig
from shared.node import PermanentError
from shared.events import LLMCall, LLMRole

log = logging.getLogger(__name__)


class LLMError(PermanentError):
    """The call failed for good (after retries, or a non-retryable error)."""

    def __init__(self, message: str, *, after_tokens: bool = False, transient: bool = False):
        super().__init__(message)
        self.after_tokens = after_tokens
        self.transient = transient


Recorder = Callable[[LLMCall], Awaitable[None]]

TRANSIENT = (openai.RateLimitError, openai.APIConnectionError, openai.InternalServerError)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT) or isinstance(exc, (asyncio.TimeoutError, OSError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500
    # A transport error while reading the stream (the connection dropped) is a connection error.
    return not isinstance(exc, (openai.OpenAIError, LLMError, msgspec.MsgspecError))


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta = msgspec.field(default_factory=_Delta)


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: dict | None = None
    model: str = ""  # the model that answered, as the provider names it (a dated snapshot of an alias)
    system_fingerprint: str | None = None  # the provider's backend configuration (OpenAI)


class _Message(msgspec.Struct):
    content: str | None = None


class _WholeChoice(msgspec.Struct):
    message: _Message = msgspec.field(default_factory=_Message)


class _Completion(msgspec.Struct):
    choices: list[_WholeChoice] = []
    usage: _Usage | None = None
    model: str = ""
    system_fingerprint: str | None = None


CHAT_COMPLETIONS = "/chat/completions"
_completion_decoder = msgspec.json.Decoder(_Completion)
_DONE = object()
_chunk_decoder = msgspec.json.Decoder(_Chunk)


def _parse_line(line: bytes):
    """One SSE line of a chat completion stream: a chunk, `_DONE`, or None (not data)."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return _DONE
    try:
        chunk = _chunk_decoder.decode(data)
    except UnicodeDecodeError:  # bytes that are not UTF-8 read as U+FFFD, as a text decoder would
        chunk = _chunk_decoder.decode(data.decode(errors="replace"))
    if chunk.error:
        raise LLMError(f"provider error in stream: {chunk.error}")
    return chunk


async def _lines(response: httpx2.Response) -> AsyncIterator[bytes]:
    """The body's lines as bytes, without their ends (CRLF, LF or CR, as SSE allows; no such
    byte is ever inside a UTF-8 character, and msgspec decodes bytes). Not httpx's
    `aiter_lines`: its text and line generators, left unfinished at `[DONE]`, were each
    closed by the event loop's async-generator finalizer (a wake-up and a task apiece, three
    a streamed call); `aiter_bytes` closes what it reads from, and the caller closes this
    one (`aclosing`)."""
    rest = b""
    async with contextlib.aclosing(response.aiter_bytes()) as body:
        async for data in body:
            lines = (rest + data).splitlines(keepends=True)
            # An unended last line waits for the rest; so does one ended by CR, whose LF may
            # come in the next piece.
            rest = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
            for line in lines:
                yield line.rstrip(b"\r\n")
    if rest:
        yield rest.rstrip(b"\r\n")


@dataclass
class _Endpoint:
    name: str  # primary | fallback
    base_url: str
    model: str
    config: LLMRoleConfig  # timeouts, retries, concurrency
    client: AsyncOpenAI
    slots: asyncio.Semaphore


# Every endpoint's openai client made in this process, so that a stopping service (and the
# tests, at their end) close their connections: aiohttp warns about a session left open.
_clients: "weakref.WeakSet[AsyncOpenAI]" = weakref.WeakSet()


async def close_clients() -> None:
    """Close the HTTP connections of every LLM client this process made."""
    for client in list(_clients):
        with contextlib.suppress(Exception):
            await client.close()
    _clients.clear()


def _client(url: str, key: str, timeout_s: float) -> AsyncOpenAI:
    # openai's aiohttp transport, not its default httpx one: the same streamed answer costs
    # the client less CPU over aiohttp (docs/benchmarks-history.md).
    client = AsyncOpenAI(base_url=url, api_key=key, timeout=timeout_s, max_retries=0,
                         http_client=DefaultAioHttpClient())
    _clients.add(client)
    return client


@dataclass
class LLMClient:
    roles: dict[str, LLMRoleConfig]
    _endpoints: dict[str, list[_Endpoint]] = field(default_factory=dict)

    @classmethod
    def from_env(cls, roles: tuple[str, ...] = LLM_ROLES) -> "LLMClient":
        return cls({role: LLMRoleConfig.from_env(role) for role in roles})

    def history_tokens(self, role: str) -> int:
        """The role's history budget, for `shared.history.window`."""
        return self.roles[role].history_tokens

    def configured(self, role: str) -> bool:
        config = self.roles.get(role)
        return bool(config and config.base_url)

    def role_record(self, role: str) -> LLMRole:
        """The role as a node's output records it (`events.LLMRole`): its model and prompt
        settings, or an empty model when it has no endpoint."""
        if not self.configured(role):
            return LLMRole()
        config = self.roles[role]
        return LLMRole(model=config.model, history_tokens=config.history_tokens, json_mode=config.json_mode)

    def prepare(self) -> "LLMClient":
        """Make every configured role's clients now, at the service's start: an openai client
        loads its TLS trust store when it is made, which the first turn that used a role
        would otherwise wait for. Returns the client."""
        for role in self.roles:
            if self.configured(role):
                self.endpoints(role)
        return self

    def endpoints(self, role: str) -> list[_Endpoint]:
        """The role's primary endpoint, then its fallback when one is configured."""
        if role not in self._endpoints:
            config = self.roles.get(role)
            if config is None:
                raise ConfigError(f"LLM role {role!r} is not configured")
            if not config.base_url:
                raise ConfigError(f"no LLM endpoint for role {role!r}: set LLM_BASE_URL (or LLM_{role.upper()}_BASE_URL)")
            targets = [("primary", config.base_url, config.api_key, config.model)]
            if config.fallback_base_url:
                targets.append(("fallback", config.fallback_base_url, config.fallback_api_key or config.api_key,
                                config.fallback_model or config.model))
            self._endpoints[role] = [
                _Endpoint(name, url, model, config,
                          _client(url, key, config.timeout_s),
                          asyncio.Semaphore(config.concurrency))
                for name, url, key, model in targets
            ]
        return self._endpoints[role]

    async def stream(
        self, role: str, messages: list[dict[str, Any]], record: Recorder, *, _whole: bool = False, **params: Any
    ) -> AsyncIterator[str]:
        """Yield text deltas of a chat completion: from the primary endpoint, or from the
        fallback when the primary fails transiently (connection, timeout, 5xx) before any text.
        (`_whole`: one non-streamed request, yielded as a single piece; see `complete`.)"""
        endpoints = self.endpoints(role)
        rec = LLMCall(role=role, model=endpoints[0].model, base_url=endpoints[0].base_url, messages=messages,
                      params=params)
        started = time.perf_counter()
        parts: list[str] = []
        try:
            for ep in endpoints:
                rec.model, rec.base_url, rec.fallback_used = ep.model, ep.base_url, ep.name == "fallback"
                try:
                    async for delta in self._stream_endpoint(ep, messages, params, rec, parts, started, _whole):
                        yield delta
                    return
                except LLMError as exc:
                    if exc.after_tokens or not exc.transient or ep is endpoints[-1]:
                        raise
                    log.warning("primary LLM endpoint failed; using the fallback", extra={"role": role, "error": str(exc)})
        except BaseException as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            rec.response_text = "".join(parts)
            rec.latency_ms = (time.perf_counter() - started) * 1000
            metrics.observe_llm_call(rec)
            await asyncio.shield(record(rec))

    async def _stream_endpoint(self, ep: _Endpoint, messages, params, rec: LLMCall, parts: list[str],
                               started: float, whole: bool) -> AsyncIterator[str]:
        role = rec.role
        async with ep.slots:
            for attempt in range(1, ep.config.max_retries + 2):
                rec.attempts += 1
                try:
                    # The request goes out through the client's own `post` (its documented
                    # way to any endpoint: the same base URL, headers, auth and errors) with
                    # the body as it is sent, and the raw SSE lines are decoded with msgspec:
                    # `chat.completions.create` validates and transforms its parameters (its
                    # TypedDicts' annotations walked for every call; a structured call's
                    # whole JSON schema) and its per-chunk pydantic models cost more CPU
                    # than everything else a token goes through.
                    # A stream ends with a chunk of token usage (`include_usage`): without
                    # it, a streamed call's record would have none.
                    body = {"model": ep.model, "messages": messages, **params, "stream": not whole}
                    if not whole:
                        body["stream_options"] = {"include_usage": True}
                    response = await ep.client.post(CHAT_COMPLETIONS, body=body, cast_to=httpx2.Response,
                                                    stream=not whole)
                    try:
                        if whole:
                            answer = _completion_decoder.decode(response.content)
                            _served(rec, answer)
                            if answer.usage:
                                rec.usage = {"prompt_tokens": answer.usage.prompt_tokens,
                                             "completion_tokens": answer.usage.completion_tokens}
                            text = answer.choices[0].message.content if answer.choices else None
                            if text:
                                rec.ttft_ms = (time.perf_counter() - started) * 1000
                                parts.append(text)
                                yield text
                            return
                        async with contextlib.aclosing(_lines(response)) as lines:
                            async for line in lines:
                                chunk = _parse_line(line)
                                if chunk is None:
                                    continue
                                if chunk is _DONE:
                                    break
                                if not rec.served_model:
                                    _served(rec, chunk)
                                if chunk.usage:
                                    rec.usage = {
                                        "prompt_tokens": chunk.usage.prompt_tokens,
                                        "completion_tokens": chunk.usage.completion_tokens,
                                    }
                                delta = chunk.choices[0].delta.content if chunk.choices else None
                                if delta:
                                    if not parts:
                                        rec.ttft_ms = (time.perf_counter() - started) * 1000
                                    parts.append(delta)
                                    yield delta
                    finally:
                        await response.aclose()
                    return
                except Exception as exc:
                    if parts:
                        raise LLMError(f"{role} stream broke after {len(parts)} chunks: {exc}", after_tokens=True) from exc
                    transient = is_transient(exc)
                    if not transient or attempt > ep.config.max_retries:
                        raise LLMError(f"{role} call to the {ep.name} endpoint failed after {attempt} attempt(s): {exc}",
                                       transient=transient) from exc
                    await asyncio.sleep(_backoff(ep.config.backoff_base_s, attempt))

    async def complete(self, role: str, messages: list[dict[str, Any]], record: Recorder, **params: Any) -> str:
        """The whole answer in one non-streamed request: for callers that read it all anyway
        (structured output), far less client CPU than parsing a stream of chunks."""
        return "".join([part async for part in self.stream(role, messages, record, _whole=True, **params)])

    async def structured(self, role: str, messages: list[dict[str, Any]], record: Recorder, cls: type, **params: Any):
        """A `cls` Struct from the model: JSON-schema output, decoded with msgspec; one repair
        round (the invalid answer and the decode error go back to the model), then
        `msgspec.ValidationError` / `DecodeError` for the caller to handle."""
        schema = object_schema(cls)
        if self.roles[role].json_mode == "json_object":
            response_format = {"type": "json_object", "schema": schema}
        else:
            response_format = {"type": "json_schema", "json_schema": {"name": cls.__name__.lower(), "schema": schema}}
        decoder = msgspec.json.Decoder(cls)
        text = await self.complete(role, messages, record, response_format=response_format, **params)
        try:
            return decoder.decode(text)
        except msgspec.MsgspecError as exc:
            repair = messages + [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"That was not valid JSON for the schema ({exc}). "
                                            "Answer with the JSON object only."},
            ]
            text = await self.complete(role, repair, record, response_format=response_format, **params)
            return decoder.decode(text)


def role_records(llm: "LLMClient | None", roles: tuple[str, ...]) -> dict[str, LLMRole]:
    """`roles` as a node made with `llm` (None: no client, so no endpoint) records them on
    its output, for a replay to re-run it the same way."""
    return {role: llm.role_record(role) if llm is not None else LLMRole() for role in roles}


@functools.cache
def object_schema(cls: type) -> dict:
    """msgspec's JSON schema of a Struct as the object itself (providers want no top-level $ref).
    Made once per class (building it walks the type's annotations); callers do not change it."""
    schema = msgspec.json.schema(cls)
    if "$ref" in schema:
        schema = {**schema["$defs"][schema["$ref"].rsplit("/", 1)[-1]], "$defs": schema["$defs"]}
    return schema


def _served(rec: LLMCall, answer: _Chunk | _Completion) -> None:
    """What the provider says answered: the model's exact name and its backend's fingerprint,
    the versions a replay of this call depends on."""
    rec.served_model, rec.system_fingerprint = answer.model, answer.system_fingerprint or ""


def _backoff(base: float, attempt: int) -> float:
    return base * (2 ** (attempt - 1)) * (0.8 + 0.4 * random.random())
