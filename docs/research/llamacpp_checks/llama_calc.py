from calc import *
CFG={ # n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, tied, rope_freqs, attn_bias(qkv bias), qk_norm
 'llama3_8b':(32,4096,32,8,128,14336,128256,False,True,False,False),
 'llama3_8b_norope':(32,4096,32,8,128,14336,128256,False,False,False,False),
 'llama32_3b':(28,3072,24,8,128,8192,128256,True,True,False,False),
 'llama2_7b':(32,4096,32,32,128,11008,32000,False,False,False,False),
 'mistral_7b':(32,4096,32,8,128,14336,32000,False,False,False,False),
 'mistral_7b_v03':(32,4096,32,8,128,14336,32768,False,False,False,False),
 'qwen25_7b':(28,3584,28,4,128,18944,152064,False,False,True,False),
 'qwen3_4b':(36,2560,32,8,128,9728,151936,True,False,False,True),
 'qwen3_8b':(36,4096,32,8,128,12288,151936,False,False,False,True),
}
def model_bufs(name, ftype, ngl=None, new_order=True):
    nl,E,H,HKV,D,F,V,tied,rf,bias,qkn=CFG[name]
    n_gqa=H//HKV
    m=llama_mix(ftype,nl,n_gqa,tied)
    Ld=m['layers']; qd=H*D; kvd=HKV*D
    def layer(i, sz):
        s=sz(Ld['attn_q'][i],E,qd)+sz(Ld['attn_k'][i],E,kvd)+sz(Ld['attn_v'][i],E,kvd)+sz(Ld['attn_output'][i],qd,E)
        s+=sz(Ld['ffn_gate'][i],E,F)+sz(Ld['ffn_up'][i],E,F)+sz(Ld['ffn_down'][i],F,E)
        s+=2*sz('f32',E)
        if bias: s+=sz('f32',qd)+2*sz('f32',kvd)
        if qkn: s+=2*sz('f32',D)
        return s
    if ngl is None: ngl=nl+1
    # which layers on GPU
    if new_order: start=max(nl+1-ngl,0)
    else: start=max(nl-ngl,0)
    on_gpu=[i for i in range(nl+1) if i>=start and (i-start)<min(ngl,nl+1)]
    gpu=0; cpu_list=[]
    csz=lambda t,a,b=1: nb(t,a,b)
    for i in range(nl):
        if i in on_gpu: gpu+=layer(i,cuda_sz)
        else: cpu_list.append(layer(i,csz))
    out_t=m['output']
    if nl in on_gpu: gpu+=cuda_sz(out_t,E,V)+cuda_sz('f32',E)
    else: cpu_list.append(nb(out_t,E,V)+E*4)
    if rf and any(i in on_gpu for i in range(nl)): gpu+=cuda_sz('f32',D//2)
    if rf and any(i not in on_gpu for i in range(nl)): cpu_list.append(D//2*4)
    cpu=nb(m['token_embd'],E,V)+sum(cpu_list)
    return gpu/MiB, cpu/MiB, m
def kv_mib(name,n_ctx,n_layers_dev=None,tk='f16',tv='f16'):
    nl,E,H,HKV,D,F,V,*_=CFG[name]
    if n_layers_dev is None: n_layers_dev=nl
    return n_ctx*n_layers_dev*(nb(tk,HKV*D)+nb(tv,HKV*D))/MiB
if __name__=='__main__':
    g,c,_=model_bufs('llama3_8b','Q4_K_M'); print('L3 8B Q4_K_M', round(g,2), round(c,2), 'obs 4403.49 281.81')
    print('KV', kv_mib('llama3_8b',8192))
