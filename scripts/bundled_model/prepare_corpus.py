#!/usr/bin/env python3
"""Collect the training corpus of the bundled tiny model: the Python standard
library's own source code (PSF License 2.0).

Every `.py` file under the running interpreter's `Lib` directory (or
`--lib-dir`) is read in sorted relative-path order, skipping installed
third-party packages and caches. Files are split into train / held-out test by
a hash of their relative path, so the split does not depend on the file list
or the order of traversal. The output is two JSON-lines files (one document per
line: {"path", "text"}) and a manifest with the interpreter version and SHA-256
digests, so a given CPython version reproduces the same corpus byte for byte.
"""

import argparse
import hashlib
import json
import platform
import sys
import sysconfig
from pathlib import Path

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def split_of(rel_path: str, test_percent: int) -> str:
    """Deterministic split: the first 8 bytes of SHA-256(path) modulo 100."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest()[:8], "big")
    return "test" if h % 100 < test_percent else "train"


def collect(lib_dir: Path):
    """Yield (relative path, text) for each UTF-8 decodable source file, sorted."""
    files = []
    for p in lib_dir.rglob("*.py"):
        rel = p.relative_to(lib_dir)
        if any(part in SKIP_DIRS for part in rel.parts) or not p.is_file():
            continue
        files.append((rel.as_posix(), p))
    files.sort(key=lambda item: item[0])
    skipped = []
    for rel, p in files:
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            # A few test fixtures are deliberately in other encodings; they
            # would only teach the tokenizer replacement characters.
            skipped.append({"path": rel, "reason": "not UTF-8"})
            continue
        if not text.strip():
            skipped.append({"path": rel, "reason": "empty"})
            continue
        yield rel, text
    collect.skipped = skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib-dir", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                    help="the CPython Lib directory (default: this interpreter's)")
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--test-percent", type=int, default=2)
    args = ap.parse_args()

    lib_dir = args.lib_dir.resolve()
    if not (lib_dir / "os.py").is_file():
        sys.exit(f"error: {lib_dir} does not look like a CPython Lib directory (no os.py)")
    args.out_dir.mkdir(parents=True, exist_ok=True)

    digests = {"train": hashlib.sha256(), "test": hashlib.sha256()}
    counts = {"train": [0, 0], "test": [0, 0]}  # files, UTF-8 bytes
    outs = {s: open(args.out_dir / f"{s}.jsonl", "w", encoding="utf-8", newline="\n") for s in digests}
    try:
        for rel, text in collect(lib_dir):
            split = split_of(rel, args.test_percent)
            line = json.dumps({"path": rel, "text": text}, ensure_ascii=False) + "\n"
            outs[split].write(line)
            digests[split].update(line.encode("utf-8"))
            counts[split][0] += 1
            counts[split][1] += len(text.encode("utf-8"))
    finally:
        for f in outs.values():
            f.close()

    licence = lib_dir / "LICENSE.txt"
    manifest = {
        "source": "CPython standard library (Lib/**/*.py)",
        "licence": "PSF License Agreement for Python (version 2), see LICENSE.txt of the CPython distribution",
        "licence_file_sha256": hashlib.sha256(licence.read_bytes()).hexdigest() if licence.is_file() else None,
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "test_percent": args.test_percent,
        "split_rule": "sha256(relative posix path)[:8] as big-endian int % 100 < test_percent -> test",
        "skipped_files": collect.skipped,
        "splits": {
            s: {"file": f"{s}.jsonl", "files": counts[s][0], "utf8_bytes": counts[s][1],
                "sha256": digests[s].hexdigest()}
            for s in digests
        },
    }
    (args.out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest["splits"], indent=2))
    print(f"python {manifest['python_version']}, skipped {len(collect.skipped)} files")


if __name__ == "__main__":
    main()
