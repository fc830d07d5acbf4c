"""The licence allow-list (GPIC §2.1): normalisation of real spellings, verdicts, ingest, reruns."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from PIL import Image
from pydantic import ValidationError

from tasks.ingest.files import ingest_path
from corpusforge.storage import Store
from tasks.ingest.partition import ingest_partition
from tasks.ingest.licenses import License, LicenseConfig, license_family, license_reason, normalize_license
from tasks.ingest.sources import SourceConfig, cut_partitions
from tasks.shared.validate import ValidationConfig

# (spelling found in real metadata, what it means) — Flickr API names, Wikimedia
# LicenseShortName values, SPDX ids, deed URLs, and what people type.
SPELLINGS = [
    ("CC BY 2.0", License("CC BY", "2.0")),
    ("CC-BY-4.0", License("CC BY", "4.0")),
    ("cc-by", License("CC BY")),
    ("CC BY 4", License("CC BY", "4.0")),
    ("CC BY 2.5 Generic", License("CC BY", "2.5")),
    ("Attribution 2.0 Generic (CC BY 2.0)", License("CC BY", "2.0")),
    ("Attribution License", License("CC BY")),
    ("Creative Commons Attribution 4.0 International", License("CC BY", "4.0")),
    ("https://creativecommons.org/licenses/by/2.0/", License("CC BY", "2.0")),
    ("http://creativecommons.org/licenses/by/4.0/legalcode", License("CC BY", "4.0")),
    ("creativecommons.org/licenses/by/2.0/", License("CC BY", "2.0")),
    ("CC BY-SA 3.0 DE", License("CC BY-SA", "3.0 DE")),
    ("https://creativecommons.org/licenses/by-sa/3.0/de/", License("CC BY-SA", "3.0 DE")),
    ("Creative Commons Attribution-ShareAlike 4.0 International", License("CC BY-SA", "4.0")),
    ("CC BY-NC-ND 4.0", License("CC BY-NC-ND", "4.0")),
    ("Attribution-NonCommercial-ShareAlike License", License("CC BY-NC-SA")),
    ("cc by nc sa 2.0", License("CC BY-NC-SA", "2.0")),
    ("cc0 1.0", License("CC0", "1.0")),
    ("CC0", License("CC0")),
    ("CC-0", License("CC0")),
    ("CC0 1.0 Universal", License("CC0", "1.0")),
    ("Public Domain Dedication (CC0)", License("CC0")),
    ("https://creativecommons.org/publicdomain/zero/1.0/", License("CC0", "1.0")),
    ("PDM", License("Public Domain")),
    ("Public Domain Mark 1.0", License("Public Domain", "1.0")),
    ("public-domain", License("Public Domain")),
    ("Public domain", License("Public Domain")),
    ("PD", License("Public Domain")),
    ("https://creativecommons.org/publicdomain/mark/1.0/", License("Public Domain", "1.0")),
    ("https://en.wikipedia.org/wiki/Public_domain", License("Public Domain")),
    ("No known copyright restrictions", License("No known restrictions")),
    ("No known restrictions", License("No known restrictions")),
    ("https://www.flickr.com/commons/usage/", License("No known restrictions")),
    ("  CC\u2011BY\u20114.0  ", License("CC BY", "4.0")),      # non-breaking hyphens, padding
    # not recognised: never guessed into a family
    ("All Rights Reserved", None),
    ("GFDL", None),
    ("cc by sa nd", None),                                     # SA and ND exclude each other
    ("https://example.org/license", None),
    ("", None),
    (None, None),
]


@pytest.mark.parametrize("raw,expected", SPELLINGS)
def test_real_world_spellings_normalise(raw, expected):
    assert normalize_license(raw) == expected


def independent_allowed(lic: License | None) -> bool:
    """GPIC's list written out by hand: CC BY (any version, no further clauses), CC0, PD, NKR."""
    return lic is not None and lic.family in {"CC BY", "CC0", "Public Domain", "No known restrictions"}


@pytest.mark.parametrize("raw,expected", SPELLINGS)
def test_default_verdict_is_gpics_list(raw, expected):
    reason = license_reason(raw, None, LicenseConfig())
    if not (raw or "").strip():
        assert reason == "license_missing"
    elif independent_allowed(expected):
        assert reason == ""
    else:
        assert reason.startswith("license_not_allowed: ") and (str(expected) in reason or "unrecognised" in reason)


