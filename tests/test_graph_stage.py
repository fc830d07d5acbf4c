"""The near-duplicate stage end to end on a tiny real corpus (in-process task runs)."""

from __future__ import annotations

import hashlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from corpusforge.contract import COMPUTED, UnitResult
from corpusforge.layout import staging_records

from tasks.graph.calibration import BinSampler
from tasks.graph.config import (VerificationConfig, CalibrationConfig, CollisionConfig, IndexConfig, NearDedupAdvanced,
                                NearDedupConfig)
from tasks.graph.decisions import DuplicateContentError, read_decisions
from tasks.graph.stage import near_duplicate_stage
from tests.graph_corpus import at_similarity, brute_force_edges, planted_vectors, unit, write_corpus
from tests.test_graph_two_tier import reference

pytestmark = pytest.mark.timeout(180)

# The planted vectors stand for no image (their PNGs are noise): these tests check GPIC's
# rule itself, so they run it exactly (verification: tests/test_graph_verify.py).
FAST = dict(collision=CollisionConfig(fractions=[0.25, 0.5, 0.75, 1.0]),
            calibration=CalibrationConfig(pairs_per_bin=2), verification=VerificationConfig(mode="gpic_exact"))


def exact_cfg(**kw) -> NearDedupConfig:
    return NearDedupConfig(index=IndexConfig(kind="flat", search="range"), **{**FAST, **kw})


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_decisions_equal_reference_rule_on_brute_force_graph(tmp_path):
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=40, dim=24, seed=7,
                                         failed={"img_00004"})
    summary, _ = near_duplicate_stage(store, exact_cfg(), shards)
    table = read_decisions(store, shards)
    keys = table["key"].to_pylist()
    records = {}
    for shard in shards:
        for r in store.read_parquet(staging_records(shard)).to_pylist():
            records[r["key"]] = r
    assert keys == [k for s in sorted(shards)
                    for k in store.read_parquet(staging_records(s))["key"].to_pylist()]
    edges = brute_force_edges(store, shards, by_key, 0.90)
    res = [records[k]["width"] * records[k]["height"] for k in keys]
    code, dup, comp, size, mx = reference(len(keys), [(a, b, s) for (a, b), s in edges.items()], res, keys)
    status = ["kept" if c == 0 else "near_duplicate" for c in code]
    reason = [None, "tier1_pair>0.9625", "component>=5"]
    assert table["status"].to_pylist() == status
    assert table["reason"].to_pylist() == [reason[c] for c in code]
    assert table["duplicate_of"].to_pylist() == [keys[d] if d >= 0 else None for d in dup]
    assert table["component_id"].to_pylist() == comp
    assert table["component_size"].to_pylist() == size
    assert table["max_similarity"].to_pylist() == pytest.approx(mx, abs=1e-5)
    # every duplicate_of is a kept image; the failed image is a kept singleton
    kept = {k for k, s in zip(keys, status, strict=True) if s == "kept"}
    assert all(d in kept for d in table["duplicate_of"].to_pylist() if d)
    i = keys.index("img_00004")
    assert (status[i], comp[i], size[i], mx[i]) == ("kept", i, 1, 0.0)
    d = summary["decisions"]
    assert d["removed"] == sum(c != 0 for c in code) > 10
    assert d["removed_by_rule"] == {"tier1_pair>0.9625": code.count(1), "component>=5": code.count(2)}
    assert summary["recall"]["recall"] == 1.0 and summary["recall"]["queries"] == 119
    assert summary["index"]["plan"]["kind"] == "flat"
    report = store.read_json("graph/components_report.json")
    assert report["big_components"] == len({c for c, s in zip(comp, size, strict=True) if s >= 5})
    assert report["largest"][0]["size"] == max(size)


def test_shard_order_and_reruns_give_identical_bytes(tmp_path):
    a, shards, _ = write_corpus(str(tmp_path / "a"), seed=1)
    b, _, _ = write_corpus(str(tmp_path / "b"), seed=1)
    near_duplicate_stage(a, exact_cfg(), shards)
    near_duplicate_stage(b, exact_cfg(), list(reversed(shards)))
    first = tree_bytes(tmp_path / "a" / "graph")
    assert first == tree_bytes(tmp_path / "b" / "graph")
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "a" / "graph" / "edges").iterdir()}
    _, work = near_duplicate_stage(a, exact_cfg(), shards)  # resume: all steps skipped, nothing rewritten
    assert work["index"] == work["decisions"] == work["calibration"] == work["collision"] == "skipped"
    assert work["queries"] == work["recall_references"] == {"computed": 0, "skipped": len(shards)}
    assert work["merge_routing"] == "skipped" and work["merges"]["computed"] == 0
    assert tree_bytes(tmp_path / "a" / "graph") == first
    assert mtimes == {p: p.stat().st_mtime_ns for p in (tmp_path / "a" / "graph" / "edges").iterdir()}


