"""Typed configuration of the near-duplicate stage (GPIC §2.3, Fig. 5, Fig. 6, App. D).

Thresholds follow GPIC (the rule they feed: tasks/graph/two_tier.py). All comparisons are
strict (``>``) as in the paper's main text; App. D's caption writes ">= 0.9625", the main text
"above 0.9625" — we follow the main text and make the threshold configurable.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, WithJsonSchema, model_validator

from corpusforge.config import Similarity, StrictModel
from tasks.shared.features.config import flip_symmetric
from tasks.shared.ivf import IVF_TRAIN_PER_LIST

GPIC_SOURCE_POOL = 110_569_761  # images in GPIC's source pool (Fig. 6 extrapolation target)

CALIBRATION_BINS: list[tuple[float, float]] = [
    (0.75, 0.85), (0.85, 0.90), (0.90, 0.95), (0.95, 0.9625), (0.9625, 0.999), (0.999, 1.0)]

# Geometric verification's local features and RANSAC (tasks/graph/verify.py): implementation
# details the verification thresholds were calibrated with, so not settings; changing one
# needs a new calibration (README "Near-duplicates").
VERIFY_MAX_SIDE = 512  # px: the longer side local features are computed at
ORB_FEATURES = 1000  # keypoints per image
ORB_FAST_THRESHOLD = 7  # lower finds corners on smooth pictures (OpenCV's default is 20)
LOWE_RATIO = 0.8
RANSAC_PX = 5.0  # reprojection threshold, px at VERIFY_MAX_SIDE
RANSAC_ITERS = 2000
RANSAC_SEED = 0  # cv2.setRNGSeed before every pair
# The same under the names they had as settings (graph/summary.json and the verify-pair
# fingerprints still record them so).
VERIFY_FIXED = {"max_side": VERIFY_MAX_SIDE, "n_features": ORB_FEATURES, "fast_threshold": ORB_FAST_THRESHOLD,
                "ratio": LOWE_RATIO, "ransac_px": RANSAC_PX, "ransac_iters": RANSAC_ITERS, "seed": RANSAC_SEED}


class IndexAdvanced(StrictModel):
    """Index knobs that rarely need changing: PQ rescoring and the IVF training sample's size."""

    pq_rescore_margin: float = Field(
        0.05, ge=0, le=1, title="PQ search margin",
        description="PQ candidates are searched at threshold - margin and rescored with exact vectors.")
    max_train: int = Field(2_000_000, ge=1000, title="Most training vectors",
                           description="Cap on the deterministic training sample.")


class IndexConfig(StrictModel):
    """How the FAISS similarity index is built and searched."""

    config_section: ClassVar[str] = "near_dedup.index"
    renamed_keys: ClassVar[dict[str, str]] = {k: f"advanced.{k}" for k in IndexAdvanced.model_fields}
    retired_keys: ClassVar[dict[str, Any]] = {"train_per_list": IVF_TRAIN_PER_LIST}

    kind: Literal["auto", "flat", "ivf"] = Field(
        "auto", title="Index kind",
        description="flat = exact IndexFlatIP; ivf = inverted file (approximate); auto = flat up to "
                    "flat_max_vectors, ivf above.")
    flat_max_vectors: int = Field(200_000, ge=1, title="Largest corpus for exact search",
                                  description="auto picks the exact index up to this many vectors.")
    search: Literal["knn", "range"] = Field(
        "knn", title="Search mode",
        description="knn: the k nearest neighbours of every vector, kept when >= edge_min_similarity; "
                    "range: every neighbour >= edge_min_similarity (no cap per node).")
    k: int = Field(32, ge=2, title="Neighbours per query (knn)", description="Includes the query itself.")
    nlist: int | None = Field(None, ge=1, title="IVF lists",
                              description="Empty: 4*sqrt(N) rounded up to a power of two, within [16, 65536].")
    nprobe: int = Field(16, ge=1, title="IVF lists probed per query")
    storage: Literal["flat", "sqfp16", "pq"] = Field(
        "sqfp16", title="IVF vector storage",
        description="flat: float32 (4 B/dim); sqfp16: float16 (2 B/dim, exact for float16 features); "
                    "pq: product quantisation (pq_m bytes/vector, approximate scores, rescored exactly).")
    pq_m: int = Field(64, ge=1, title="PQ sub-quantisers", description="Bytes per vector with 8-bit codes.")
    use_gpu: bool = Field(True, title="Use GPUs when FAISS sees them",
                          description="Needs faiss-gpu; range search falls back to the CPU.")
    faiss_threads: int | None = Field(None, ge=1, title="FAISS OpenMP threads",
                                      description="Empty: FAISS's default (all cores).")
    advanced: IndexAdvanced = Field(default_factory=IndexAdvanced, title="Advanced index settings")


