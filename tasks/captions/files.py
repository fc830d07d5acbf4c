"""The captions stage's files (tasks/captions/): who is captioned in which format, the completed
requests, the results and the evaluation caption set. The release reads captions through this
module, and no other of the stage.

::

    work/captions/plan/{shard}.parquet     per staging shard: who the model captions, and in which format
    work/captions/journal/{shard}/{n}.parquet  completed chat requests (the resume state; never asked twice)
    captions/{shard}.parquet           per staged record: caption, origin, filter answers, status
    eval_captions.parquet              the fixed evaluation caption set (test split)
"""

from __future__ import annotations

import pyarrow as pa

CAPTION_ASSIGNMENT_DIR = "work/captions/plan"
CAPTION_JOURNAL_DIR = "work/captions/journal"
CAPTIONS_DIR = "captions"
EVAL_CAPTIONS = "eval_captions.parquet"


def caption_assignment_path(shard: str) -> str:
    return f"{CAPTION_ASSIGNMENT_DIR}/{shard}.parquet"


def caption_journal_dir(shard: str) -> str:
    return f"{CAPTION_JOURNAL_DIR}/{shard}"


def captions_path(shard: str) -> str:
    return f"{CAPTIONS_DIR}/{shard}.parquet"


CAPTION_ASSIGNMENT_SCHEMA = pa.schema([
    ("key", pa.string()), ("sha256", pa.string()),
    ("caption_type", pa.string()),    # assigned (model captions) or the input's
    ("model_caption", pa.bool_()),    # false: the input caption is kept
])
CAPTION_JOURNAL_SCHEMA = pa.schema([
    ("request", pa.string()),         # SHA-256 of (image SHA-256, prompt SHA-256, model, sampling, image size)
    ("content", pa.string()), ("finish_reason", pa.string()), ("error", pa.string()), ("attempts", pa.int16()),
])
CAPTIONS_SCHEMA = pa.schema([
    ("key", pa.string()), ("sha256", pa.string()),
    ("status", pa.string()),          # kept | filtered | error
    ("reason", pa.string()),          # not_visible, a question's name, caption_error: …, question_error: …
    ("caption_type", pa.string()),
    ("caption", pa.string()),         # the model's caption (null: the input caption is kept)
    ("caption_origin", pa.string()),  # input | model:{model}@{prompt SHA-256[:12]}
    ("words", pa.int32()),
    ("vlm_model", pa.string()),       # the model that answered the questions (null: none asked)
    ("vlm_answers", pa.string()),     # JSON {question: {"answer": yes|no|null, "prompt_sha256": …}}
])
EVAL_CAPTIONS_SCHEMA = pa.schema([("key", pa.string()), ("caption_type", pa.string()), ("caption", pa.string()),
                                  ("shard", pa.string())])