def test_a_changed_shard_gives_the_fresh_graph_over_several_merge_groups(tmp_path):
    """Several merge groups: a rerun after one shard's features change routes the found pairs
    again and writes the graph of a fresh build byte for byte; a rerun with nothing changed
    routes and merges nothing (issue 31: routing task, then one merge per group)."""
    n_shards, per_shard, dim = 4, 40, 32
    x = planted_vectors(n_shards * per_shard, dim, 1)
    changed = x.copy()
    written_first = np.random.default_rng(1 + 1).permutation(len(x))[:per_shard]  # write_corpus's placement
    changed[written_first[:10]] = planted_vectors(10, dim, 7)
    cfg = exact_cfg(advanced=NearDedupAdvanced(merge_max_edges=20), collision=CollisionConfig(enabled=False),
                    calibration=CalibrationConfig(enabled=False))
    a, shards, _ = write_corpus(str(tmp_path / "a"), n_shards, per_shard, dim, seed=1, vectors=x)
    summary, _ = near_duplicate_stage(a, cfg, shards)
    assert summary["graph"]["merge_tasks"] > 1
    write_corpus(str(tmp_path / "a"), n_shards, per_shard, dim, seed=1, vectors=changed)
    _, work = near_duplicate_stage(a, cfg, shards)
    assert work["queries"]["computed"] == 1 and work["merge_routing"] == "computed"
    b, _, _ = write_corpus(str(tmp_path / "b"), n_shards, per_shard, dim, seed=1, vectors=changed)
    near_duplicate_stage(b, cfg, shards)
    assert tree_bytes(tmp_path / "a" / "graph") == tree_bytes(tmp_path / "b" / "graph")  # routed files may
    # differ: an unchanged shard's file keeps its pairs found with the old vectors (dropped as invalid)
    _, work = near_duplicate_stage(a, cfg, shards)
    assert work["merge_routing"] == "skipped" and work["merges"]["computed"] == 0


def test_ivf_stage_matches_exact_stage_on_planted_data(tmp_path):
    ex, shards, _ = write_corpus(str(tmp_path / "ex"), n_shards=2, per_shard=400, dim=32, seed=4)
    iv, _, _ = write_corpus(str(tmp_path / "iv"), n_shards=2, per_shard=400, dim=32, seed=4)
    exact, _ = near_duplicate_stage(ex, exact_cfg(collision=CollisionConfig(enabled=False),
                                               calibration=CalibrationConfig(enabled=False)), shards)
    approx, _ = near_duplicate_stage(iv, NearDedupConfig(
        index=IndexConfig(kind="ivf", nlist=16, nprobe=8, storage="flat"), recall_queries=300,
        collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(enabled=False),
        verification=VerificationConfig(mode="gpic_exact")), shards)  # the same rule as the exact stage
    assert approx["index"]["plan"]["factory"] == "IVF16,Flat"
    assert approx["recall"]["recall"] >= 0.95
    same = np.mean(np.array(read_decisions(ex, shards)["status"].to_pylist())
                   == np.array(read_decisions(iv, shards)["status"].to_pylist()))
    assert same >= 0.98 and exact["decisions"]["removed"] > 50


def _sha_case(tmp_path, clash_with: str):
    rng = np.random.default_rng(0)
    base = unit(rng.standard_normal(16))
    x = np.stack([base, at_similarity(base, 0.99, rng)]
                 + [unit(rng.standard_normal(16)) for _ in range(6)]).astype(np.float32)
    # img_00000/img_00001 are a tier-1 pair; whichever is removed depends on resolution
    store, shards, _ = write_corpus(str(tmp_path), n_shards=2, per_shard=4, dim=16, vectors=x)
    recs = {r["key"]: r for s in shards for r in store.read_parquet(staging_records(s)).to_pylist()}
    a, b = recs["img_00000"], recs["img_00001"]
    a_wins = (a["width"] * a["height"], "img_00001") >= (b["width"] * b["height"], "img_00000")
    loser = "img_00001" if a_wins else "img_00000"
    winner = "img_00000" if a_wins else "img_00001"
    target = {"kept": winner, "removed": loser}[clash_with]
    sha = hashlib.sha256(b"same bytes").hexdigest()
    store, shards, _ = write_corpus(str(tmp_path), n_shards=2, per_shard=4, dim=16, vectors=x,
                                    sha_override={"img_00005": sha, target: sha})
    return store, shards


