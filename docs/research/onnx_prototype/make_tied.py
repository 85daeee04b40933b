#!/usr/bin/python3
"""Tied embedding/lm_head: how does torch 1.13's exporter show a shared parameter?"""
import os, torch, torch.nn as nn
from torch.onnx import TrainingMode
out = os.path.dirname(os.path.abspath(__file__)) + "/models"
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight
    def forward(self, ids):
        return self.head(self.ln(self.emb(ids)))
m = Tied()
print("torch parameters():", sum(p.numel() for p in m.parameters()))
for mode, name in ((TrainingMode.TRAINING, "tied_train"), (TrainingMode.EVAL, "tied_eval")):
    m.train(mode == TrainingMode.TRAINING)
    torch.onnx.export(m, (torch.randint(0, 50, (2, 5)),), f"{out}/{name}.onnx", opset_version=17, training=mode,
                      do_constant_folding=(mode == TrainingMode.EVAL), input_names=["ids"], output_names=["logits"],
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}})
