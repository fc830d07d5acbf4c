"""Typed settings of the statistics and metrics, shared by both flows.

Defaults are GPIC's evaluation protocol as its public port implements it (DINOv2
ViT-L/14 without registers, "gpic_eval" preprocessing, k = 5, PRDC on ≤ 10,000 rows per
set, polynomial-kernel MMD over 100 subsets of 1,000, 50,000 generated images). Any
other value is allowed and is written into the outputs as a protocol deviation.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from corpusforge.config import StrictModel
from tasks.shared.features.config import ModelSpec
from tasks.shared.provenance import PROTOCOL_ARCH, PROTOCOL_MODES

RECOMMENDED_GENERATED = 50_000


def protocol_model(mode: str = "paper") -> ModelSpec:
    """The feature model of GPIC's evaluation protocol in ``mode``."""
    return ModelSpec(name="dinov2", arch=PROTOCOL_ARCH, preprocessing=PROTOCOL_MODES[mode])


class SampleConfig(StrictModel):
    """The feature rows stored with reference statistics for PRDC and MMD."""

    max_rows: int = Field(10_000, ge=0, title="Stored reference rows",
                          description="Rows kept per split (float32, 10,000 × 1024 × 4 B = 40 MB), as many "
                                      "as the port's PRDC subsample.")
    seed: int = Field(0, title="Sample seed",
                      description="Rows with the smallest blake2b(seed:key) are kept: independent of "
                                  "sharding and worker count.")


class MetricsConfig(StrictModel):
    """How generated features are compared with a reference."""

    fd_method: Literal["sqrtm", "eigh"] = Field(
        "sqrtm", title="Matrix square root",
        description="sqrtm: scipy.linalg.sqrtm(Σ1Σ2) with the port's 1e-6 fallback (default); "
                    "eigh: the symmetric form √(√Σ1 Σ2 √Σ1).")
    k: int = Field(5, ge=1, title="PRDC neighbourhood size")
    prdc_max_samples: int | None = Field(10_000, ge=2, title="PRDC rows per set",
                                         description="Both sets subsampled at random to at most this; empty for all.")
    mmd_kernel: Literal["polynomial", "rbf"] = Field(
        "polynomial", title="MMD kernel",
        description="polynomial: (xᵀy/d + 1)³ as in the port; rbf: exp(−‖x−y‖²/2σ²) (for CLIP features).")
    mmd_rbf_sigma: float = Field(10.0, gt=0, title="RBF bandwidth σ")
    mmd_subsets: int = Field(100, ge=1, title="MMD subsets")
    mmd_subset_size: int = Field(1000, ge=2, title="MMD subset size")
    seed: int = Field(0, title="Seed of the PRDC and MMD subsampling")
    min_generated: int = Field(RECOMMENDED_GENERATED, ge=1, title="Recommended generated images",
                               description="Fewer generated images is recorded as a deviation (the port warns).")

    def deviations(self) -> list[str]:
        """Settings that differ from the port's, in words."""
        out = []
        if self.fd_method != "sqrtm":
            out.append(f"FD matrix square root by {self.fd_method} instead of the port's scipy sqrtm "
                       "(same value to ~1e-8 relative, no fallback offset)")
        if self.k != 5:
            out.append(f"PRDC with k={self.k} instead of 5")
        if self.prdc_max_samples != 10_000:
            out.append(f"PRDC on at most {self.prdc_max_samples} rows per set instead of 10,000")
        if self.mmd_kernel != "polynomial":
            out.append(f"MMD with an RBF kernel (σ={self.mmd_rbf_sigma}) instead of the cubic polynomial")
        if (self.mmd_subsets, self.mmd_subset_size) != (100, 1000):
            out.append(f"MMD over {self.mmd_subsets} subsets of {self.mmd_subset_size} instead of 100 of 1,000")
        return out
