#!/usr/bin/python3
"""Same CNN and GPT block at opset 14 (tril needs 14): LayerNormalization (opset 17) is decomposed, BN training has 5 outputs? (run after make_models.py)"""
import os, sys, torch
sys.argv = [sys.argv[0]]
from torch.onnx import TrainingMode
here = os.path.dirname(os.path.abspath(__file__))
exec(open(here + "/make_models.py").read().split("def export(")[0])  # reuse the module classes
for cls, args, name, inp, dyn in ((CNN, (torch.randn(2, 3, 32, 32),), "cnn_bn_train_op14", ["x"], {"x": {0: "batch"}}),
                                  (Block, (torch.randint(0, 100, (2, 8)),), "gpt_block_train_op14", ["ids"], {"ids": {0: "batch", 1: "seq"}})):
    m = cls(); m.train()
    torch.onnx.export(m, args, f"{out}/{name}.onnx", opset_version=14, training=TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=inp, output_names=["out"], dynamic_axes=dyn)
    print(name)
