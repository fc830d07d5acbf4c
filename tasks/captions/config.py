"""Settings of the captioning and VLM-filter stage (GPIC §2.2, §2.4, App. F) for any
OpenAI-compatible ``/chat/completions`` server. The API key (``api_key``, taken out of the config
before a flow is called like every credential: :mod:`corpusforge.secrets`; or ``api_key_env``) is
never logged, never in a fingerprint, marker or receipt.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from corpusforge.config import StrictModel

CAPTION_TYPES = ("tag", "short", "medium", "long")
# GPIC §2.4: "caption types are assigned with proportions 1% tag, 45% short, 45% medium, and 9% long".
GPIC_MIX = {"tag": 0.01, "short": 0.45, "medium": 0.45, "long": 0.09}
# Word limits above which an answer is over-long (a per-record error): about 3× the length
# each App. F prompt asks for (tag 3–8 tags, short ~12–25 words, medium ~25–60, long 5–7 sentences).
DEFAULT_MAX_WORDS = {"tag": 40, "short": 80, "medium": 180, "long": 450}
NOT_VISIBLE = "NOT VISIBLE."


class EndpointConfig(StrictModel):
    """Where the vision-language model is served and how hard to push it."""

    base_url: str = Field(..., description="e.g. http://vllm:8000/v1 (POST {base_url}/chat/completions).")
    model: str = Field(..., description="Model name sent in every request; part of every completion's key.")
    api_key: str | None = Field(None, description="API key; better: api_key_env. Never written anywhere.")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    concurrency: int = Field(16, ge=1, le=4096, description="Requests in flight at once per staging-shard task.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout (connect, read, write).")
    max_attempts: int = Field(6, ge=1, description="Attempts per request on transient errors (timeouts, "
                                                   "dropped connections, 429, 5xx); other 4xx are not retried.")
    backoff_s: float = Field(1.0, ge=0, description="Backoff before retry n: uniform(0, backoff_s·2^(n-1)) "
                                                    "(full jitter), at most backoff_max_s; a 429's Retry-After "
                                                    "is waited instead when it is longer.")
    backoff_max_s: float = Field(60.0, ge=0)


class QuestionConfig(StrictModel):
    """A yes/no question asked about every kept image (GPIC §2.2 quality and safety filters)."""

    name: str = Field(..., pattern=r"^[a-z][a-z0-9_]{0,39}$", description="Also the filter reason code.")
    prompt: str = Field(..., description="Prompt file: a name in tasks/captions/prompts/ (without .txt) or a path.")
    filter_on: Literal["yes", "no"] = Field("yes", description="The answer that filters the image out.")


class SamplingConfig(StrictModel):
    """Sampling parameters sent with every request (part of every completion's key)."""

    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_length: int = Field(1024, ge=1, description="Sent as max_tokens (the name avoids the secret-word rule).")
    seed: int | None = Field(0, description="Sent as the request's seed (servers that support it); null to omit.")


class CaptioningConfig(StrictModel):
    """Captions in four formats and VLM quality/safety filters through one chat endpoint."""

    endpoint: EndpointConfig
    mix: dict[str, float] = Field(default_factory=lambda: dict(GPIC_MIX),
                                  description="Caption-type proportions over the images the model captions.")
    prompts: dict[str, str] = Field(default_factory=dict,
                                    description="Replace a caption type's prompt: {type: prompt file}. The file's "
                                                "text before a line 'USER MESSAGE' is the system prompt, after it "
                                                "the user message.")
    recaption: bool = Field(False, description="Caption images whose input already has a caption too.")
    questions: list[QuestionConfig] = Field(
        default_factory=lambda: [QuestionConfig(name="low_quality", prompt="low_quality"),
                                 QuestionConfig(name="unsafe", prompt="unsafe")],
        description="Yes/no filter questions asked about every kept image; [] to ask none.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_side: int = Field(768, ge=32, description="Images are resized so their longer side is at most this.")
    jpeg_quality: int = Field(90, ge=1, le=100, description="JPEG quality of the image sent.")
    max_words: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_MAX_WORDS),
                                      description="Answers longer than this (words) are over-long errors.")
    seed: int = Field(0, description="Seed of the caption-type assignment.")
    journal_every: int = Field(64, ge=1, description="Answers are saved in batches of this many (or every "
                                                     "journal_seconds): a killed run re-asks at most these "
                                                     "and the requests in flight.")
    journal_seconds: float = Field(5.0, gt=0)

    @field_validator("mix")
    @classmethod
    def _mix_is_a_distribution(cls, mix: dict[str, float]) -> dict[str, float]:
        unknown = set(mix) - set(CAPTION_TYPES)
        if unknown:
            raise ValueError(f"unknown caption types {sorted(unknown)}; known: {list(CAPTION_TYPES)}")
        if any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
            raise ValueError("caption mix needs non-negative proportions with a positive sum")
        return {t: mix[t] for t in CAPTION_TYPES if t in mix}

    @model_validator(mode="after")
    def _known_types(self) -> CaptioningConfig:
        unknown = (set(self.prompts) | set(self.max_words)) - set(CAPTION_TYPES)
        if unknown:
            raise ValueError(f"unknown caption types {sorted(unknown)}; known: {list(CAPTION_TYPES)}")
        names = [q.name for q in self.questions]
        if len(set(names)) != len(names):
            raise ValueError(f"question names must be unique: {names}")
        return self
