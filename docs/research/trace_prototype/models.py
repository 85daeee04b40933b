"""Tiny test models written in plain torch (GPT-2-like LM, CNN with BatchNorm, ViT-like)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, h, heads, n_pos, pdrop, sdpa=False):
        super().__init__()
        self.sdpa, self.pdrop = sdpa, pdrop
        self.heads, self.hd = heads, h // heads
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.register_buffer("bias", torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool)).view(1, 1, n_pos, n_pos),
                             persistent=False)
        self.attn_dropout = nn.Dropout(pdrop)
        self.resid_dropout = nn.Dropout(pdrop)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, s, self.heads, self.hd).transpose(1, 2)
        v = v.view(b, s, self.heads, self.hd).transpose(1, 2)
        if self.sdpa:  # torch >= 2.0
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.pdrop if self.training else 0.0, is_causal=True)
            return self.resid_dropout(self.c_proj(o.transpose(1, 2).contiguous().view(b, s, h)))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        w = w.masked_fill(~self.bias[:, :, :s, :s], torch.finfo(w.dtype).min)
        w = F.softmax(w, dim=-1)
        w = self.attn_dropout(w)
        o = torch.matmul(w, v).transpose(1, 2).contiguous().view(b, s, h)
        return self.resid_dropout(self.c_proj(o))


class MLP(nn.Module):
    def __init__(self, h, pdrop):
        super().__init__()
        self.c_fc = nn.Linear(h, 4 * h)
        self.c_proj = nn.Linear(4 * h, h)
        self.dropout = nn.Dropout(pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, h, heads, n_pos, pdrop, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(h)
        self.attn = Attn(h, heads, n_pos, pdrop, sdpa)
        self.ln_2 = nn.LayerNorm(h)
        self.mlp = MLP(h, pdrop)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, h=32, heads=4, layers=2, n_pos=64, pdrop=0.1, tie=True, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(n_pos, h)
        self.drop = nn.Dropout(pdrop)
        self.h = nn.ModuleList([Block(h, heads, n_pos, pdrop, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, labels):
        b, s = input_ids.shape
        pos = torch.arange(0, s, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


class TinyCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, classes)
        self.drop = nn.Dropout(0.2)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(self.drop(torch.flatten(self.features(x), 1))), y)


class TinyViT(nn.Module):
    def __init__(self, img=16, patch=4, h=32, heads=4, layers=1, classes=10):
        super().__init__()
        n = (img // patch) ** 2
        self.patch = nn.Conv2d(3, h, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, h))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, h))
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict(dict(
                ln1=nn.LayerNorm(h), attn=nn.MultiheadAttention(h, heads, dropout=0.1, batch_first=True),
                ln2=nn.LayerNorm(h), fc1=nn.Linear(h, 4 * h), act=nn.GELU(), fc2=nn.Linear(4 * h, h))))
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, classes)

    def forward(self, x, y):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for b in self.blocks:
            hN = b["ln1"](x)
            x = x + b["attn"](hN, hN, hN, need_weights=False)[0]
            x = x + b["fc2"](b["act"](b["fc1"](b["ln2"](x))))
        return F.cross_entropy(self.head(self.norm(x)[:, 0]), y)