def test_sha256_guard_raises_when_two_kept_images_share_a_hash(tmp_path):
    store, shards = _sha_case(tmp_path, "kept")
    with pytest.raises(DuplicateContentError, match="img_00005"):
        near_duplicate_stage(store, exact_cfg(), shards)


def test_sha256_guard_passes_when_the_twin_is_removed(tmp_path):
    store, shards = _sha_case(tmp_path, "removed")
    summary, _ = near_duplicate_stage(store, exact_cfg(), shards)
    assert summary["decisions"]["removed"] == 1


class _Sheet(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.hist, self.in_row = [], 0, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and a.get("class") == "pair":
            self.rows.append([])
            self.in_row = True
        elif tag == "img" and a.get("class") == "hist" and a["src"].startswith("data:image/png;base64,"):
            self.hist += 1
        elif tag == "img" and self.in_row:
            self.rows[-1].append(a["src"])

    def handle_endtag(self, tag):
        if tag == "tr":
            self.in_row = False


def test_calibration_sheet_embeds_every_image(tmp_path):
    store, shards, _ = write_corpus(str(tmp_path), n_shards=3, per_shard=40, dim=24, seed=7)
    cfg = exact_cfg(calibration=CalibrationConfig(pairs_per_bin=3),
                    collision=CollisionConfig(fractions=[0.5, 1.0], thresholds=[0.75, 0.9]))
    summary, _ = near_duplicate_stage(store, cfg, shards)
    page = (tmp_path / "graph" / "calibration" / "index.html").read_text()
    sheet = _Sheet()
    sheet.feed(page)
    bins = summary["calibration"]["bins"]
    assert sheet.hist == 1 and summary["calibration"]["missing_images"] == 0
    assert len(sheet.rows) == sum(b["shown"] for b in bins) >= 12
    assert [b["shown"] for b in bins] == [min(3, b["available"]) for b in bins]
    assert [b["source"] for b in bins][:2] == ["collision subset pairs"] * 2
    for row in sheet.rows:
        assert len(row) == 2 and all(src.startswith("data:image/jpeg;base64,") for src in row)
    assert "http" not in page  # self-contained


def test_fan_out_parameters_stay_small_at_any_shard_count(tmp_path):
    """A graph task's pickled parameters do not grow with S (issue 22: they carried the
    whole node table and digest map, 0.9 MB per task at S = 10k)."""
    import cloudpickle

    from corpusforge.storage import Store
    from tasks.graph.nodes import NodeTable, read_shard_table, write_shard_table
    from tasks.graph.stage import shard_calls

    sizes = []
    for n in (100, 10_000):
        store = Store(str(tmp_path / f"{n:06d}"))  # equal root lengths: equal pickles
        shards = [f"{i:06d}" for i in range(n)]
        nodes = NodeTable(tuple(shards), np.arange(n + 1, dtype=np.int64) * 10_000)
        digests = {s: hashlib.sha256(s.encode()).hexdigest() for s in shards}
        table = write_shard_table(store, nodes, digests)
        index = UnitResult("f", {}, "d", {"plan": {"kind": "flat"}}, action=COMPUTED)
        calls = shard_calls(store, store, exact_cfg(), table, digests, index)
        assert [c["shard"] for c in calls] == shards and calls[7]["digest"] == digests[shards[7]]
        sizes.append(max(len(cloudpickle.dumps(c)) for c in calls[:50]))
        got_nodes, got_digests = read_shard_table(store, table)
        assert got_nodes.shards == nodes.shards and np.array_equal(got_nodes.offsets, nodes.offsets)
        assert got_digests == digests
    assert sizes[1] == sizes[0] <= 64 << 10


def test_a_task_refuses_a_shard_table_it_was_not_given(tmp_path):
    """The shared table is identified by its digest: a file rewritten by another plan is an error."""
    from corpusforge.storage import Store
    from tasks.graph.nodes import NodeTable, read_shard_table, write_shard_table

    store = Store(str(tmp_path))
    first = write_shard_table(store, NodeTable(("a",), np.array([0, 3])), {"a": "d1"})
    write_shard_table(store, NodeTable(("a",), np.array([0, 3])), {"a": "d2"})
    with pytest.raises(ValueError, match="changed while the graph stage ran"):
        read_shard_table(store, first)


def test_single_task_parameters_stay_small_at_any_shard_count(tmp_path):
    """The one-off tasks (recall, review, decisions, collision, calibration) get the shard
    table's and the digest lists' SHA-256, not the node table and O(S) lists (issue 22:
    6.4 MB per task projected at 10⁸ images); each task reads the same lists back."""
    import inspect

    import cloudpickle

    from corpusforge.storage import Store
    from tasks.graph import stage
    from tasks.graph.nodes import (NodeTable, read_shard_digests, read_shard_table, write_shard_digests,
                                   write_shard_table)

    tasks = {"recall": stage.RECALL, "review": stage.REVIEW, "decisions": stage.DECIDE,
             "collision": stage.COLLISION, "calibration": stage.CALIBRATION}
    sizes = []
    for n in (10, 1000):
        store = Store(str(tmp_path / f"{n:06d}"))  # equal root lengths: equal pickles
        shards = [f"{i:06d}" for i in range(n)]
        nodes = NodeTable(tuple(shards), np.arange(n + 1, dtype=np.int64) * 10_000)
        lists = {kind: [hashlib.sha256(f"{kind}{s}".encode()).hexdigest() for s in shards]
                 for kind in ("edges", "records", "verified")}
        table = write_shard_table(store, nodes, dict(zip(shards, lists["edges"], strict=True)))
        written = {kind: write_shard_digests(store, kind, nodes, d) for kind, d in lists.items()}
        calls = stage.single_calls(store, store, exact_cfg(), table, written, n * 10_000,
                                   {"collision": "c" * 64, "calibration": "k" * 64})
        calls["decisions"]["verified"] = written["verified"]
        for name, task in tasks.items():
            inspect.signature(task.fn).bind(**calls[name])  # the task takes exactly these
        sizes.append({name: len(cloudpickle.dumps(c)) for name, c in calls.items()})
        got_nodes, _ = read_shard_table(store, table)
        for kind, d in lists.items():
            assert read_shard_digests(store, kind, written[kind], got_nodes) == d
    assert sizes[1] == sizes[0]
    assert max(sizes[1].values()) <= 4 << 10


def test_a_task_refuses_a_digest_list_it_was_not_given(tmp_path):
    from corpusforge.storage import Store
    from tasks.graph.nodes import NodeTable, read_shard_digests, write_shard_digests

    store = Store(str(tmp_path))
    nodes = NodeTable(("a", "b"), np.array([0, 3, 5]))
    first = write_shard_digests(store, "edges", nodes, ["e1", "e2"])
    write_shard_digests(store, "edges", nodes, ["e1", "e3"])
    with pytest.raises(ValueError, match="changed while the graph stage ran"):
        read_shard_digests(store, "edges", first, nodes)
    other = write_shard_digests(store, "records", NodeTable(("a",), np.array([0, 3])), ["r1"])
    with pytest.raises(ValueError, match="other shards"):
        read_shard_digests(store, "records", other, nodes)


def test_node_degrees_count_every_edge_of_the_merged_graph(tmp_path):
    """The k-NN cap check's degrees equal a count over all edges (read file by file)."""
    from tasks.graph.edges import node_degrees
    from tasks.graph.nodes import number_nodes

    store, shards, _ = write_corpus(str(tmp_path), n_shards=3, per_shard=40, dim=24, seed=7)
    near_duplicate_stage(store, exact_cfg(), shards)
    nodes = number_nodes(store, shards)
    edges = [store.read_parquet(f"graph/edges/{s}.parquet") for s in nodes.shards]
    ends = np.concatenate([np.concatenate([t["src"].to_numpy(), t["dst"].to_numpy()]) for t in edges])
    assert len(ends) > 0
    assert np.array_equal(node_degrees(store, nodes), np.bincount(ends, minlength=nodes.n_nodes))


def test_calibration_samples_the_same_pairs_batch_by_batch():
    """The sheet reads the collision pairs a batch at a time (they grow with the subset): the
    pairs it keeps per bin must be those it keeps from the whole table at once."""
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 5_000, 20_000), rng.integers(0, 5_000, 20_000)
    s = rng.random(20_000).astype(np.float32)
    bins = [(0.0, 0.5), (0.5, 0.9), (0.9, 1.0)]
    whole, batched = BinSampler(bins, 7, seed=11), BinSampler(bins, 7, seed=11)
    whole.add([0, 1, 2], a, b, s)
    for lo in range(0, 20_000, 3_000):
        batched.add([0, 1, 2], a[lo:lo + 3_000], b[lo:lo + 3_000], s[lo:lo + 3_000])
    assert whole.seen == batched.seen and sum(whole.seen) == 20_000
    for kept, got in zip(whole.kept, batched.kept, strict=True):
        assert len(kept[0]) == 7 and all(np.array_equal(x, y) for x, y in zip(kept, got, strict=True))
