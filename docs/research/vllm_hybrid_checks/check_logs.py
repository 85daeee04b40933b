"""Check vLLM v0.19 hybrid KV pool formulas against logged start-up lines. Run: python3 check_logs.py"""
from math import ceil, floor
import json
GiB = 1 << 30
def cdiv(a, b): return -(-a // b)

def plan(m, tp, L, mnbt, bs=16, prefix=False):
    """Returns (page, groups=[(kind, nlayers)], group_size, min_block_size, per_request_blocks)."""
    kvh = max(1, m["kv_heads"] // tp) if m.get("kind") != "mla" else 1
    db = m.get("dtype_bytes", 2)
    if m.get("kind") == "mla":
        page = bs * m["latent"] * db
        counts = {"full": m["layers"]}
    else:
        tok = kvh * 2 * m["head_dim"] * db            # FullAttentionSpec 1-token page (K+V)
        counts = dict(m["counts"])
        mbs = None
        if "mamba" in counts:                          # models/config.py HybridAttentionMambaModelConfig
            g = m["gdn"]
            conv_dim = g["hk"] * g["nk"] * 2 + g["hv"] * g["nv"]
            conv = (g["kernel"] - 1) * (conv_dim // tp) * db
            ssm = (g["nv"] // tp) * g["hv"] * g["hk"] * g["ssm_bytes"]
            mamba_page = conv + ssm
            bs = 16 * cdiv(mamba_page, 16 * tok)
            m["_mamba_page"] = mamba_page
        page = bs * tok
    mn, mx = min(counts.values()), max(counts.values())
    gs = mx if mx < 1.5 * mn else mn
    groups = []
    for t, n in counts.items():
        ng = cdiv(n, gs)
        groups += [(t, len(range(i, n, ng))) for i in range(ng)]
    min_bs = bs
    per_req = 0
    for t, _ in groups:
        if t == "full":  per_req += cdiv(L, bs)
        elif t == "swa": per_req += cdiv(min(m["window"] - 1 + mnbt, L), bs) + 1
        elif t == "chunk": per_req += cdiv(min(m["window"] + mnbt, L), bs)
        elif t == "mamba":
            mode = m.get("mamba_mode", "none")
            per_req += {"none": 1, "align": 2}[mode]
            if mode == "none": min_bs = min(min_bs, L)   # MambaSpec.block_size = max_model_len
    return dict(block_size=bs, page=page, group_size=gs, n_groups=len(groups), min_block_size=min_bs, per_req_blocks=per_req)

def outputs(p, nb):
    return nb // p["n_groups"] * p["min_block_size"], nb / p["per_req_blocks"]

MODELS = {
 "gemma-2-2b": dict(kv_heads=4, head_dim=256, counts={"swa": 13, "full": 13}, window=4096),
 "gemma-2-9b": dict(kv_heads=8, head_dim=256, counts={"swa": 21, "full": 21}, window=4096),
 "gemma-2-27b": dict(kv_heads=16, head_dim=128, counts={"swa": 23, "full": 23}, window=4096),
 "gemma-3-4b": dict(kv_heads=4, head_dim=256, counts={"swa": 29, "full": 5}, window=1024),
 "gemma-3-12b": dict(kv_heads=8, head_dim=256, counts={"swa": 40, "full": 8}, window=1024),
 "gemma-3-27b": dict(kv_heads=16, head_dim=128, counts={"swa": 52, "full": 10}, window=1024),
 "llama-4-scout": dict(kv_heads=8, head_dim=128, counts={"chunk": 36, "full": 12}, window=8192),
 "gpt-oss-20b": dict(kv_heads=8, head_dim=64, counts={"swa": 12, "full": 12}, window=128),
 "deepseek-v2-lite": dict(kind="mla", layers=27, latent=576),
 "kimi-vl-a3b": dict(kind="mla", layers=27, latent=576),
 "mistral-small-3.1-24b": dict(kv_heads=8, head_dim=128, counts={"full": 40}),
 "qwen3-next-80b": dict(kv_heads=2, head_dim=256, counts={"mamba": 36, "full": 12},
                        gdn=dict(nk=16, nv=32, hk=128, hv=128, kernel=4, ssm_bytes=2)),
 "qwen3.5-9b": dict(kv_heads=4, head_dim=256, counts={"mamba": 24, "full": 8},
                    gdn=dict(nk=16, nv=32, hk=128, hv=128, kernel=4, ssm_bytes=4)),
 "qwen3.5-35b-a3b": dict(kv_heads=2, head_dim=256, counts={"mamba": 30, "full": 10}, mamba_mode="align",
                    gdn=dict(nk=16, nv=32, hk=128, hv=128, kernel=4, ssm_bytes=4)),
}
# id, model, tp, L, mnbt, avail GiB, logged num_blocks or None, logged tokens, logged conc
ROWS = [
 ("llmd-h100-gemma2-2b-tp1", "gemma-2-2b", 1, 8192, 8192, 66.47, 83770, 670160, 81.73),
 ("llmd-h100-gemma2-9b-tp1", "gemma-2-9b", 1, 8192, 8192, 54.12, 21110, 168880, 20.60),
 ("llmd-h100-gemma2-27b-tp1", "gemma-2-27b", 1, 8192, 8192, 20.59, 7335, 58672, 7.16),
 ("llmd-h100-gemma3-4b-tp1", "gemma-3-4b", 1, 8192, 8192, 62.51, 204817, 468144, 57.05),
 ("llmd-h100-gemma3-12b-tp1", "gemma-3-12b", 1, 8192, 8192, 47.72, 48867, 130304, 15.88),
 ("llmd-h100-gemma3-27b-tp1", "gemma-3-27b", 1, 8192, 8192, 19.53, 15997, 36560, 4.46),
 ("llmd-h100-llama4-scout-tp4", "llama-4-scout", 4, 8192, 8192, 16.75, 91495, 365968, 44.68),
 ("llmd-h100-gptoss-20b-tp2", "gpt-oss-20b", 2, 8192, 8192, 59.32, 323972, 2591776, 316.07),
 ("llmd-h100-deepseek-v2-lite-tp1", "deepseek-v2-lite", 1, 8192, 8192, 43.61, 94097, 1505552, 183.78),
 ("llmd-h100-kimi-vl-a3b-tp1", "kimi-vl-a3b", 1, 8192, 8192, 41.32, 89148, 1426368, 174.12),
 ("llmd-h100-kimi-vl-a3b-tp2", "kimi-vl-a3b", 2, 8192, 8192, 54.78, 118181, 1890896, 230.82),
 ("llmd-h100-mistral-small-3.1-tp1", "mistral-small-3.1-24b", 1, 8192, 8192, 28.19, 11547, 184752, 22.55),
 ("qwen3next-h200-tp2-v0102", "qwen3-next-80b", 2, 262144, 8192, 44.59, None, 973760, 14.77),
 ("qwen35-9b-l40s-v0190", "qwen3.5-9b", 1, 262144, 8192, 20.27, None, 165792, 2.52),
 ("qwen35-35b-a3b-gb10-v018", "qwen3.5-35b-a3b", 1, 262144, 2048, 55.72, None, 729696, 10.85),
]
out = []
for rid, mk, tp, L, mnbt, g, nb_log, tok_log, conc_log in ROWS:
    m = dict(MODELS[mk]); p = plan(m, tp, L, mnbt)
    per_blk = p["page"] * p["group_size"]
    lo, hi = floor((g - 0.005) * GiB) // per_blk, (ceil((g + 0.005) * GiB) - 1) // per_blk
    mid = int(g * GiB) // per_blk
    cands = {nb: outputs(p, nb) for nb in range(lo, hi + 1)}
    ok_nb = [nb for nb, (t, c) in cands.items() if t == tok_log and f"{c:.2f}" == f"{conc_log:.2f}"]
    t_mid, c_mid = outputs(p, mid)
    rec = dict(id=rid, model=mk, tp=tp, L=L, mnbt=mnbt, **p, avail_gib=g, blocks_range=[lo, hi], blocks_from_gib=mid,
               tokens_from_gib=t_mid, conc_from_gib=round(c_mid, 2), logged_blocks=nb_log, logged_tokens=tok_log,
               logged_conc=conc_log, consistent_blocks=ok_nb,
               exact_from_logged_blocks=(None if nb_log is None else outputs(p, nb_log)[0] == tok_log and f"{outputs(p, nb_log)[1]:.2f}" == f"{conc_log:.2f}"))
    if "_mamba_page" in m: rec["mamba_page"] = m["_mamba_page"]
    out.append(rec)
    print(f"{rid:34s} bs={p['block_size']:4d} page={p['page']:8d} gs={p['group_size']:2d} groups={p['n_groups']} "
          f"req_blocks={p['per_req_blocks']:5d} blocks[{lo},{hi}] mid={mid} -> tok={t_mid} conc={c_mid:.2f} | "
          f"log blocks={nb_log} tok={tok_log} conc={conc_log} | exact_from_logged_blocks={rec['exact_from_logged_blocks']} consistent={ok_nb}")
json.dump(out, open("check_logs_out.json", "w"), indent=1)
