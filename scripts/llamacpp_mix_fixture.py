#!/usr/bin/env python3
"""Per-tensor GGUF types of llama-quantize's file types, from llama.cpp's own
snapshot test (tests/test-quant-type-selection.cpp, tests/snapshots/*.schema
at ggml-org/llama.cpp a95a11e5b834057e684712963f90bbb730f4745c), for the
models gpumem has as presets. Each section of a snapshot names a file type,
its default type and the tensors that differ from it; the snapshots are
computed without an importance matrix.

Usage: python3 scripts/llamacpp_mix_fixture.py SNAPSHOT_DIR
  SNAPSHOT_DIR holds the *.schema files, e.g. extracted with
  `git show a95a11e5b834:tests/snapshots/<file>` from a llama.cpp clone.
Writes tests/fixtures/groundtruth/llamacpp_quant_mix.json.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (Qwen3-0.6B is left out: the snapshot's model has an output.weight, the
# real checkpoint ties it to the embeddings.)
MODELS = {  # snapshot file -> gpumem preset
    "qwen3-14b.schema": "qwen3-14b",
    "gemma-3-4b-it.schema": "gemma-3-4b-it",
    "meta-llama-3.1-70b-instruct.schema": "llama-3.1-70b",
    "gpt-oss-120b.schema": "gpt-oss-120b",
}


def parse(path):
    out = {"header": [], "sections": {}}
    cur = None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("#"):
            out["header"].append(line[1:].strip())
        elif line.startswith("["):
            name, base = line[1:].split("]")
            cur = {"default": base.strip(), "tensors": {}}
            out["sections"][name] = cur
        elif line.strip() and cur is not None:
            t, ty = line.split()
            cur["tensors"][t] = ty
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    models = {}
    for f, preset in MODELS.items():
        s = parse(os.path.join(sys.argv[1], f))
        s["preset"] = preset
        models[f[: -len(".schema")]] = s
    doc = {
        "source": "ggml-org/llama.cpp a95a11e5b834057e684712963f90bbb730f4745c, tests/snapshots/*.schema "
                  "(written by tests/test-quant-type-selection.cpp; has_imatrix false)",
        "what": "per file type: the default tensor type and the tensors llama-quantize gives another type",
        "models": models,
    }
    with open(os.path.join(ROOT, "tests", "fixtures", "groundtruth", "llamacpp_quant_mix.json"), "w") as fh:
        json.dump(doc, fh, sort_keys=True, separators=(",", ":"))
        fh.write("\n")


if __name__ == "__main__":
    main()
