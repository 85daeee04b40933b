"""Re-implementation (for checking only) of vLLM v0.19 KV pool arithmetic for hybrid layouts.
Formulas from vllm/v1/core/kv_cache_utils.py and vllm/v1/kv_cache_interface.py at tag v0.19.0
(read from SystemPanic/vllm-windows tag v0.19.0 = upstream main a5a623d96 + Windows build patches)."""
from math import ceil, floor
GiB = 1 << 30
def cdiv(a, b): return -(-a // b)

def attn_page(bs, kv_heads, head, dtype_bytes, head_v=None):
    head_v = head if head_v is None else head_v
    return bs * kv_heads * (head + head_v) * dtype_bytes

def max_mem_pages(kind, L, bs, mnbt, window=None, mamba_spec=0, mamba_mode="none"):
    """blocks one request of max_model_len L needs in one layer of this group (max_memory_usage_bytes / page)."""
    if kind == "full":   return cdiv(L, bs)
    if kind == "swa":    return cdiv(min(window - 1 + mnbt, L), bs) + 1
    if kind == "chunk":  return cdiv(min(window + mnbt, L), bs)
    if kind == "mamba":
        return {"none": 1 + mamba_spec, "align": 2 + mamba_spec}.get(mamba_mode) or cdiv(L, bs)
    raise ValueError(kind)

def groups_for(layer_counts):
    """layer_counts: dict type->count. returns (group_size, list of (type, nlayers)) per _get_kv_cache_groups_uniform_page_size."""
    mn, mx = min(layer_counts.values()), max(layer_counts.values())
    gs = mx if mx < mn * 1.5 else mn
    groups = []
    for t, n in layer_counts.items():
        ng = cdiv(n, gs)
        for i in range(ng):
            groups.append((t, len(range(i, n, ng))))
    return gs, groups

def pool(avail, page, layer_counts, L, bs, mnbt, kinds_args, min_block_size=None, hybrid=True):
    if not hybrid or len(layer_counts) == 1:
        # one group, all layers (uniform / disable_hybrid_kv_cache_manager -> full attention)
        n = sum(layer_counts.values())
        nb = avail // page // n
        t = list(layer_counts)[0] if len(layer_counts) == 1 else "full"
        per_req = max_mem_pages(t if hybrid else "full", L, bs, mnbt, **(kinds_args.get(t, {}) if hybrid else {}))
        return dict(group_size=n, groups=1, num_blocks=nb, tokens=nb * bs, conc=nb / per_req, per_req_blocks=per_req)
    gs, groups = groups_for(layer_counts)
    nb = avail // page // gs
    per_req = sum(max_mem_pages(t, L, bs, mnbt, **kinds_args.get(t, {})) for t, _ in groups)
    mbs = min_block_size or bs
    return dict(group_size=gs, groups=len(groups), num_blocks=nb, tokens=nb // len(groups) * mbs,
                conc=nb / per_req, per_req_blocks=per_req)

if __name__ == "__main__":
    # Gemma-2-9B, H100 TP1, bf16, bs16, L=8192, MNBT=8192 (H100 serve default)
    page = attn_page(16, 8, 256, 2)
    print("gemma2 page/layer", page)
    lo, hi = 54.115 * GiB, 54.125 * GiB
    print("blocks range for 54.12 GiB:", floor(lo) // page // 21, (ceil(hi) - 1) // page // 21)
    r = pool(21110 * page * 21, page, {"swa": 21, "full": 21}, 8192, 16, 8192, {"swa": {"window": 4096}})
    print("gemma2 from num_blocks 21110:", r, "concurrency %.2f" % r["conc"])
    r = pool(int(54.12 * GiB), page, {"swa": 21, "full": 21}, 8192, 16, 8192, {"swa": {"window": 4096}})
    print("gemma2 from 54.12 GiB exactly:", r, "concurrency %.2f" % r["conc"])
    r = pool(int(54.12 * GiB), page, {"swa": 21, "full": 21}, 8192, 16, 8192, {}, hybrid=False)
    print("gemma2 --disable-hybrid-kv-cache-manager:", r, "concurrency %.2f" % r["conc"])
