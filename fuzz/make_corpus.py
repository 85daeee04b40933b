#!/usr/bin/env python3
"""Regenerates the seed corpora under fuzz/corpus/<target>/ (committed).

Every seed is derived from files in the repository (data/presets,
tests/fixtures) or written here from the documented formats, so that running
this script again gives the same bytes. Usage, from the repository root:

    python3 fuzz/make_corpus.py            (rewrite fuzz/corpus)
    python3 fuzz/make_corpus.py --check    (exit 1 if the committed seeds differ)

fuzz/corpus/gguf/ is written by fuzz/make_gguf_seed.py; crash reproducers live
in fuzz/regressions/<target>/ and are never regenerated.
"""
import filecmp
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def reset(target):
    d = CORPUS / target
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def write(d, name, data):
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def copy(d, src, name=None):
    shutil.copyfile(ROOT / src, d / (name or Path(src).name))


def hf_config():
    # One preset per model_type (the first by name), plus the test configs.
    d = reset("hf_config")
    seen = set()
    for p in sorted((ROOT / "data/presets/configs").glob("*.json")):
        t = json.loads(p.read_text()).get("model_type")
        if t in seen:
            continue
        seen.add(t)
        copy(d, p.relative_to(ROOT))
    for p in sorted((ROOT / "tests/fixtures/configs").glob("*.json")):
        copy(d, p.relative_to(ROOT), "fixture-" + p.name)


def layer_list():
    d = reset("layer_list")
    for p in sorted((ROOT / "tests/fixtures/models").glob("*.json")):
        copy(d, p.relative_to(ROOT))


def graph_json():
    # The smaller traced graphs; load_model also dispatches to layer lists and
    # HF configs, so one of each rides along.
    d = reset("graph_json")
    for name in ("tiny-cnn.json", "oracle.json", "vit-tiny.json"):
        copy(d, "tests/fixtures/traced/" + name)
    copy(d, "tests/fixtures/models/toy_mlp.json", "layer-list-toy_mlp.json")
    copy(d, "tests/fixtures/configs/bert-base-cased.json", "config-bert-base-cased.json")


def onnx():
    d = reset("onnx")
    for name in ("cnn_eval.onnx", "cnn_train.onnx", "unet_eval.onnx"):
        copy(d, "tests/fixtures/onnx/" + name)