def test_versions_urls_and_switching_off():
    only_4 = LicenseConfig(allow=["CC-BY-4.0"])
    assert license_reason("CC BY 4.0", None, only_4) == ""
    assert license_reason("CC BY 2.0", None, only_4) == "license_not_allowed: CC BY 2.0"
    assert license_reason("cc-by", None, only_4) == "license_not_allowed: CC BY"   # version unknown: not 4.0
    # the URL decides only when the name is empty, unless told otherwise
    url = "https://creativecommons.org/licenses/by/2.0/"
    assert license_reason(None, url, LicenseConfig()) == ""
    assert license_reason("see link", url, LicenseConfig()) == \
        "license_not_allowed: unrecognised licence name 'see link'"
    assert license_reason(None, url, LicenseConfig(use_url=False)) == "license_missing"
    assert license_reason("CC BY-SA 4.0", url, LicenseConfig(use_url=False)) == "license_not_allowed: CC BY-SA 4.0"
    assert license_reason(None, "https://example.org/l", LicenseConfig()) == \
        "license_not_allowed: unrecognised licence url 'https://example.org/l'"
    assert license_reason(None, None, None) == ""
    assert license_family(None, "") == "missing" and license_family("GFDL", None) == "unrecognised"


BY_2 = "https://creativecommons.org/licenses/by/2.0/"
ZERO = "https://creativecommons.org/publicdomain/zero/1.0/"
# What people write in the licence field when the licence is not a permissive one.
UNRECOGNISED = ["All rights reserved", "©", "© 2019 Jane", "Copyright 2010 X", "unknown", "see website"]
# Restrictive CC spellings and what they mean, written out by hand.
RESTRICTIVE = [("CC BY-NC 2.0", "CC BY-NC 2.0"), ("CC BY-ND", "CC BY-ND"), ("cc-by-nc-sa-4.0", "CC BY-NC-SA 4.0"),
               ("Attribution-NonCommercial License", "CC BY-NC")]
URLS = [(BY_2, "CC BY 2.0"), (ZERO, "CC0 1.0"), (None, None)]


@pytest.mark.parametrize("url,_", URLS)
@pytest.mark.parametrize("name", UNRECOGNISED)
def test_an_unrecognised_name_is_refused_whatever_the_url_says(name, url, _):
    expected = f"license_not_allowed: unrecognised licence name {name!r}"
    for mode in ("filter", "stricter"):
        assert license_reason(name, url, LicenseConfig(on_conflict=mode)) == expected
    assert license_family(name, url) == "unrecognised"


@pytest.mark.parametrize("url,url_means", URLS)
@pytest.mark.parametrize("name,name_means", RESTRICTIVE)
def test_a_restrictive_name_beside_a_permissive_url_never_passes(name, name_means, url, url_means):
    filtered = license_reason(name, url, LicenseConfig())
    stricter = license_reason(name, url, LicenseConfig(on_conflict="stricter"))
    if url is None:
        assert filtered == stricter == f"license_not_allowed: {name_means}"
        return
    assert filtered == f"license_conflict: name {name_means} vs url {url_means}"
    assert stricter == f"license_not_allowed: {name_means} (name {name_means} vs url {url_means})"
    assert license_family(name, url) == "conflict"


# Permissive spellings beside a URL that says the same (or only adds a version or a port): kept.
AGREEING = [("CC BY 4.0", "https://creativecommons.org/licenses/by/4.0/"),
            ("CC-BY-4.0", "https://creativecommons.org/licenses/by/4.0/legalcode"),
            ("cc by 4.0", None),
            ("Creative Commons Attribution 4.0 International", "https://creativecommons.org/licenses/by/4.0/deed.en"),
            ("Attribution 4.0 International (CC BY 4.0)", "http://creativecommons.org/licenses/by/4.0/"),
            ("Attribution License", BY_2), ("CC BY", BY_2),
            ("CC BY 3.0", "https://creativecommons.org/licenses/by/3.0/de/"),
            ("CC0", ZERO), ("CC0 1.0 Universal", ZERO), ("Public Domain Dedication (CC0)", None),
            ("Public Domain Mark", "https://creativecommons.org/publicdomain/mark/1.0/"), ("Public Domain Mark", None),
            ("No known copyright restrictions", "https://www.flickr.com/commons/usage/"),
            ("No known copyright restrictions", None), (None, BY_2), ("", ZERO)]


