# Re-implementation (for checking only) of TGI launcher/src/main.rs @ db931fcf compute_optimal / vram_maximum
# and of the server warmup arithmetic. Not TGI code; numbers only.
FLOPS = {"nvidia-h100-80gb-hbm3":900e12,"nvidia-h100":900e12,"nvidia-h100-nvl":900e12,"nvidia-a100-sxm4-80gb":312e12,
         "nvidia-a100-80gb-pcie":312e12,"nvidia-a100-sxm4-40gb":312e12,"nvidia-l4":121e12,"nvidia-a10g":125e12,
         "nvidia-l40s":363e12,"nvidia-l40":181e12,"nvidia-a40":149e12,"nvidia-h200":989e12,"nvidia-t4":65e12,"nvidia-4090":82e12}
def flop(c):
    H,nh,nkv,hd,I,L=c["hidden"],c["heads"],c["kv"],c["head_dim"],c["inter"]*(c.get("ept",1)+c.get("shared",0)),c["layers"]
    attn=2*nh*hd*H*4+2*nkv*hd*H*2   # q,attn,o (=3) + ... see main.rs L281-308: q+k+v+attn+o
    attn=2*nh*hd*H + 2*nkv*hd*H + 2*nkv*hd*H + 2*nh*hd*H + 2*nh*hd*H
    return (attn + 2*3*H*I)*L
def model_vram(c):
    attn=(c["heads"]+2*c["kv"])*c["head_dim"]; o=c["heads"]*c["head_dim"]*c["hidden"]
    mlp=3*c["inter"]*c.get("experts",1)*c["hidden"]; vocab=c["hidden"]*c["vocab"]
    return ((mlp+attn+o)*c["layers"]+2*vocab)*2
def token_vram(c):
    kv=c["kv"]*2*c["head_dim"]*2*c["layers"]; I=c["inter"]
    return kv+(I+I//2)*c.get("experts",1)*2*3
def default_prefill(c, card, count, mib, mf=1.0, wiggle=0.95):
    default=4096
    if card in FLOPS:
        opt=int(FLOPS[card]*count)//flop(c)
        if opt>100: default=opt
    v=min(default, c["mpe"])
    avail=int(mib*2**20*count*mf*wiggle)
    if avail>model_vram(c): v=min(v,(avail-model_vram(c))//token_vram(c))
    return v, default
M={
 "Llama-3.1-8B":dict(hidden=4096,heads=32,kv=8,head_dim=128,inter=14336,layers=32,vocab=128256,mpe=131072),
 "Llama-3.1-70B":dict(hidden=8192,heads=64,kv=8,head_dim=128,inter=28672,layers=80,vocab=128256,mpe=131072),
 "Mistral-7B-v0.3":dict(hidden=4096,heads=32,kv=8,head_dim=128,inter=14336,layers=32,vocab=32768,mpe=32768),
 "Qwen2.5-7B":dict(hidden=3584,heads=28,kv=4,head_dim=128,inter=18944,layers=28,vocab=152064,mpe=32768),
}
GPUS=[("nvidia-h100-80gb-hbm3",81559),("nvidia-a100-sxm4-80gb",81920),("nvidia-l4",23034),("nvidia-a10g",23028),("nvidia-l40s",46068),("nvidia-h200",143771)]
if __name__=="__main__":
    for n,c in M.items():
        print(n,"flop/token=",flop(c),"model_vram=",model_vram(c),"token_vram=",token_vram(c))
        for g,mib in GPUS:
            for cnt in (1,2,4,8):
                if n!="Llama-3.1-70B" and cnt>1: continue
                if n=="Llama-3.1-70B" and cnt==1: continue
                print("   ",g,"x%d"%cnt,"default_prefill=%d (compute_optimal=%d)"%default_prefill(c,g,cnt,mib))
