# helper: tensor byte sizes per ggml type (block, bytes) from ggml.c type_traits / ggml-common.h
T = {'f32':(1,4),'f16':(1,2),'bf16':(1,2),'q4_0':(32,18),'q4_1':(32,20),'q5_0':(32,22),'q5_1':(32,24),'q8_0':(32,34),
     'q2_K':(256,84),'q3_K':(256,110),'q4_K':(256,144),'q5_K':(256,176),'q6_K':(256,210),'iq4_xs':(256,136),'iq4_nl':(32,18)}
MiB=1024*1024
def nb(t,ne0,ne1=1): b,s=T[t]; assert ne0%b==0; return ne0//b*s*ne1
def pad(x,a=128): return (x+a-1)//a*a
def cuda_sz(t,ne0,ne1=1):
    s=nb(t,ne0,ne1)
    if t not in('f32','f16','bf16') and ne0%512: s+=nb(t,512-ne0%512)
    return pad(s)
def use_more_bits(i,n): return i<n//8 or i>=7*n//8 or (i-n//8)%3==2

def llama_mix(ftype, n_layer, n_gqa, tied, arch='llama', old_qkv=False):
    """return dict category->(list of types per layer) following llama-quant.cpp rules (Llama-style, no imatrix, non-MoE)"""
    base={'F16':'f16','BF16':'bf16','Q8_0':'q8_0','Q4_0':'q4_0','Q4_1':'q4_1','Q5_0':'q5_0','Q5_1':'q5_1','Q2_K':'q2_K',
          'Q3_K_S':'q3_K','Q3_K_M':'q3_K','Q3_K_L':'q3_K','Q4_K_S':'q4_K','Q4_K_M':'q4_K','Q5_K_S':'q5_K','Q5_K_M':'q5_K','Q6_K':'q6_K','IQ4_XS':'iq4_xs'}[ftype]
    quant = base not in ('f16','bf16','f32')
    out={}
    # output / tied token_embd
    o = base
    if quant and o!='q8_0': o='q6_K'
    out['output']=o
    te = base
    if tied: te=o
    out['token_embd']=te
    L={k:[] for k in ('attn_q','attn_k','attn_v','attn_output','ffn_gate','ffn_up','ffn_down','attn_qkv')}
    for i in range(n_layer):
        # attn_v
        v=base
        if quant:
            if ftype=='Q2_K': v='q4_K' if n_gqa>=4 else 'q3_K'
            elif ftype=='Q3_K_M': v='q5_K' if i<2 else 'q4_K'
            elif ftype=='Q3_K_L': v='q5_K'
            elif ftype=='IQ4_XS' and n_gqa>=4: v='q5_K'
            elif ftype in('Q4_K_M','Q5_K_M') and use_more_bits(i,n_layer): v='q6_K'
            elif ftype=='Q4_K_S' and i<4: v='q5_K'
        L['attn_v'].append(v)
        # qkv (fused): old rule (<= 2025) vs new (treated as attn_v)
        if old_qkv:
            q=base
            if ftype in('Q3_K_M','Q3_K_L'): q='q4_K'
            elif ftype=='Q4_K_M': q='q5_K'
            elif ftype=='Q5_K_M': q='q6_K'
            L['attn_qkv'].append(q)
        else: L['attn_qkv'].append(v)
        L['attn_k'].append(base); L['attn_q'].append(base)
        # ffn_down
        d=base
        if quant:
            if ftype=='Q2_K': d='q3_K'
            elif ftype=='Q3_K_M': d='q5_K' if i<n_layer//16 else 'q4_K'   # non-Falcon
            elif ftype=='Q3_K_L': d='q5_K'
            elif ftype=='Q4_K_M': d='q6_K' if use_more_bits(i,n_layer) else base
            elif ftype=='IQ4_XS' and i<n_layer//8: d='q5_K'   # only without imatrix
            elif ftype=='Q5_K_M' and use_more_bits(i,n_layer): d='q6_K'
            elif ftype=='Q4_K_S' and i<n_layer//8: d='q5_K'
        L['ffn_down'].append(d)
        ao=base
        if quant:
            if ftype=='Q2_K': ao='q3_K'
            elif ftype=='Q3_K_M': ao='q4_K'
            elif ftype=='Q3_K_L': ao='q5_K'
        L['attn_output'].append(ao)
        L['ffn_gate'].append(base); L['ffn_up'].append(base)
    out['layers']=L
    return out
