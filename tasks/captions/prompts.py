"""Prompt files: GPIC's four captioning prompts (App. F, Figs. F.1–F.4) and the filter questions.

A prompt file is plain text; the part before a line ``USER MESSAGE`` is the system
prompt, the part after it the user message sent with the image (the layout of App. F's
figures). A prompt's identity is the SHA-256 of its file's bytes: it is part of every
completion's key, so editing a prompt asks the model again for exactly the images that
use it, and the manifest records which prompt made each caption.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tasks.captions.config import CAPTION_TYPES, CaptioningConfig

PROMPTS_DIR = Path(__file__).parent / "prompts"
USER_MARKER = "USER MESSAGE"


@dataclass(frozen=True)
class Prompt:
    name: str
    system: str
    user: str
    sha256: str


def load_prompt(name: str, ref: str) -> Prompt:
    """``ref``: a bundled prompt's name (``short``) or a file path."""
    path = PROMPTS_DIR / f"{ref}.txt" if "/" not in ref and not ref.endswith(".txt") else Path(ref)
    if not path.is_file():
        raise FileNotFoundError(f"prompt {name!r}: no file {path}")
    data = path.read_bytes()
    text = data.decode("utf-8")
    system, sep, user = text.partition(f"\n{USER_MARKER}\n")
    if not sep or not user.strip():
        raise ValueError(f"prompt {name!r} ({path}): needs a line '{USER_MARKER}' followed by the user message")
    return Prompt(name, system.strip(), user.strip(), hashlib.sha256(data).hexdigest())


def caption_prompts(cfg: CaptioningConfig) -> dict[str, Prompt]:
    """The prompt of every caption type with a non-zero share in the mix."""
    return {t: load_prompt(t, cfg.prompts.get(t, t)) for t in CAPTION_TYPES if cfg.mix.get(t, 0) > 0}


def question_prompts(cfg: CaptioningConfig) -> dict[str, Prompt]:
    return {q.name: load_prompt(q.name, q.prompt) for q in cfg.questions}