class CollisionConfig(StrictModel):
    """Fig. 6 collision models: removals on nested subsets, fitted as D(N) = A * N^beta."""

    enabled: bool = True
    fractions: list[float] = Field(
        [0.01, 0.0197, 0.0388, 0.0764, 0.15, 0.30], min_length=2, title="Subset fractions",
        description="Nested random subsets as fractions of the corpus (GPIC: 108K to 3.4M of 110M).")
    thresholds: list[Similarity] = Field([0.75, 0.80, 0.85, 0.90, 0.95], min_length=1,
                                    title="Similarity thresholds", description="Pairs > theta are connected.")
    target_size: int = Field(GPIC_SOURCE_POOL, ge=1, title="Extrapolation target size")
    max_subset_vectors: int = Field(2_000_000, ge=2, title="Largest subset held in memory",
                                    description="Guards one process: above it all fractions are scaled down "
                                                "together. A corpus up to this size is also counted whole, "
                                                "to show the actual removals beside the fit's prediction.")
    min_fit_points: int = Field(3, ge=3, title="Fewest subset sizes in a fit",
                                description="Subset sizes with removals > 0 needed to fit (two always fit exactly).")
    min_fit_decades: float = Field(1.0, ge=0, title="Least span of a fit (decades)",
                                   description="log10(largest / smallest) of the fitted subset sizes (GPIC: 1.5).")
    max_extrapolation: float = Field(
        100.0, ge=1, title="Furthest prediction (x largest fitted subset)",
        description="No prediction beyond this multiple of the largest fitted subset size "
                    "(GPIC: 110.6M / 3.4M = 33x).")

    @model_validator(mode="after")
    def _sorted(self) -> CollisionConfig:
        if sorted(set(self.fractions)) != self.fractions or not all(0 < f <= 1 for f in self.fractions):
            raise ValueError("fractions must be strictly increasing, in (0, 1]")
        if sorted(set(self.thresholds)) != self.thresholds:
            raise ValueError("thresholds must be strictly increasing")
        return self


class CalibrationConfig(StrictModel):
    """Fig. 5 calibration sheets: sampled pairs per similarity bin, side by side."""

    enabled: bool = True
    pairs_per_bin: int = Field(8, ge=0, title="Pairs per bin")
    # A plain array schema per bin: the Prefect UI's form shows a 2-tuple's prefixItems as a
    # list with an error under every pair; pydantic still checks the pairs.
    bins: list[Annotated[tuple[Similarity, Similarity],
                         WithJsonSchema({"type": "array", "items": {"type": "number"}})]] = Field(
                                            CALIBRATION_BINS, title="Similarity bins",
                                            description="[lo, hi) each; the last bin includes hi.")
    thumb_px: int = Field(160, ge=16, le=1024, title="Thumbnail size (px)")


