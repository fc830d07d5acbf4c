"""Run inside the imagededup venv that bench/near_duplicates.py creates (never the project's
.venv: imagededup depends on torch and would replace the pinned one).

Reads ``{"method": "phash" | "dhash", "files": {key: path}}`` as JSON on stdin, writes
``{"encodings": {key: hex}, "duplicates": {key: [keys]}, "encode_s": s, "search_s": s}``:
each file encoded with imagededup's own loader, then its default ``find_duplicates``
(Hamming distance <= 10 of 64 bits).
"""

import json
import logging
import os
import sys
import time
import types

import imagededup

# imagededup's package __init__s import torch for its CNN method; the hashes need none of it,
# so their subpackages are entered without running those __init__s (no torch in this venv)
for _sub in ("methods", "utils"):
    _pkg = types.ModuleType(f"imagededup.{_sub}")
    _pkg.__path__ = [os.path.join(os.path.dirname(imagededup.__file__), _sub)]
    sys.modules[f"imagededup.{_sub}"] = _pkg

from imagededup.methods.hashing import DHash, PHash  # noqa: E402


def main() -> int:
    job = json.load(sys.stdin)
    logging.getLogger("imagededup").setLevel(logging.ERROR)
    hasher = {"phash": PHash, "dhash": DHash}[job["method"]](verbose=False)
    start = time.perf_counter()
    encodings = {}
    for key, path in job["files"].items():
        code = hasher.encode_image(image_file=path)
        if code is not None:
            encodings[key] = code
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    found = hasher.find_duplicates(encoding_map=encodings)
    search_s = time.perf_counter() - start
    json.dump({"encodings": encodings, "duplicates": {k: list(v) for k, v in found.items()},
               "encode_s": encode_s, "search_s": search_s}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
