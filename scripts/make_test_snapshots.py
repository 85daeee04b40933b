#!/usr/bin/env python3
"""Writes the small PyTorch memory-snapshot fixtures under tests/fixtures/snapshots/.

The files have the shape torch.cuda.memory._dump_snapshot() writes (a pickle of
the dict torch.cuda.memory._snapshot() returns; pickle.dump's default protocol,
4 on Python 3.8-3.13) but describe made-up runs whose allocator behaviour can
be worked out by hand (see tests/snapshot_test.cpp). Only the standard library
is used and the output is deterministic: running this again gives identical
bytes.

    python3 scripts/make_test_snapshots.py
"""
import json
import os
import pickle

MiB = 1024 * 1024
PROTOCOL = 4  # pickle.DEFAULT_PROTOCOL on Python 3.8-3.13, what torch users get

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "snapshots")


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


# A C++ frame first (stacks="all" puts the unwinder's frames there), then the
# Python frames innermost first, as torch records them. The first .py frame
# is the one gpumem labels allocations with.
CPP = frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1100, "c10::cuda::CUDACachingAllocator::Native::malloc")


def stack(*py):
    return [CPP] + [frame(f, ln, n) for f, ln, n in py]


# Shared frame lists (torch dedups tracebacks, so pickle memoizes them).
F_STEP = stack(("/work/train.py", 40, "train_step"))
F_W = stack(("/work/model.py", 12, "__init__"), ("/work/train.py", 20, "main"))
F_A1 = stack(("/work/model.py", 30, "forward"), ("/work/train.py", 41, "train_step"))
F_A2 = stack(("/work/model.py", 31, "forward"), ("/work/train.py", 41, "train_step"))
F_G = stack(("/work/train.py", 43, "train_step"))
F_Y = stack(("/work/train.py", 44, "train_step"))
F_T = stack(("/work/train.py", 46, "train_step"))

SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "roundup_power2_divisions": {},
}


def segment(address, total, stream, seg_type, blocks):
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    assert sum(b["size"] for b in blocks) == total
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": active,
        "requested_size": requested,
        "stream": stream,
        "segment_type": seg_type,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def block(address, size, requested, state, frames):
    return {"address": address, "size": size, "requested_size": requested, "state": state, "frames": frames}


def train_step():
    """A made-up training step on device 0, stream 0 (worked in snapshot_test.cpp).

    x  = 4 B step counter     -> 512 B block in a new 2 MiB small segment A
    w  = 10.5 MiB weight      -> >= 10 MiB: a 12 MiB segment B (2 MiB multiple),
                                 1.5 MiB remainder split off (> 1 MiB)
    a1 = 3 MiB activation     -> < 10 MiB: a new 20 MiB segment C, 17 MiB left
    a2 = 4 MiB activation     -> C, 13 MiB left
    g  = 6 MiB - 100 B grad   -> 6 MiB block in C, 7 MiB left
    free a2, free a1          -> 7 MiB free at the start of C
    y  = 1000 B               -> 1024 B block in A after x
    free x
    t  = 30 MiB temporary     -> a new 30 MiB segment D (peak: 46.50 MiB allocated, 64 MiB reserved)
    free t, empty_cache()     -> D released (segment_free)
    """
    A, B, C, D = 0x7F3A00000000, 0x7F3A00200000, 0x7F3A01000000, 0x7F3A02400000
    trace = []
    clock = [1_700_000_000_000_000]

    def ev(action, addr, size, frames=None):
        clock[0] += 125
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": clock[0]}
        if frames is not None:
            e["frames"] = frames
        trace.append(e)

    def free(addr, size, frames):
        ev("free_requested", addr, size, frames)
        ev("free_completed", addr, size, frames)

    ev("segment_alloc", A, 2 * MiB, F_STEP)
    ev("alloc", A, 4, F_STEP)                          # x
    ev("segment_alloc", B, 12 * MiB, F_W)
    ev("alloc", B, 11010048, F_W)                      # w = 10.5 MiB
    ev("segment_alloc", C, 20 * MiB, F_A1)
    ev("alloc", C, 3 * MiB, F_A1)                      # a1
    ev("alloc", C + 3 * MiB, 4 * MiB, F_A2)            # a2
    ev("alloc", C + 7 * MiB, 6 * MiB - 100, F_G)       # g
    free(C + 3 * MiB, 4 * MiB, F_A2)
    free(C, 3 * MiB, F_A1)
    ev("alloc", A + 512, 1000, F_Y)                    # y
    free(A, 4, F_STEP)
    ev("segment_alloc", D, 30 * MiB, F_T)
    ev("alloc", D, 30 * MiB, F_T)                      # t
    free(D, 30 * MiB, F_T)
    ev("segment_free", D, 30 * MiB, F_T)               # torch.cuda.empty_cache()
    ev("snapshot", 0, 0)

    segments = [
        segment(A, 2 * MiB, 0, "small", [
            block(A, 512, 4, "inactive", F_STEP),
            block(A + 512, 1024, 1000, "active_allocated", F_Y),
            block(A + 1536, 2 * MiB - 1536, 0, "inactive", []),
        ]),
        segment(B, 12 * MiB, 0, "large", [
            block(B, 11010048, 11010048, "active_allocated", F_W),
            block(B + 11010048, 1572864, 0, "inactive", []),
        ]),
        segment(C, 20 * MiB, 0, "large", [
            block(C, 7 * MiB, 3 * MiB, "inactive", F_A1),
            block(C + 7 * MiB, 6 * MiB, 6 * MiB - 100, "active_allocated", F_G),
            block(C + 13 * MiB, 7 * MiB, 0, "inactive", []),
        ]),
    ]
    return {"segments": segments, "device_traces": [trace, []], "allocator_settings": dict(SETTINGS)}