class VerificationConfig(StrictModel):
    """Geometric verification of review-band pairs (tasks/graph/review.py, tasks/graph/verify.py).

    Thresholds calibrated on a held-out sample (``write_sample_corpus(2000, seed=1)``), never
    on the one bench/README.md's figures are measured on (seed 0); see docs/near-duplicates.md."""

    config_section: ClassVar[str] = "near_dedup.verification"
    renamed_keys: ClassVar[dict[str, str]] = {"review_low": "review_min_similarity"}
    retired_keys: ClassVar[dict[str, Any]] = VERIFY_FIXED

    mode: Literal["auto", "gpic_exact", "gpic_verified"] = Field(
        "auto", title="Removal rule",
        description="gpic_exact: GPIC's two-tier rule untouched. gpic_verified: below pair_removal_above a "
                    "similarity alone links nothing; pairs with similarity in [review_min_similarity, "
                    "pair_removal_above] chosen for review (review_k) that pass geometric verification link their "
                    "images and are removed like tier-1 pairs (reason verified_pair). auto: gpic_verified for the "
                    "weight-free descriptor (wfd*) and for any model with calibrate: auto, gpic_exact for learned "
                    "models otherwise (on real photographs a self-calibrated SSCD int8 finds about half the planted "
                    "copies with GPIC's rule alone, over 90 % with verification: bench/near_dup_build.py).")
    review_min_similarity: float = Field(
        0.5, gt=-1, lt=1, title="Review band: least similarity (>=)",
        description="Decides which pairs may be verified: those with similarity >= this and <= "
                    "pair_removal_above; the graph search reaches down to it. Held-out sample: lowest planted "
                    "copy 0.537.")
    review_k: int = Field(7, ge=1, title="Review partners per image",
                          description="A band pair is verified when it is among the review_k most similar band "
                                      "pairs of either image: at most N * review_k checks. Held-out sample: the "
                                      "smallest k that reaches every planted copy in the band.")
    min_inliers: int = Field(10, ge=4, title="Fewest inliers of a verified pair",
                             description="Held-out sample: fewest of a planted copy 10.")
    min_overlap: float = Field(0.75, ge=0, le=1, title="Least overlap after alignment",
                               description="Share of the smaller picture the other covers: a crop, pad or caption "
                                           "bar keeps one picture inside the other (held-out sample: planted copies "
                                           "0.97 and up); a square turned 10 degrees in its own frame keeps 0.82.")
    min_agreement: float = Field(0.5, ge=-1, le=1, title="Least pixel agreement after alignment",
                                 description="Median tile NCC of the aligned pictures. Held-out sample: unrelated "
                                             "pairs with >= 10 inliers and overlap >= 0.75 reach 0.31, planted "
                                             "copies 0.79 and up.")
    min_agreeing_tiles: float = Field(
        0.7, ge=0, le=1, title="Least share of agreeing tiles after alignment",
        description="Share of the textured tiles of an 8 x 8 grid over the aligned overlap whose NCC is >= 0.5: "
                    "two photographs of one subject (a stereo pair, another pose, another viewpoint) agree on their "
                    "background but not everywhere. Real photographs (bench/README.md): verified copies 0.81 and up, "
                    "different photographs of one subject 0.62 at most; held-out sample: copies 0.75 and up.")
    colourless_min_similarity: float = Field(
        0.6, ge=-1, le=1, title="Least similarity of a verified pair without colour",
        description="When either picture has no colour, a pair is verified only above this global similarity as "
                    "well: with the colour gone, local geometry of one subject under one light is weak evidence. "
                    "wfd scale; real photographs: greyscale copies 1.00, other photographs of one subject 0.50. "
                    "Waived at near-perfect pixel agreement (colourless_waiver_agreement and _agreeing).")
    colourless_waiver_agreement: float = Field(
        0.95, ge=-1, le=1, title="Colourless floor waived: least median agreement",
        description="A colourless pair whose median tile NCC is >= this and whose agreeing share is >= "
                    "colourless_waiver_agreeing is verified whatever its global similarity: an aligned copy of a "
                    "greyscale original (crop, turn). Real photographs, seeds 0-4: such copies 0.95 and up, unrelated "
                    "colourless pairs that align 0.80 at most, two photographs of one calf 0.68.")
    colourless_waiver_agreeing: float = Field(
        0.9, ge=0, le=1, title="Colourless floor waived: least agreeing share",
        description="See colourless_waiver_agreement. Real photographs, seeds 0-4: copies the floor refused 1.00 "
                    "(0.86 for copies of copies), unrelated colourless pairs that align 0.72 at most.")
    max_parallax: float = Field(
        0.25, ge=0, le=1, title="Most share of tiles that agree only shifted",
        description="Of the fine tiles that agree within 4 px of where the alignment puts them, the share whose "
                    "best match lies >= 2 px away and beats the aligned NCC by >= 0.1: a copy is one planar "
                    "transform, two viewpoints of a 3-D scene (a stereo pair) differ by parallax. Real photographs, "
                    "seeds 0-4, both ways: planted copies 0.18 at most but one at 0.36; a stereo pair's left "
                    "photograph and 70 % crops of its right one 0.34-0.64 (those that pass every other criterion). "
                    "Pictures of one group related by more than a similarity (a stretched copy and a crop, a mirrored "
                    "one, video frames) reach 0.43 and are refused, linked through their original.")

    def recorded(self) -> dict[str, Any]:
        """The settings and the fixed local-feature values under the names graph/summary.json and
        the verify-pair fingerprints have always used (``review_low``, ``ransac_iters`` …), so
        those stay byte-identical."""
        fields = self.model_dump(mode="json", exclude={"review_min_similarity"})
        return {**fields, "review_low": self.review_min_similarity, **VERIFY_FIXED}


