from calc import *
from llama_calc import *
from pythia import pythia
CFG['qwen25_3b']=(36,2048,16,2,128,11008,151936,True,False,True,False)
rows=[]
def add(id,pred,obs): rows.append((id,pred,obs))
for f,(g,c) in {'F16':(5049.71,245.62),'Q2_K':(993.89,40.30),'Q3_K_M':(1354.83,52.77),'Q4_0':(1454.83,69.08),'Q4_K_M':(1632.95,69.08),'Q5_K_M':(1887.64,84.43),'Q6_K':(2073.58,100.74),'Q8_0':(2684.57,130.49)}.items():
    pg,pc=pythia(f); add('pythia '+f+' CUDA0/CPU',(pg,pc),(g,c))
kvp=2048*32*(nb('f16',2560)*2)/MiB; add('pythia KV',kvp,640.0)
g,c,_=model_bufs('llama3_8b','Q4_K_M'); add('R1-Distill-Llama8B Q4_K_M',(g,c),(4403.49,281.81)); add('  KV 8192',kv_mib('llama3_8b',8192),1024.0)
g,c,_=model_bufs('mistral_7b','Q4_K_M',ngl=20,new_order=False); gf,cf,_=model_bufs('mistral_7b','Q4_K_M')
add('Mistral7B Q4_K_M ngl20 (old order) CUDA0 / CPU span',(g,gf+cf),(2495.31,4165.37)); add('  KV gpu/cpu',(kv_mib('mistral_7b',768,20),kv_mib('mistral_7b',768,12)),(60.0,36.0))
g,c,_=model_bufs('qwen25_3b','Q8_0'); add('Qwen2.5-VL-3B-LM Q8_0',(g,c),(3127.61,315.30)); add('  KV 4096',kv_mib('qwen25_3b',4096),144.0)
g,c,_=model_bufs('qwen3_4b','Q4_K_M'); add('Qwen3-4B Q4_K_M',(g,c),(2375.91,304.28)); add('  KV 8192',kv_mib('qwen3_4b',8192),1152.0)
g,c,_=model_bufs('llama32_3b','Q4_K_M'); add('Llama-3.2-3B Q4_K_M',(g,c),(1918.36,308.24)); add('  KV 2048',kv_mib('llama32_3b',2048),224.0)
g,c,_=model_bufs('llama3_8b','Q3_K_L'); add('Llama-3.1-8B Q3_K_L CPU total',g+c,4114.27)
g,c,_=model_bufs('llama3_8b','Q4_0'); add('Llama-3.1-8B Q4_0 CPU total (vocab 128256; file has 128258)',g+c,4437.82); add('ollama llama3.1:8b Q4_0 CUDA0',g,4155.99)
add('KV Llama-3.1-8B 131072',kv_mib('llama3_8b',131072),16384.0)
add('KV Llama-3-8B q8_0 8192',kv_mib('llama3_8b',8192,tk='q8_0',tv='q8_0'),544.0)
add('KV Gemma4-12B global 8L x16384 q8_0 (Kdim=Vdim=512)',16384*8*nb('q8_0',512)*2/MiB,136.0)
add('KV Gemma4-12B SWA 40L x1536 q8_0 (2048 dims)',1536*40*nb('q8_0',2048)*2/MiB,255.0)
# compute buffer formulas
def fa_off(n_kv,n_ub,n_head,n_embd,c=4): return (n_kv*n_ub*n_head*4+n_kv*n_ub*4+c*n_ub*n_embd*4)/MiB
add('compute FA-off Llama8B ctx8192 ub512',fa_off(8192,512,32,4096),560.0)
add('compute FA-off CPU Llama8B ctx131072',fa_off(131072,512,32,4096),8480.01)
add('compute FA-off pythia (c=6)',fa_off(2048,512,32,2560,6),162.0)
add('compute FA-off Phi-3 ub256 (c=6)',fa_off(4096,256,32,3072,6),150.0)
add('compute FA-on logits Qwen2.5-3B ub4096 (V*ub*4 + 3*E*ub*4)',(151936*4096*4+3*2048*4096*4)/MiB,2470.16)
add('compute partial Mistral (out.w Q6_K + logits + E*ub*4)',(nb('q6_K',4096,32000)+32000*256*4+256*4096*4)/MiB,137.79)
def host(n_ub,n_embd,n_kv): return (n_ub*n_embd*4+n_kv*n_ub*4)/MiB
for id,a,o in [('host Llama8B',host(512,4096,8192),24.01),('host pythia',host(512,2560,2048),9.01),('host Phi3',host(256,3072,4096),7.0),('host Qwen2.5-3B ub4096',host(4096,2048,4096),96.17),('host Mistral ngl20',host(256,4096,768),4.76)]:
    add('compute '+id,a,o)
def f(x): return '/'.join(f'{v:.2f}' for v in x) if isinstance(x,tuple) else f'{x:.2f}'
for id,p,o in rows:
    err = tuple(a-b for a,b in zip(p,o)) if isinstance(p,tuple) else p-o
    print(f'| {id} | {f(p)} | {f(o)} | {f(err)} |')