def legacy_history():
    """PyTorch ~2.0 layout: blocks carry `history` (most recent first), no
    requested_size, no device_traces. One 20 MiB large segment, one small one."""
    L, S = 0x7F5000000000, 0x7F5001400000
    segments = [
        {
            "address": L, "total_size": 20 * MiB, "allocated_size": 8_000_000, "active_size": 8_000_000,
            "stream": 0, "segment_type": "large",
            "blocks": [
                {"size": 8_000_000, "state": "active_allocated",
                 "history": [{"addr": L, "real_size": 8_000_000, "frames": F_A1}]},
                {"size": 20 * MiB - 8_000_000, "state": "inactive",
                 "history": [{"addr": L + 8_000_000, "real_size": 4 * MiB, "frames": F_A2}]},
            ],
        },
        {
            "address": S, "total_size": 2 * MiB, "allocated_size": 512, "active_size": 512,
            "stream": 0, "segment_type": "small",
            "blocks": [
                {"size": 512, "state": "active_allocated",
                 "history": [{"addr": S, "real_size": 100, "frames": F_STEP}]},
                {"size": 2 * MiB - 512, "state": "inactive"},
            ],
        },
    ]
    return {"segments": segments}


def oom():
    """Two 8 MiB tensors in one 20 MiB segment, then a 1 GiB request fails."""
    L = 0x7F6000000000
    trace = []
    t = [1_700_000_500_000_000]

    def ev(e):
        t[0] += 50
        e.setdefault("stream", 0)
        e["time_us"] = t[0]
        trace.append(e)

    ev({"action": "segment_alloc", "addr": L, "size": 20 * MiB, "frames": F_A1})
    ev({"action": "alloc", "addr": L, "size": 8 * MiB, "frames": F_A1})
    ev({"action": "alloc", "addr": L + 8 * MiB, "size": 8 * MiB, "frames": F_A2})
    ev({"action": "oom", "device_free": 50 * MiB, "size": 1024 * MiB, "frames": F_T})
    segments = [segment(L, 20 * MiB, 0, "large", [
        block(L, 8 * MiB, 8 * MiB, "active_allocated", F_A1),
        block(L + 8 * MiB, 8 * MiB, 8 * MiB, "active_allocated", F_A2),
        block(L + 16 * MiB, 4 * MiB, 0, "inactive", []),
    ])]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": dict(SETTINGS)}


def write(name, data):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(data)
    print(f"wrote {os.path.relpath(path)} ({len(data)} bytes)")


def main():
    os.makedirs(OUT, exist_ok=True)
    step = train_step()
    write("train_step.pickle", pickle.dumps(step, protocol=PROTOCOL))
    # json turns the segment_pool_id tuples into lists, as any JSON export does.
    write("train_step.json", (json.dumps(step, indent=1) + "\n").encode())
    write("legacy_history.pickle", pickle.dumps(legacy_history(), protocol=PROTOCOL))
    write("oom.pickle", pickle.dumps(oom(), protocol=PROTOCOL))


if __name__ == "__main__":
    main()
