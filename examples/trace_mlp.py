"""A model to try `gpumem trace` on: a small residual MLP classifier.

    gpumem trace examples/trace_mlp.py:make_model --input b,784 --loss cross-entropy -o mlp.json
    gpumem estimate mlp.json --batch 256 --precision bf16-mixed

(GPUMEM_PYTHON names a python with torch >= 1.13 if python3 has none.)
"""
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.fc2(self.act(self.fc1(self.norm(x)))))


class MLP(nn.Module):
    def __init__(self, inputs=784, width=512, depth=6, classes=10):
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_model():
    return MLP()
