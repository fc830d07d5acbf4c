"""One client for OpenAI-compatible ``POST {base_url}/chat/completions`` endpoints.

Two stages talk to such endpoints: captioning (:mod:`tasks.captions.client`, many
requests in flight on one ``httpx.AsyncClient``) and the contamination judge
(:mod:`tasks.contamination.judge`, one request at a time). Both get the same failure
policy from here, so it is written once:

* *transient* — a timeout, a refused, reset or dropped connection, HTTP 429 or 5xx — is
  retried by tenacity up to ``RetryPolicy.max_attempts``; a request still failing then is
  a :class:`Completion` with ``transient=True`` and the error
  ``gave up after N attempts: <last error>`` (captioning asks again in a later run);
* anything else is a final answer, never retried: another 4xx is the error
  ``HTTP 400: b'<the body's first bytes>'``, a 200 whose body is not a chat completion
  ``malformed response …``.

The API key goes into the ``Authorization`` header only; it is not part of any repr or
error message.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_base, wait_exponential, wait_random_exponential


@dataclass(frozen=True)
class Endpoint:
    """Where to POST (``{base_url}/chat/completions``) and with which key (kept out of repr)."""

    base_url: str
    timeout_s: float
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts and waits for transient errors.

    ``jitter``: wait uniform(0, backoff_s·2^(n-1)) before retry n (full jitter, for many
    clients at once), else exactly backoff_s·2^(n-1); at most ``backoff_max_s`` either
    way. ``honour_retry_after``: a 429's ``Retry-After`` is waited instead when it is
    longer (also at most ``backoff_max_s``)."""

    max_attempts: int
    backoff_s: float
    backoff_max_s: float = float("inf")
    jitter: bool = False
    honour_retry_after: bool = False

    def wait(self) -> wait_base:
        cap = self.backoff_max_s
        plain = (wait_random_exponential(multiplier=self.backoff_s, max=cap) if self.jitter
                 else wait_exponential(multiplier=self.backoff_s, max=cap))
        return _WaitRetryAfter(plain, cap) if self.honour_retry_after else plain

    def options(self) -> dict[str, Any]:
        return {"stop": stop_after_attempt(self.max_attempts), "wait": self.wait(),
                "retry": retry_if_exception_type(TransientError), "reraise": True}


@dataclass(frozen=True)
class Completion:
    """What one request came to, after its retries."""

    content: str | None           # the answer's text (None: no usable answer)
    finish_reason: str | None
    error: str | None             # why there is no usable answer
    transient: bool               # gave up on transient errors: worth asking again later
    attempts: int


class TransientError(Exception):
    """A failure worth another attempt; ``server_wait``: a 429's Retry-After, in seconds."""

    def __init__(self, reason: str, server_wait: float | None = None):
        super().__init__(reason)
        self.reason, self.server_wait = reason, server_wait


class _WaitRetryAfter(wait_base):
    """``plain``, or the server's Retry-After (capped) when that asks for longer."""

    def __init__(self, plain: wait_base, cap: float):
        self.plain, self.cap = plain, cap

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = self.plain(retry_state)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        server = exc.server_wait if isinstance(exc, TransientError) else None
        return max(wait, min(server, self.cap)) if server is not None else wait


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_completion(payload: bytes, preview: int) -> tuple[str | None, str | None, str | None]:
    """(content, finish_reason, error) of a 200 response body; ``preview`` bytes of a
    malformed body go into the error."""
    try:
        choice = json.loads(payload)["choices"][0]
        content = choice["message"]["content"]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, UnicodeDecodeError) as exc:
        return None, None, f"malformed response ({type(exc).__name__}): {payload[:preview]!r}"
    if not isinstance(content, str):
        return None, None, f"malformed response: content is {type(content).__name__}"
    finish = choice.get("finish_reason")
    return content, finish if isinstance(finish, str) else None, None


@contextmanager
def _transient_errors(timeout_s: float) -> Iterator[None]:
    try:
        yield
    except httpx.TimeoutException as exc:
        raise TransientError(f"timeout after {timeout_s:g}s ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:  # refused, reset, dropped mid-response
        raise TransientError(f"connection error ({type(exc).__name__}: {exc})") from exc


def _final(resp: httpx.Response) -> httpx.Response:
    """``resp``, unless its status is worth another attempt."""
    if resp.status_code == 429 or resp.status_code >= 500:
        wait = retry_after(resp.headers.get("retry-after")) if resp.status_code == 429 else None
        raise TransientError(f"HTTP {resp.status_code}", wait)
    return resp


def _completion(resp: httpx.Response, attempts: int, preview: int) -> Completion:
    if resp.status_code != 200:
        return Completion(None, None, f"HTTP {resp.status_code}: {resp.content[:preview]!r}", False, attempts)
    content, finish, bad = parse_completion(resp.content, preview)
    return Completion(content, finish, bad, False, attempts)


def _gave_up(exc: TransientError, attempts: int) -> Completion:
    return Completion(None, None, f"gave up after {attempts} attempts: {exc.reason}", True, attempts)


def complete(http: httpx.Client, endpoint: Endpoint, body: dict[str, Any], retry: RetryPolicy,
             preview: int = 120) -> Completion:
    """One chat completion with its retries (see the module docstring)."""
    data, attempts = json.dumps(body).encode(), 0

    def attempt() -> httpx.Response:
        nonlocal attempts
        attempts += 1
        with _transient_errors(endpoint.timeout_s):
            resp = http.post(endpoint.url, content=data, headers=endpoint.headers)
        return _final(resp)

    try:
        resp = Retrying(**retry.options())(attempt)
    except TransientError as exc:
        return _gave_up(exc, attempts)
    return _completion(resp, attempts, preview)


async def acomplete(http: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], retry: RetryPolicy,
                    preview: int = 120) -> Completion:
    """:func:`complete` on an async client (waits with ``asyncio.sleep``)."""
    data, attempts = json.dumps(body).encode(), 0

    async def attempt() -> httpx.Response:
        nonlocal attempts
        attempts += 1
        with _transient_errors(endpoint.timeout_s):
            resp = await http.post(endpoint.url, content=data, headers=endpoint.headers)
        return _final(resp)

    try:
        resp = await AsyncRetrying(**retry.options())(attempt)
    except TransientError as exc:
        return _gave_up(exc, attempts)
    return _completion(resp, attempts, preview)
