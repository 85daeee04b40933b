#!/usr/bin/python3
"""Meta trace of gpumem's own oracle replicas (oracle/activations_oracle.py, imported read-only)
vs the oracle's CPU measurement."""
import os, sys, warnings, importlib.util
warnings.filterwarnings("ignore")
spec = importlib.util.spec_from_file_location("ao", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "oracle", "activations_oracle.py"))
ao = importlib.util.module_from_spec(spec); spec.loader.exec_module(ao)
import torch; torch.set_num_threads(1)
import gtrace
cases = [("gpt2", ao.gpt2_config(64, 2, 1000), 2, 32), ("gpt2", ao.gpt2_config(64, 2, 1000, dropout_impl="cpu"), 2, 32),
         ("gpt2", ao.gpt2_config(64, 2, 1000, loss_impl="pad"), 2, 32),
         ("llama", ao.llama_config(64, 2, 1000, 2, 172), 2, 32),
         ("llama", ao.llama_config(64, 2, 1000, 2, 172, attention_dropout=0.1), 4, 32)]
ok = True
for fam, cfg, b, s in cases:
    res = ao.measure(fam, cfg, b, s)
    cls = ao.GPT2LMHeadModel if fam == "gpt2" else ao.LlamaForCausalLM
    ids = torch.randint(0, cfg["vocab"], (b, s))
    tr = gtrace.trace(lambda: cls(cfg), (ids, ids), cuda_semantics=False)
    mb, n = gtrace.saved_bytes(tr)
    # the oracle counts input_ids (saved by the embedding) and excludes params/buffers, as saved_bytes() does
    same = mb == res["saved_bytes"]
    ok &= same
    print("%-5s b=%d s=%-3d dropout=%-6s loss=%-5s oracle(cpu) %8d B   meta trace %8d B   %s" %
          (fam, b, s, cfg["dropout_impl"], cfg["loss_impl"], res["saved_bytes"], mb, "EQUAL" if same else "DIFF"))
print("ALL EQUAL" if ok else "MISMATCH")