@pytest.mark.parametrize("name,url", AGREEING)
def test_permissive_spellings_still_pass(name, url):
    for mode in ("filter", "stricter"):
        assert license_reason(name, url, LicenseConfig(on_conflict=mode)) == ""
    assert license_family(name, url) not in ("conflict", "unrecognised", "missing")


def test_two_permissive_statements_that_disagree_are_a_conflict():
    """Both allowed but not the same licence: filtered by default; ``stricter`` keeps the record
    when each is allowed and refuses it when the stricter allow-list refuses either."""
    cases = [("CC BY 4.0", BY_2, "CC BY 4.0", "CC BY 2.0"), ("CC0", BY_2, "CC0", "CC BY 2.0"),
             ("Public Domain Mark", ZERO, "Public Domain", "CC0 1.0"), ("CC BY 2.0", ZERO, "CC BY 2.0", "CC0 1.0")]
    for name, url, name_means, url_means in cases:
        assert license_reason(name, url, LicenseConfig()) == f"license_conflict: name {name_means} vs url {url_means}"
        assert license_reason(name, url, LicenseConfig(on_conflict="stricter")) == ""
    only_4 = LicenseConfig(allow=["CC BY 4.0"], on_conflict="stricter")
    assert license_reason("CC BY 4.0", BY_2, only_4) == \
        "license_not_allowed: CC BY 2.0 (name CC BY 4.0 vs url CC BY 2.0)"
    nc_url = "https://creativecommons.org/licenses/by-nc/2.0/"
    assert license_reason("CC BY 2.0", nc_url, LicenseConfig(on_conflict="stricter")) == \
        "license_not_allowed: CC BY-NC 2.0 (name CC BY 2.0 vs url CC BY-NC 2.0)"
    # the URL is not read at all when told so: no conflict to find
    assert license_reason("CC BY 4.0", BY_2, LicenseConfig(use_url=False)) == ""


def test_an_unrecognised_allow_entry_is_a_config_error():
    with pytest.raises(ValidationError, match="not a recognised licence"):
        LicenseConfig(allow=["CC BY", "Copyleft-ish"])
    with pytest.raises(ValidationError):
        LicenseConfig(allow=[])


