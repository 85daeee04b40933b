#!/usr/bin/python3
"""Writes tiny .onnx test models with Debian's torch 1.13 (python3-torch).

torch.onnx.export needs no `onnx` Python package: the protobuf is serialized by
torch._C (libtorch links libonnx/libprotobuf itself). Run from this folder:
    /usr/bin/python3 make_models.py
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.onnx import TrainingMode

assert "onnx" not in sys.modules
out = os.path.dirname(os.path.abspath(__file__)) + "/models"
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(self.act(self.fc1(x))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.gap(x), 1))


class Block(nn.Module):
    """A GPT-style pre-LN block written out by hand (no fused fast path)."""

    def __init__(self, vocab=100, d=32, heads=4, ff=64):
        super().__init__()
        self.h, self.d = heads, d
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.attn_drop = nn.Dropout(0.1)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        b, s = ids.shape
        x = self.emb(ids)
        q, k, v = self.qkv(self.ln1(x)).split(self.d, dim=2)
        q = q.view(b, s, self.h, -1).transpose(1, 2)
        k = k.view(b, s, self.h, -1).transpose(1, 2)
        v = v.view(b, s, self.h, -1).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d // self.h))
        mask = torch.ones(s, s, dtype=torch.bool, device=ids.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, s, self.d)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(self.lnf(x))


def export(model, args, name, input_names, dyn, training=TrainingMode.EVAL):
    path = f"{out}/{name}.onnx"
    if training == TrainingMode.TRAINING:
        model.train()
    else:
        model.eval()
    torch.onnx.export(model, args, path, opset_version=17, training=training,
                      do_constant_folding=(training == TrainingMode.EVAL),
                      input_names=input_names, output_names=["out"], dynamic_axes=dyn)
    print(path, os.path.getsize(path))


x = torch.randn(2, 16)
export(MLP(), (x,), "mlp_eval", ["x"], {"x": {0: "batch"}, "out": {0: "batch"}})
export(MLP(), (x,), "mlp_train", ["x"], {"x": {0: "batch"}, "out": {0: "batch"}}, TrainingMode.TRAINING)

img = torch.randn(2, 3, 32, 32)
export(CNN(), (img,), "cnn_bn_eval", ["x"], {"x": {0: "batch"}, "out": {0: "batch"}})
export(CNN(), (img,), "cnn_bn_train", ["x"], {"x": {0: "batch"}, "out": {0: "batch"}}, TrainingMode.TRAINING)
export(CNN(), (img,), "cnn_bn_preserve_eval", ["x"], {"x": {0: "batch"}, "out": {0: "batch"}},
       TrainingMode.PRESERVE)

ids = torch.randint(0, 100, (2, 8))
dyn = {"ids": {0: "batch", 1: "seq"}, "out": {0: "batch", 1: "seq"}}
export(Block(), (ids,), "gpt_block_eval", ["ids"], dyn)
export(Block(), (ids,), "gpt_block_train", ["ids"], dyn, TrainingMode.TRAINING)