def safetensors_file(tensors, metadata=None, pad_to=8):
    """A safetensors file: u64 LE header length, JSON header, data."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1}
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        n = sizes[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % pad_to)
    return struct.pack("<Q", len(text)) + text + bytes(offset)


def safetensors():
    d = reset("safetensors")
    write(d, "tiny.safetensors", safetensors_file(
        [("model.embed_tokens.weight", "BF16", [16, 8]), ("model.layers.0.mlp.up_proj.weight", "BF16", [32, 8]),
         ("model.norm.weight", "F32", [8])], {"format": "pt"}))
    write(d, "mixed.safetensors", safetensors_file(
        [("a", "F16", [2, 3]), ("b", "I64", [4]), ("c", "U8", [0]), ("d", "F8_E4M3", [3, 3]), ("e", "BOOL", [])]))
    write(d, "empty.safetensors", safetensors_file([]))


def batched_trace_pickle():
    """A torch-shaped snapshot whose trace is appended in batches of 4 (as
    pickle.dump appends batches of 1000): entries after the first batch take
    the pickle reader's direct path (sim/pickle.hpp), which the fixtures'
    single batches never reach. The pure-Python pickler, protocol 4."""
    import pickle
    frames = [[{"filename": "alloc.cpp", "line": 9, "name": "malloc"},
               {"filename": "m%d.py" % k, "line": k, "name": "f"}] for k in range(3)]
    # (Four keys an entry: the pickler batches a dict's items by the same count.)
    trace = [{"action": "free_completed" if i % 2 else "alloc", "addr": 139000000000000 + 512 * (i // 2 % 5),
              "size": 512 * (i % 3 + 1), "frames": frames[i // 2 % 3]} for i in range(24)]
    import io

    class Batches4(pickle._Pickler):
        _BATCHSIZE = 4

    out = io.BytesIO()
    Batches4(out, protocol=4).dump({"segments": [], "device_traces": [trace]})
    return out.getvalue()


def snapshots():
    d = reset("snapshot_pickle")
    for p in sorted((ROOT / "tests/fixtures/snapshots").glob("*.pickle")):
        copy(d, p.relative_to(ROOT))
    write(d, "batched_trace.pickle", batched_trace_pickle())
    d = reset("snapshot_json")
    for p in sorted((ROOT / "tests/fixtures/snapshots").glob("*.json")):
        copy(d, p.relative_to(ROOT))


def megatron():
    # Argument sets of tests/compat_test.cpp's shapes (dense GPT, GQA + SwiGLU
    # with "--flag" spellings, MoE, multi-latent attention).
    d = reset("megatron")
    seeds = {
        "gpt.json": {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 50257,
                     "seq_length": 2048, "micro_batch_size": 4, "tensor_model_parallel_size": 2,
                     "pipeline_model_parallel_size": 2, "world_size": 8, "sequence_parallel": True,
                     "recompute_granularity": "selective", "use_distributed_optimizer": True},
        "llama-flags.json": {"--num-layers": 32, "--hidden-size": 4096, "--ffn-hidden-size": 14336,
                             "--num-attention-heads": 32, "--group-query-attention": True, "--num-query-groups": 8,
                             "--swiglu": True, "--normalization": "RMSNorm", "--untie-embeddings-and-output-weights": True,
                             "--disable-bias-linear": True, "--padded-vocab-size": 128256, "--seq-length": 8192,
                             "--micro-batch-size": 1, "--tensor-model-parallel-size": 4, "--world-size": 8},
        "moe.json": {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32,
                     "vocab_size": 32000, "seq_length": 4096, "micro_batch_size": 1, "num_experts": 8,
                     "moe_router_topk": 2, "pipeline_model_parallel_size": 4,
                     "num_layers_per_virtual_pipeline_stage": 4, "world_size": 32, "expert_model_parallel_size": 4,
                     "moe_layer_freq": "[1,0]*16", "num_microbatches": 8},
        "mla.json": {"num_layers": 27, "hidden_size": 2048, "ffn_hidden_size": 10944, "num_attention_heads": 16,
                     "vocab_size": 102400, "seq_length": 4096, "micro_batch_size": 1, "multi_latent_attention": True,
                     "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
                     "num_experts": 64, "moe_ffn_hidden_size": 1408, "moe_router_topk": 6,
                     "moe_shared_expert_intermediate_size": 2816, "mtp_num_layers": 1,
                     "recompute_granularity": "full"},
    }
    for name, args in seeds.items():
        write(d, name, json.dumps(args, indent=1) + "\n")


def doctor():
    # The two wordings (plan/doctor.hpp), as tests/doctor_test.cpp quotes them.
    d = reset("doctor")
    write(d, "v1.txt", "CUDA out of memory. Tried to allocate 1.24 GiB (GPU 0; 15.78 GiB total capacity; 10.34 GiB "
                       "already allocated; 435.50 MiB free; 14.21 GiB reserved in total by PyTorch)")
    write(d, "v2-full.txt", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                            "capacity of 79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process "
                            "has 78.08 GiB memory in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and "
                            "1.02 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
                            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    write(d, "v2-others.txt", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a "
                              "total capacity of 47.27 GiB of which 9.38 MiB is free. Process 644963 has 5.59 MiB memory "
                              "in use. Process 3053273 has 29.04 GiB memory in use. Including non-PyTorch memory, this "
                              "process has 3.14 GiB memory in use. 2.00 GiB allowed; Of the allocated memory 2.92 GiB is "
                              "allocated by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and "
                              "34.62 MiB is reserved by PyTorch but unallocated.")
    write(d, "v21-capacty.txt", "[rank1]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. "
                                "GPU 0 has a total capacty of 23.99 GiB of which 7.20 GiB is free. Of the allocated memory "
                                "15.50 GiB is allocated by PyTorch, and 120 bytes is reserved by PyTorch but unallocated.")


def fields():
    # "NAME=TEXT" (fuzz/fields_fuzzer.cpp): a value of each kind of field.
    d = reset("fields")
    seeds = ["batch=4", "seq=4096", "gpu-memory=24GiB", "params=7B", "precision=amp-bf16", "gpus=64",
             "lora-targets=q_proj,v_proj", "batches=1,2,4,8", "grad-accum=16", "gpu=H100-80GB",
             "measured-total=14949MiB", "buffer-factor=1.5", "recompute=selective", "mode=infer",
             "gen-len=512", "tp=8", "format=json", "mem-fraction-static=0.85", "alloc-conf=expandable_segments:True",
             "config={\"model_type\": \"llama\", \"hidden_size\": 64}"]
    for i, s in enumerate(seeds):
        write(d, "%02d-%s" % (i, s.split("=")[0]), s)


def api():
    # "COMMAND\nBODY" (fuzz/api_fuzzer.cpp): one body per command the service
    # takes, from the CLI's examples (src/api/cli_docs.cpp).
    d = reset("api")
    small = json.loads((ROOT / "data/presets/configs/smollm2-135m.json").read_text())
    bodies = [
        ("estimate", {"model": "llama-3-8b", "batch": 4, "seq": 4096, "gpu": "H100-80GB"}),
        ("estimate", {"model": "mixtral-8x7b", "gpus": 64, "tp": 2, "pp": 4, "ep": 8, "distributed_optimizer": True}),
        ("estimate", {"config": small, "batch": 2, "seq": 512}),
        ("estimate", {"model": "llama-3-8b", "mode": "infer", "batch": 16, "seq": 8192, "gen_len": 512}),
        ("timeline", {"model": "gpt2", "batch": 2, "seq": 256}),
        ("fit", {"model": "gpt2", "mode": "infer", "gpu": "L4"}),
        ("advise", {"model": "llama-2-13b", "gpu": "RTX-4090-24GB"}),
        ("plan", {"model": "llama-3-70b", "gpus": 64, "gpu": "H100-80GB", "seq": 8192}),
        ("sweep", {"model": "gpt2", "batches": [1, 2, 4], "seqs": [512, 1024]}),
        ("doctor", {"message": "CUDA out of memory. Tried to allocate 1.24 GiB (GPU 0; 15.78 GiB total capacity; "
                               "10.34 GiB already allocated; 435.50 MiB free; 14.21 GiB reserved in total by PyTorch)",
                    "model": "llama-3-8b", "batch": 8}),
        ("params", {"model": "llama-3-8b"}),
        ("snapshot", {"data": (ROOT / "tests/fixtures/snapshots/train_step.json").read_text()}),
        ("compat-deepspeed", {"params": "2.78B", "stage": 3, "gpus_per_node": 8}),
        ("compat-deepspeed", {"model": "llama-3-8b", "stage": 2}),
        ("serving", {"model": "llama-3.1-8b", "gpu": "H100-80GB", "max_model_len": 32768}),
        ("calibrate", {"model": "bert-large-uncased", "gpu": "V100-16GB", "seq": 512, "batch": 4, "attention": "eager",
                       "precision": "fp32", "measured_total": "14949MiB"}),
        ("models", {}),
        ("gpus", {}),
    ]
    for i, (cmd, body) in enumerate(bodies):
        write(d, "%02d-%s" % (i, cmd), cmd + "\n" + json.dumps(body, separators=(",", ":")))


def generate():
    hf_config()
    layer_list()
    graph_json()
    onnx()
    safetensors()
    snapshots()
    megatron()
    doctor()
    fields()
    api()


def differences(want, got):
    """Files that differ between two corpus folders, each target folder of
    `want` (the freshly written seeds) against the same folder of `got`."""
    out = []
    for d in sorted(p for p in want.iterdir() if p.is_dir()):
        g = got / d.name
        names = sorted(p.name for p in d.iterdir())
        have = sorted(p.name for p in g.iterdir()) if g.is_dir() else []
        out += [f"{d.name}/{n}: not committed" for n in names if n not in have]
        out += [f"{d.name}/{n}: not written by this script" for n in have if n not in names]
        out += [f"{d.name}/{n}: differs" for n in names if n in have and not filecmp.cmp(d / n, g / n, shallow=False)]
    return out


def main(argv):
    global CORPUS
    if argv not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    if not argv:
        generate()
        return 0
    committed = CORPUS
    with tempfile.TemporaryDirectory() as tmp:
        CORPUS = Path(tmp)
        generate()
        diff = differences(CORPUS, committed)
    for line in diff:
        print(f"fuzz/corpus/{line}", file=sys.stderr)
    if diff:
        print("the committed seeds are not what fuzz/make_corpus.py writes: run it and commit fuzz/corpus", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