class NearDedupAdvanced(StrictModel):
    """Near-duplicate knobs that rarely need changing: chaining flags, report length, recall
    margin, merge task size."""

    chain_min_hop1_fraction: float = Field(
        0.5, ge=0, le=1, title="Chaining: least share within one hop",
        description="Flag a big component when fewer of its members are direct neighbours of the kept image.")
    chain_max_hops: int = Field(3, ge=1, title="Chaining: most hops from the kept image")
    report_top: int = Field(20, ge=1, title="Components listed in the report")
    recall_tolerance: float = Field(1e-4, ge=0, title="Recall margin",
                                    description="Exact pairs within this of edge_min_similarity are not counted.")
    merge_max_edges: int = Field(50_000_000, ge=1, title="Edges per merge task",
                                 description="Bounds the memory of one edge-symmetrisation task.")


class NearDedupConfig(StrictModel):
    """The near-duplicate stage: similarity graph, GPIC's two-tier rule, reports.

    One similarity (the feature model's pair score) is compared with four thresholds, each
    named by what it decides and by its comparison (``_min_similarity``: >=, ``_above``: >):
    ``edge_min_similarity`` which pairs are stored as graph edges, ``component_link_above``
    which link images into components, ``pair_removal_above`` which pairs remove an image
    on their own, ``verification.review_min_similarity`` which may be verified."""

    config_section: ClassVar[str] = "near_dedup"
    renamed_keys: ClassVar[dict[str, str]] = {
        "graph_threshold": "edge_min_similarity", "candidate_threshold": "component_link_above",
        "pair_threshold": "pair_removal_above", **{k: f"advanced.{k}" for k in NearDedupAdvanced.model_fields}}

    model_id: str = Field("wfd", title="Feature model id",
                          description='features/{model_id}/; production: "sscd_disc_mixup".')
    edge_min_similarity: float = Field(
        0.90, gt=-1, le=1, title="Graph edge: least similarity (>=)",
        description="Decides which pairs are stored as graph edges (similarity >= this); recall and the "
                    "calibration sheets are measured on them. Storing a pair removes nothing by itself.")
    component_link_above: float = Field(
        0.90, ge=-1, le=1, title="Component link: similarity above (>)",
        description="Decides which pairs link their images into components (similarity > this; GPIC's "
                    "candidate graph, 0.90). At least edge_min_similarity.")
    pair_removal_above: float = Field(
        0.9625, ge=-1, le=1, title="Pair removal: similarity above (>)",
        description="Decides which pairs remove an image on their own: the lower-resolution image of a pair "
                    "with similarity > this (GPIC tier 1, 0.9625). Above component_link_above.")
    min_component_size: int = Field(5, ge=2, title="Component size rule",
                                    description="Components with at least this many images keep one.")
    recall_queries: int = Field(500, ge=0, title="Recall sample size",
                                description="Query vectors checked against exhaustive search each run.")
    seed: int = Field(0, title="Seed for every sample (training, recall, subsets, calibration)")
    calibrate: Literal["off", "auto"] = Field(
        "off", title="Self-calibration",
        description="auto: before the graph is searched, plant copies on a seeded sample of this corpus's own "
                    "pictures, embed them with model_id and set edge_min_similarity, component_link_above, "
                    "pair_removal_above and the review floor at zero false links among the sample's unrelated pairs "
                    "plus a margin (graph/self_calibration/: record and HTML report; the receipt records it; a "
                    "rerun reuses it while the corpus and model are unchanged). off: the thresholds as configured. "
                    "docs/near-duplicates.md, 'Thresholds fitted to your own pictures'.")
    crop_candidates: int = Field(
        5, ge=0, title="Off-centre crop candidates per image",
        description="With verification on: each picture's whole frame is searched among the other pictures' 70 % "
                    "windows and its best crop_candidates partners scoring >= crop_floor that the graph does not "
                    "hold are verified like review pairs (reason verified_crop; tasks/graph/crops.py). Real "
                    "photographs: off-centre 70 % crops 10 -> 38 of 54 found. 0: off.")
    crop_floor: float = Field(0.5, gt=0, le=1, title="Crop candidate: least region score (>=)",
                              description="Layout score of the whole frame against the partner's best window.")
    index: IndexConfig = Field(default_factory=IndexConfig)
    collision: CollisionConfig = Field(default_factory=CollisionConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    verification: VerificationConfig = Field(default_factory=VerificationConfig)
    advanced: NearDedupAdvanced = Field(default_factory=NearDedupAdvanced, title="Advanced settings")

    @property
    def verifying(self) -> bool:
        """Whether review-band pairs are verified and verified pairs removed (see VerificationConfig.mode)."""
        mode = self.verification.mode
        return mode == "gpic_verified" or (mode == "auto" and (self.model_id.startswith("wfd")
                                                                 or self.calibrate == "auto"))

    @property
    def mirroring(self) -> bool:
        """Whether a review pair that fails verification is tried once more with its second picture
        mirrored (tasks/graph/verify.py): for a model that is not flip-symmetric, whose band holds
        mirrored copies that local features do not match. wfd's mirrored copies score above the
        pair threshold."""
        return self.verifying and not flip_symmetric(self.model_id)

    @property
    def cropping(self) -> bool:
        """Whether off-centre crop candidates are retrieved and verified (tasks/graph/crops.py)."""
        return self.verifying and self.crop_candidates > 0

    @property
    def link_above(self) -> float:
        """Similarity above which a pair links its images without verification (strict >):
        component_link_above, or pair_removal_above when verifying."""
        return self.pair_removal_above if self.verifying else self.component_link_above

    @property
    def search_min_similarity(self) -> float:
        """The similarity the graph's queries reach down to (>=): the review band's floor when verifying."""
        floor = self.edge_min_similarity
        return min(floor, self.verification.review_min_similarity) if self.verifying else floor

    @model_validator(mode="after")
    def _ordered(self) -> NearDedupConfig:
        if self.component_link_above < self.edge_min_similarity:
            raise ValueError("component_link_above below edge_min_similarity: component links would be missing")
        if self.pair_removal_above <= self.component_link_above:
            raise ValueError("pair_removal_above must exceed component_link_above")
        return self
