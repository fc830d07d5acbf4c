"""An async client for OpenAI-compatible ``/chat/completions`` with one image per request.

:func:`ask_all` runs the requests through a fixed pool of ``concurrency`` worker coroutines (so
the bound holds by construction) and hands ``on_done`` each :class:`Outcome` as it arrives (the
stage journals it at once). Retries are :mod:`corpusforge.chat`'s, shared with the contamination
judge; a request still failing on transient errors after its attempts is an outcome with
``transient=True``, which the stage does not journal, so a later run asks again. Each image is
decoded and encoded once for all of its requests, on a thread (Pillow releases the GIL), and only
while some request of it is in flight or next. The API key goes into the ``Authorization``
header only; no error message carries headers.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from PIL import Image, ImageOps

from corpusforge.chat import Completion, Endpoint, RetryPolicy, acomplete
from tasks.captions.config import EndpointConfig, SamplingConfig
from tasks.captions.prompts import Prompt


@dataclass(frozen=True)
class Request:
    key: str                      # the completion key (image, prompt, model, sampling): see tasks.captions.stage
    image_sha256: str
    prompt: Prompt
    load: Callable[[], bytes]     # the image's original bytes (read on a worker thread when needed)


@dataclass(frozen=True)
class Outcome(Completion):
    """What one request came to (``transient``: ask it again in a later run), by its key."""

    key: str


_MIME = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}


def encode_image(data: bytes, max_side: int, quality: int) -> str:
    """A base64 data URL of the image, longer side ≤ ``max_side``.

    An image already small enough and stored upright (no EXIF rotation) is sent as its
    original bytes — no decode, no second lossy encode (GPIC's mean image, 587×479, fits
    the default 768); anything else is oriented, resized and sent as JPEG."""
    with Image.open(io.BytesIO(data)) as img:
        try:
            orientation = img.getexif().get(0x0112, 1)
        except Exception:  # noqa: BLE001 - a broken EXIF block: re-encode without trusting it
            orientation = None
        if img.format in _MIME and max(img.size) <= max_side and orientation == 1:
            return f"data:{_MIME[img.format]};base64," + base64.b64encode(data).decode("ascii")
        if img.format == "JPEG":
            img.draft("RGB", (max_side, max_side))  # DCT scaling: decode at ≥ the target size
        img = ImageOps.exif_transpose(img).convert("RGB")
        img.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def request_body(model: str, prompt: Prompt, image_url: str, sampling: SamplingConfig) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "system", "content": prompt.system},
                     {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url}},
                                                  {"type": "text", "text": prompt.user}]}],
        "temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": sampling.max_length}
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


async def ask_all(requests: list[Request], endpoint: EndpointConfig, sampling: SamplingConfig,
                  api_key: str | None, max_side: int, jpeg_quality: int,
                  on_done: Callable[[Outcome], None]) -> None:
    """Ask every request, ``endpoint.concurrency`` at a time; ``on_done`` gets each outcome.

    Requests of one image should be adjacent in ``requests``: its encoded image is kept
    only until its last request has been sent."""
    remaining = Counter(r.image_sha256 for r in requests)  # requests left to send per image
    encoded: dict[str, asyncio.Future[str]] = {}
    queue = iter(requests)
    timeout = httpx.Timeout(endpoint.timeout_s)
    limits = httpx.Limits(max_connections=endpoint.concurrency, max_keepalive_connections=endpoint.concurrency)

    async def image_url(r: Request) -> str:
        if r.image_sha256 not in encoded:
            encoded[r.image_sha256] = asyncio.ensure_future(
                asyncio.to_thread(lambda: encode_image(r.load(), max_side, jpeg_quality)))
        future = encoded[r.image_sha256]
        remaining[r.image_sha256] -= 1
        if remaining[r.image_sha256] == 0:
            del encoded[r.image_sha256]
        return await future

    chat = Endpoint(endpoint.base_url, endpoint.timeout_s, api_key)
    retry = RetryPolicy(endpoint.max_attempts, endpoint.backoff_s, endpoint.backoff_max_s, jitter=True,
                        honour_retry_after=True)

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        async def ask(r: Request, url: str) -> Outcome:
            c = await acomplete(http, chat, request_body(endpoint.model, r.prompt, url, sampling), retry)
            return Outcome(c.content, c.finish_reason, c.error, c.transient, c.attempts, key=r.key)

        async def worker() -> None:
            for r in queue:  # a shared iterator: each request is taken by exactly one worker
                try:
                    url = await image_url(r)
                except Exception as exc:  # noqa: BLE001 - an unreadable image is that request's error
                    on_done(Outcome(None, None, f"image not encodable: {type(exc).__name__}: {exc}", False, 0,
                                    key=r.key))
                    continue
                on_done(await ask(r, url))

        await asyncio.gather(*(worker() for _ in range(min(endpoint.concurrency, len(requests)) or 1)))
