"""Captioning and VLM filters (GPIC §2.2, §2.4): prompts (``prompts``), the caption mix per
split (``mix``), the stage over staging shards (``stage``) and the evaluation caption set
(``eval_captions``)."""
