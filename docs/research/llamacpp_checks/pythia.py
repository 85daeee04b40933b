from calc import *
E,F,V,NL=2560,10240,50304,32
def pythia(ftype):
    m=llama_mix(ftype,NL,1,False,old_qkv=True)
    gpu=0; 
    for i in range(NL):
        Ld=m['layers']
        gpu+=cuda_sz(Ld['attn_qkv'][i],E,3*E)+cuda_sz(Ld['attn_output'][i],E,E)+cuda_sz(Ld['ffn_up'][i],E,F)+cuda_sz(Ld['ffn_down'][i],F,E)
        gpu+=pad(3*E*4)+pad(E*4)+pad(F*4)+pad(E*4)+4*pad(E*4)   # biases + norms
    gpu+=cuda_sz(m['output'],E,V)+2*pad(E*4)
    cpu=nb(m['token_embd'],E,V)
    return gpu/MiB, cpu/MiB
obs={'F16':(5049.71,245.62),'Q2_K':(993.89,40.30),'Q3_K_M':(1354.83,52.77),'Q4_0':(1454.83,69.08),'Q4_K_M':(1632.95,69.08),'Q5_K_M':(1887.64,84.43)}
for f,(g,c) in obs.items():
    pg,pc=pythia(f); print(f"{f:7s} pred GPU {pg:9.2f} obs {g:9.2f} err {pg-g:+.2f} | CPU pred {pc:7.2f} obs {c:7.2f}")