def jpeg(seed: int) -> bytes:
    arr = (np.random.default_rng(seed).random((300, 400, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG")
    return buf.getvalue()


# Two partitions of three rows: partition 0 holds the only BY-SA record.
ROWS = [("a", "CC BY 2.0"), ("b", "CC BY-SA 4.0"), ("c", None),
        ("d", "cc0 1.0"), ("e", "All Rights Reserved"), ("f", "PDM")]


def table_source(tmp_path, rows=ROWS, urls=None):
    """A folder of JPEGs and a metadata table of ``rows`` (key, licence), with ``urls`` (key: licence URL)."""
    src = tmp_path / "src"
    src.mkdir()
    for i, (key, _) in enumerate(rows):
        if key != "e":  # e's image does not exist: a filtered record's image is never read
            (src / f"{key}.jpg").write_bytes(jpeg(i))
    table = [{"key": k, "path": f"{k}.jpg", "license": lic, "license_url": (urls or {}).get(k)} for k, lic in rows]
    pq.write_table(pa.Table.from_pylist(table), src / "metadata.parquet")
    return src


def ingest(src, out, lic):
    store = Store(str(out))
    cfg = SourceConfig(partition_size=3)
    _, parts = cut_partitions(str(src), store, cfg)
    markers = [ingest_partition(store, p, cfg, ValidationConfig(), 2, lic) for p in parts]
    rows = [r for p in parts for r in store.read_parquet(ingest_path(p.index)).to_pylist()]
    return markers, {r["key"]: r for r in rows}


def test_ingest_filters_before_reading_and_reruns_only_changed_partitions(tmp_path):
    src = table_source(tmp_path)
    out = tmp_path / "out"
    markers, rows = ingest(src, out, LicenseConfig())
    got = {k: (r["status"], r["reason"]) for k, r in rows.items()}
    assert got == {"a": ("kept", ""), "b": ("filtered", "license_not_allowed: CC BY-SA 4.0"),
                   "c": ("filtered", "license_missing"), "d": ("kept", ""),
                   "e": ("filtered", "license_not_allowed: unrecognised licence name 'All Rights Reserved'"),
                   "f": ("kept", "")}
    assert rows["b"]["sha256"] is None and rows["e"]["sha256"] is None  # never read
    assert markers[0].info["licenses"] == {"CC BY": 1, "CC BY-SA": 1, "missing": 1}
    # allowing BY-SA changes a verdict in partition 0 only: only it reruns, and the result
    # equals a fresh ingest with the new list byte for byte
    wider = LicenseConfig(allow=["CC BY", "CC BY-SA", "CC0", "Public Domain", "No known restrictions"])
    again, rows2 = ingest(src, out, wider)
    assert [m.action for m in again] == ["computed", "skipped"]
    assert rows2["b"]["status"] == "kept" and rows2["b"]["sha256"]
    fresh, _ = ingest(src, tmp_path / "fresh", wider)
    assert [m.digest for m in fresh] == [m.digest for m in again]
    # a change that alters no verdict reruns nothing
    same, _ = ingest(src, out, LicenseConfig(allow=[*wider.allow, "CC BY 2.0"]))
    assert [m.action for m in same] == ["skipped", "skipped"]


def test_tar_sidecar_licences(tmp_path):
    src = tmp_path / "tars"
    src.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i, lic in enumerate(["Attribution 2.0 Generic (CC BY 2.0)", "Attribution-NonCommercial License", None]):
            meta = json.dumps({"license": lic} if lic else {}).encode()
            for name, data in ((f"{i:03d}.jpg", jpeg(i)), (f"{i:03d}.json", meta)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (src / "00000.tar").write_bytes(buf.getvalue())
    _, rows = ingest(src, tmp_path / "out", LicenseConfig())
    assert [(r["status"], r["reason"]) for r in rows.values()] == [
        ("kept", ""), ("filtered", "license_not_allowed: CC BY-NC"), ("filtered", "license_missing")]
    again, _ = ingest(src, tmp_path / "out", None)  # switched off: the tar reruns, everything kept
    assert again[0].action == "computed"


def test_a_build_filters_conflicts_and_counts_them(tmp_path):
    """A real build (in-process, local cluster off): the restrictive records end ``filtered``
    with their reason in the manifest; the receipt and both reports count the conflicts;
    ``stricter`` keeps the two-permissive conflict and refuses the restrictive one."""
    from flows.build_corpus import BuildConfig, build

    restricted = {"arr": ("All rights reserved", BY_2), "nc": ("CC BY-NC 2.0", BY_2), "v4": ("CC BY 4.0", BY_2)}
    plain = [(f"p{i:02d}", "CC BY 2.0") for i in range(24)]
    rows = plain + [(k, name) for k, (name, _) in restricted.items()]
    src = table_source(tmp_path, rows, {k: url for k, (_, url) in restricted.items()} | {k: BY_2 for k, _ in plain})

    def run(out, on_conflict):
        build(BuildConfig.model_validate({
            "source": str(src), "out": str(out), "input": {"partition_size": 16}, "staging": {"shard_size": 16},
            "splits": {"shard_size": 10, "val": 0.1, "test": 0.15}, "licenses": {"on_conflict": on_conflict}}))
        rows = ds.dataset(out / "manifest", format="parquet").to_table().to_pylist()
        return {r["key"]: (r["status"], r["reason"]) for r in rows if r["key"] in restricted}, \
            json.loads((out / "receipt.json").read_text())["licenses"]

    fates, licenses = run(tmp_path / "out", "filter")
    assert fates == {"arr": ("filtered", "license_not_allowed: unrecognised licence name 'All rights reserved'"),
                     "nc": ("filtered", "license_conflict: name CC BY-NC 2.0 vs url CC BY 2.0"),
                     "v4": ("filtered", "license_conflict: name CC BY 4.0 vs url CC BY 2.0")}
    assert licenses["conflicts"] == 2 and licenses["on_conflict"] == "filter"
    assert licenses["input_by_family"] == {"CC BY": 24, "conflict": 2, "unrecognised": 1}
    line = "Name/URL conflicts: 2 input record(s); on_conflict `filter`: filtered as `license_conflict`."
    assert line in (tmp_path / "out" / "report.md").read_text()
    assert line.replace("`", "") in (tmp_path / "out" / "report.html").read_text()
    fates, licenses = run(tmp_path / "stricter", "stricter")
    assert fates == {"arr": ("filtered", "license_not_allowed: unrecognised licence name 'All rights reserved'"),
                     "nc": ("filtered", "license_not_allowed: CC BY-NC 2.0 (name CC BY-NC 2.0 vs url CC BY 2.0)"),
                     "v4": ("kept", "")}
    assert licenses["conflicts"] == 2 and licenses["on_conflict"] == "stricter"
