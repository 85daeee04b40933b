# Re-derivation of a few "Model loading took" figures (research scratch; not project code).
GiB = 1 << 30
def r512(b): return max(512, -(-b // 512) * 512) if b > 0 else 0

def gptoss(L, E, H=2880, I=2880, V=201088, Ipad=64, Hpad=1, bias_bytes=2, rope_bytes=2, rope_pos=131072, rope_dim=64):
    Hp = -(-H // Hpad) * Hpad; Ip = -(-I // Ipad) * Ipad
    moe = (r512(E*2*Ip*Hp//2) + r512(E*2*Ip*Hp//32) + r512(E*Hp*Ip//2) + r512(E*Hp*Ip//32)
           + r512(E*2*Ip*bias_bytes) + r512(E*Hp*bias_bytes))
    q, kv, hd = 64, 8, 64
    attn = (r512((q+2*kv)*hd*H*2) + r512((q+2*kv)*hd*2) + r512(H*q*hd*2) + r512(H*2) + r512(q*4)
            + r512(E*H*2) + r512(E*2) + 2*r512(H*2))
    emb = 2*r512(V*H*2)
    total = L*(moe+attn) + emb + r512(H*2) + r512(rope_pos*rope_dim*rope_bytes)
    return total

for name, L, E in [("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)]:
    for label, kw in [("no pad, bf16 bias", dict(Ipad=1)),
                      ("triton (I->64, fp32 bias)", dict(Ipad=64, bias_bytes=4)),
                      ("marlin (I->128, H->256, bf16 bias)", dict(Ipad=128, Hpad=256)),
                      ("trtllm (I->256, H->256)", dict(Ipad=256, Hpad=256))]:
        t = gptoss(L, E, **kw)
        print(f"{name:13s} {label:38s} {t:>16,d} B = {t/GiB:.4f} GiB")

def dense(L, H, I, q, kv, hd, V, tied, rope_pos, wbytes_fn, extra_per_layer=0, qkv_bias=False, qk_norm=False, tp=1, dt=2):
    # wbytes_fn(N, K) -> bytes of one quantized linear incl. its scales (per rank)
    qkvN = (q + 2*kv)*hd // tp
    lin = (wbytes_fn(qkvN, H) + wbytes_fn(H, q*hd//tp) + wbytes_fn(2*I//tp, H) + wbytes_fn(H, I//tp))
    per = lin + 2*r512(H*dt) + extra_per_layer
    if qkv_bias: per += r512(qkvN*dt)
    if qk_norm: per += 2*r512(hd*dt)
    Vp = -(-V // 64) * 64 // tp
    emb = r512(Vp*H*dt) * (1 if tied else 2)
    return L*per + emb + r512(H*dt) + r512(rope_pos*hd*dt)

fp8_tensor = lambda N, K: r512(N*K) + r512(4)               # per-tensor: fp8 weight + scalar fp32
fp8_chan   = lambda N, K: r512(N*K) + r512(N*4)              # per-channel fp32 [N,1]
fp8_block  = lambda N, K: r512(N*K) + r512(-(-N//128)*-(-K//128)*4)
def awq_marlin(N, K, g=128, dt=2, sms=76):
    G = K // g
    return r512(N*K//2) + r512(G*N*dt) + r512(G*N//2) + r512(sms*4)
bf16 = lambda N, K: r512(N*K*2)

rows = [
 ("Llama-3.1-8B bf16 (check)", dense(32, 4096, 14336, 32, 8, 128, 128256, False, 131072, bf16)),
 ("Llama-3.1-8B --quantization fp8", dense(32, 4096, 14336, 32, 8, 128, 128256, False, 131072, fp8_tensor)),
 ("Llama-3.3-70B fp8-dynamic tp4", dense(80, 8192, 28672, 64, 8, 128, 128256, False, 131072, fp8_chan, tp=4)),
 ("Qwen2.5-7B-Instruct-AWQ (marlin, fp16)", dense(28, 3584, 18944, 28, 4, 128, 152064, False, 32768, awq_marlin, qkv_bias=True)),
 ("Qwen3-8B-FP8 (block 128)", dense(36, 4096, 12288, 32, 8, 128, 151936, False, 40960, fp8_block, qk_norm=True)),
]
for n, t in rows: print(f"{n:42s} {t:>16,d} B = {t/GiB:.4f} GiB")

# Qwen3-30B-A3B-FP8 (MoE, block fp8, experts fp8 via FusedMoE, router bf16)
H, L, E, Im, V = 2048, 48, 128, 768, 151936
attn = fp8_block(5120, H) + fp8_block(H, 4096) + 2*r512(128*2)
moe = r512(E*2*Im*H) + r512(E*(2*Im//128)*(H//128)*4) + r512(E*H*Im) + r512(E*(H//128)*(Im//128)*4)
per = attn + moe + r512(E*H*2) + 2*r512(H*2)
t = L*per + 2*r512(V*H*2) + r512(H*2) + r512(40960*128*2)
print(f"{'Qwen3-30B-A3B-FP8':42s} {t:>16,d} B = {t/GiB:.4f} GiB")

# gpt-oss-20b with the tensor shapes printed next to "Model loading took 13.7153 GiB"
# (w13 [32,5888,1536] u8, w2 [32,3072,1472] u8, scales [32,5888,96]/[32,3072,92] u8, biases fp32),
# rope cache fp32 [131072, 64]
t = gptoss(24, 32, Ipad=128, Hpad=256, bias_bytes=4, rope_bytes=4)
print(f"gpt-oss-20b marlin-style pad + fp32 bias + fp32 rope: {t:,d} B = {t/GiB:.4f} GiB")
t = gptoss(36, 128, Ipad=128, Hpad=256, bias_bytes=4, rope_bytes=4)
print(f"gpt-oss-120b marlin-style pad + fp32 bias + fp32 rope: {t:,d} B = {t/GiB:.4f} GiB")
t = gptoss(36, 128, Ipad=128, Hpad=256, bias_bytes=2, rope_bytes=4)
print(f"gpt-oss-120b marlin-style pad + bf16 bias + fp32 rope: {t:,d} B = {t/GiB:.4f} GiB")
t = gptoss(24, 32, Ipad=128, Hpad=256, bias_bytes=2, rope_bytes=4)
print(f"gpt-oss-20b marlin-style pad + bf16 bias + fp32 rope: {t:,d} B = {t/GiB:.4f} GiB")
