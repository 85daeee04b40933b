#!/usr/bin/env python3
"""Writes fuzz/corpus/gguf/tiny.gguf, a small valid GGUF v3 file used as the
seed of fuzz/gguf_fuzzer.cpp.

Layout from llama.cpp a95a11e5b834 ggml/include/gguf.h and ggml/src/gguf.cpp
(docs/research/llamacpp.md section 1): magic "GGUF", uint32 version, int64
n_tensors, int64 n_kv, key/value pairs, tensor infos, padding to the alignment
(32), then the tensor data, each tensor padded to the alignment. Little-endian.
Type sizes (block elements / bytes) from the ggml type table of the same note.

Usage (from the repository root): python3 fuzz/make_gguf_seed.py
"""
import os
import struct

# GGUF value types, gguf.h:54-66.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
ALIGN = 32
# ggml types used here: id, elements per block, bytes per block.
GGML = {"f32": (0, 1, 4), "f16": (1, 1, 2), "q8_0": (8, 32, 34), "q4_K": (12, 256, 144), "q6_K": (14, 256, 210)}


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def pad(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def main():
    kv = [
        (gstr("general.architecture") + struct.pack("<i", STRING) + gstr("llama")),
        (gstr("general.alignment") + struct.pack("<iI", U32, ALIGN)),
        (gstr("general.file_type") + struct.pack("<iI", U32, 15)),
        (gstr("llama.block_count") + struct.pack("<iI", U32, 1)),
        (gstr("llama.embedding_length") + struct.pack("<iI", U32, 256)),
        (gstr("llama.rope.freq_base") + struct.pack("<if", F32, 10000.0)),
        (gstr("llama.attention.head_count_kv") + struct.pack("<iiQ", ARRAY, I32, 1) + struct.pack("<i", 2)),
        (gstr("tokenizer.ggml.add_bos_token") + struct.pack("<iB", BOOL, 1)),
        (gstr("tokenizer.ggml.tokens") + struct.pack("<iiQ", ARRAY, STRING, 4)
         + b"".join(gstr(t) for t in ["<s>", "</s>", "a", "b"])),
        (gstr("tokenizer.ggml.scores") + struct.pack("<iiQ", ARRAY, F32, 4) + struct.pack("<4f", 0, 0, -1, -2)),
        (gstr("test.u64") + struct.pack("<iQ", U64, 1 << 40)),
        (gstr("test.f64") + struct.pack("<id", F64, 0.5)),
    ]
    tensors = [
        ("token_embd.weight", [256, 4], "q4_K"),
        ("blk.0.attn_norm.weight", [256], "f32"),
        ("blk.0.ffn_down.weight", [256, 2], "q6_K"),
        ("blk.0.attn_q.weight", [32, 3], "q8_0"),
        ("output_norm.weight", [256], "f16"),
    ]
    infos = b""
    offset = 0
    sizes = []
    for name, ne, t in tensors:
        tid, blk, nb = GGML[t]
        size = ne[0] // blk * nb
        for d in ne[1:]:
            size *= d
        sizes.append(size)
        infos += gstr(name) + struct.pack("<I", len(ne)) + struct.pack("<%dq" % len(ne), *ne)
        infos += struct.pack("<iQ", tid, offset)
        offset += pad(size)
    out = b"GGUF" + struct.pack("<Iqq", 3, len(tensors), len(kv)) + b"".join(kv) + infos
    out += b"\0" * (pad(len(out)) - len(out))
    for size in sizes:
        out += b"\x11" * size + b"\0" * (pad(size) - size)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf", "tiny.gguf")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(out)
    print(f"wrote {os.path.relpath(path)} ({len(out)} bytes)")


if __name__ == "__main__":
    main()
