#!/usr/bin/python3
"""CPU oracle for gpumem's activation-memory model.

Measures, for small GPT-2-style and LLaMA-style causal LMs written in plain
torch, the bytes of every tensor autograd keeps for backward at the end of one
training-mode forward pass up to the loss ("saved activations"), deduplicated
by storage and excluding parameters (and module buffers, reported separately).

Two independent measurements are taken and cross-checked:
  a. torch.autograd.graph.saved_tensors_hooks: every packed tensor, keyed by
     storage data_ptr, bytes = storage nbytes;
  b. a walk of the autograd graph from loss.grad_fn over next_functions,
     reading each node's `_saved_*` tensor attributes.  Each storage is
     attributed to the first node (in forward order) that saves it.

Replicated HuggingFace code (read from github.com/huggingface/transformers):
  * GPT-2: src/transformers/models/gpt2/modeling_gpt2.py @ c44b2d9976e8
    (v4.42-4.44 era: GPT2Attention eager `_attn`, GPT2MLP, GPT2Block,
    GPT2Model.forward, GPT2LMHeadModel.forward incl. its inline loss, which
    does NOT upcast logits);
    src/transformers/pytorch_utils.py Conv1D.forward
    (`torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)`);
    src/transformers/activations.py NewGELUActivation (gelu_new).
  * LLaMA: src/transformers/models/llama/modeling_llama.py @ 5dd4a6354885
    (v4.48-4.49 era: LlamaRMSNorm, LlamaRotaryEmbedding computed once per
    forward in LlamaModel and shared by all layers, apply_rotary_pos_emb /
    rotate_half, repeat_kv, eager_attention_forward with `* scaling` and a
    4-D additive causal mask, LlamaMLP, LlamaDecoderLayer, LlamaModel,
    LlamaForCausalLM with the `logits.float()` upcast).
    Loss: default `loss_impl="shift"` is the inline HF loss of LLaMA 4.40-4.45
    / GPT-2 (`logits = logits.float()`; `shift_logits = logits[..., :-1, :]
    .contiguous()`; `shift_labels = labels[..., 1:].contiguous()`;
    CrossEntropyLoss()), and `loss_impl="pad"` is
    src/transformers/loss/loss_utils.py ForCausalLMLoss @ 0114da07ec0e
    (`logits.float()`; labels padded with -100 and shifted, so the CE runs over
    all b*s rows; reduction mean).
Dropout: `dropout_impl="native"` (default) calls torch.native_dropout, which is
exactly what nn.Dropout/F.dropout dispatch to on CUDA for 0<p<1 in training
(NativeDropoutBackward0 saves only a bool mask).  `dropout_impl="cpu"` calls
F.dropout as-is on CPU, whose composite implementation saves a float noise
tensor (MulBackward0) instead.  With p == 0 both are the identity.

Usage:
  /usr/bin/python3 oracle/activations_oracle.py --out tests/fixtures/oracle/activations.json
  /usr/bin/python3 oracle/activations_oracle.py --breakdown   # print per-op tables
"""

import argparse
import itertools
import json
import math
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")
torch.set_num_threads(2)

SEED = 1234


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def _storage(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage()


def storage_key(t):
    return _storage(t).data_ptr()


def storage_nbytes(t):
    return int(_storage(t).nbytes())


def dropout(x, p, training, impl):
    """nn.Dropout as it runs on CUDA ("native") or as it runs on CPU ("cpu")."""
    if impl == "native":
        if training and 0.0 < p < 1.0 and x.numel() > 0:
            return torch.native_dropout(x, p, True)[0]
        if p == 1.0 and training:
            return x * 0.0
        return x  # aten::dropout returns its input for p == 0 or eval
    return F.dropout(x, p=p, training=training)


# --------------------------------------------------------------------------------------
# GPT-2 (HF modeling_gpt2.py, eager attention)
# --------------------------------------------------------------------------------------

class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D"""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x


class NewGELUActivation(nn.Module):
    """transformers.activations.NewGELUActivation ("gelu_new")"""

    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        max_positions = cfg["n_positions"]
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
                1, 1, max_positions, max_positions
            ),
            persistent=False,
        )
        self.register_buffer("masked_bias", torch.tensor(-1e4), persistent=False)
        self.embed_dim = cfg["hidden"]
        self.num_heads = cfg["heads"]
        self.head_dim = self.embed_dim // self.num_heads
        self.split_size = self.embed_dim
        self.scale_attn_weights = True
        self.scale_attn_by_inverse_layer_idx = False
        self.layer_idx = layer_idx
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.attn_pdrop = cfg["attn_pdrop"]
        self.resid_pdrop = cfg["resid_pdrop"]
        self.dropout_impl = cfg["dropout_impl"]

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        if self.scale_attn_weights:
            attn_weights = attn_weights / torch.full(
                [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device
            )
        if self.scale_attn_by_inverse_layer_idx:
            attn_weights = attn_weights / float(self.layer_idx + 1)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = dropout(attn_weights, self.attn_pdrop, self.training, self.dropout_impl)  # attn_dropout
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights

    def _split_heads(self, tensor, num_heads, attn_head_size):
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        tensor = tensor.view(new_shape)
        return tensor.permute(0, 2, 1, 3)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def forward(self, hidden_states):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)
        attn_output, attn_weights = self._attn(query, key, value)
        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        attn_output = self.c_proj(attn_output)
        attn_output = dropout(attn_output, self.resid_pdrop, self.training, self.dropout_impl)  # resid_dropout
        return attn_output


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, cfg):
        super().__init__()
        embed_dim = cfg["hidden"]
        self.c_fc = Conv1D(intermediate_size, embed_dim)
        self.c_proj = Conv1D(embed_dim, intermediate_size)
        self.act = NewGELUActivation()
        self.resid_pdrop = cfg["resid_pdrop"]
        self.dropout_impl = cfg["dropout_impl"]

    def forward(self, hidden_states):
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = dropout(hidden_states, self.resid_pdrop, self.training, self.dropout_impl)
        return hidden_states


class GPT2Block(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        hidden_size = cfg["hidden"]
        inner_dim = cfg["intermediate"]
        self.ln_1 = nn.LayerNorm(hidden_size, eps=cfg["eps"])
        self.attn = GPT2Attention(cfg, layer_idx=layer_idx)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=cfg["eps"])
        self.mlp = GPT2MLP(inner_dim, cfg)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output = self.attn(hidden_states)
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = residual + feed_forward_hidden_states
        return hidden_states


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h = cfg["hidden"]
        self.wte = nn.Embedding(cfg["vocab"], h)
        self.wpe = nn.Embedding(cfg["n_positions"], h)
        self.h = nn.ModuleList([GPT2Block(cfg, layer_idx=i) for i in range(cfg["layers"])])
        self.ln_f = nn.LayerNorm(h, eps=cfg["eps"])
        self.lm_head = nn.Linear(h, cfg["vocab"], bias=False)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, input_ids, labels):
        lm_logits = self.logits(input_ids)
        labels = labels.to(lm_logits.device)
        return causal_lm_loss(lm_logits, labels, self.cfg["vocab"], self.cfg["loss_impl"], upcast=False)

    def logits(self, input_ids):
        """GPT2LMHeadModel.forward up to lm_logits (the loss is forward's)."""
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        past_length = 0
        position_ids = torch.arange(past_length, input_shape[-1] + past_length, dtype=torch.long,
                                    device=input_ids.device)
        position_ids = position_ids.unsqueeze(0)
        inputs_embeds = self.wte(input_ids)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds
        hidden_states = dropout(hidden_states, self.cfg["embd_pdrop"], self.training, self.cfg["dropout_impl"])
        output_shape = (-1,) + input_shape[1:] + (hidden_states.size(-1),)
        for block in self.h:
            hidden_states = block(hidden_states)
        hidden_states = self.ln_f(hidden_states)
        hidden_states = hidden_states.view(output_shape)
        # GPT2LMHeadModel.forward
        return self.lm_head(hidden_states)


# --------------------------------------------------------------------------------------
# LLaMA (HF modeling_llama.py, eager attention)
# --------------------------------------------------------------------------------------

class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dim = cfg["hidden"] // cfg["heads"]
        base = cfg["rope_theta"]
        # ROPE_INIT_FUNCTIONS["default"]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.attention_scaling = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos()
        sin = emb.sin()
        cos = cos * self.attention_scaling
        sin = sin * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout_p=0.0):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = dropout(attn_weights, dropout_p, module.training, module.dropout_impl)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights


class LlamaAttention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = cfg["hidden"] // cfg["heads"]
        self.num_key_value_groups = cfg["heads"] // cfg["kv_heads"]
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = cfg["attention_dropout"]
        self.dropout_impl = cfg["dropout_impl"]
        h = cfg["hidden"]
        bias = cfg["attention_bias"]
        self.q_proj = nn.Linear(h, cfg["heads"] * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, cfg["kv_heads"] * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, cfg["kv_heads"] * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg["heads"] * self.head_dim, h, bias=bias)

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output, attn_weights = eager_attention_forward(
            self, query_states, key_states, value_states, attention_mask,
            dropout_p=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg["hidden"], cfg["intermediate"]
        self.gate_proj = nn.Linear(h, i, bias=cfg["mlp_bias"])
        self.up_proj = nn.Linear(h, i, bias=cfg["mlp_bias"])
        self.down_proj = nn.Linear(i, h, bias=cfg["mlp_bias"])
        self.act_fn = nn.SiLU()  # ACT2FN["silu"] -> nn.functional.silu

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg["hidden"], eps=cfg["eps"])
        self.post_attention_layernorm = LlamaRMSNorm(cfg["hidden"], eps=cfg["eps"])

    def forward(self, hidden_states, attention_mask, position_embeddings):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["hidden"], None)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(cfg["layers"])])
        self.norm = LlamaRMSNorm(cfg["hidden"], eps=cfg["eps"])
        self.rotary_emb = LlamaRotaryEmbedding(cfg)
        self.lm_head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.embed_tokens.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    @staticmethod
    def _causal_mask(inputs_embeds, cache_position):
        # LlamaModel._update_causal_mask (eager, no attention_mask, no cache) ->
        # _prepare_4d_causal_attention_mask_with_cache_position
        dtype, device = inputs_embeds.dtype, inputs_embeds.device
        sequence_length = inputs_embeds.shape[1]
        target_length = 0 + sequence_length + 1
        min_dtype = torch.finfo(dtype).min
        causal_mask = torch.full((sequence_length, target_length), fill_value=min_dtype, dtype=dtype, device=device)
        if sequence_length != 1:
            causal_mask = torch.triu(causal_mask, diagonal=1)
        causal_mask *= torch.arange(target_length, device=device) > cache_position.reshape(-1, 1)
        causal_mask = causal_mask[None, None, :, :].expand(inputs_embeds.shape[0], 1, -1, -1)
        return causal_mask

    def forward(self, input_ids, labels):
        return causal_lm_loss(self.logits(input_ids), labels, self.cfg["vocab"], self.cfg["loss_impl"], upcast=True)

    def logits(self, input_ids):
        """LlamaModel.forward and LlamaForCausalLM.forward up to the logits (the loss is forward's)."""
        # LlamaModel.forward
        inputs_embeds = self.embed_tokens(input_ids)
        cache_position = torch.arange(0, inputs_embeds.shape[1], device=inputs_embeds.device)
        position_ids = cache_position.unsqueeze(0)
        causal_mask = self._causal_mask(inputs_embeds, cache_position)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, causal_mask, position_embeddings)
        hidden_states = self.norm(hidden_states)
        # LlamaForCausalLM.forward (logits_to_keep=0 -> slice(0, None))
        return self.lm_head(hidden_states[:, slice(0, None), :])


def causal_lm_loss(logits, labels, vocab_size, loss_impl, upcast):
    if loss_impl == "shift":
        # GPT2LMHeadModel.forward / LlamaForCausalLM.forward (4.40-4.45) inline loss
        if upcast:
            logits = logits.float()
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss_fct = nn.CrossEntropyLoss()
        shift_logits = shift_logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1)
        shift_labels = shift_labels.to(shift_logits.device)
        return loss_fct(shift_logits, shift_labels)
    if loss_impl == "pad":
        # transformers/loss/loss_utils.py ForCausalLMLoss (num_items_in_batch=None)
        ignore_index = -100
        logits = logits.float()
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1)
        shift_labels = shift_labels.to(logits.device)
        return nn.functional.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")
    raise ValueError(loss_impl)


# --------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------

def gpt2_config(hidden, layers, vocab, heads=4, pdrop=0.1, dropout_impl="native", loss_impl="shift"):
    return {
        "hidden": hidden, "heads": heads, "kv_heads": heads, "head_dim": hidden // heads,
        "layers": layers, "intermediate": 4 * hidden, "vocab": vocab, "n_positions": 1024,
        "resid_pdrop": pdrop, "embd_pdrop": pdrop, "attn_pdrop": pdrop,
        "activation": "gelu_new", "eps": 1e-5, "tie_word_embeddings": True,
        "scale_attn_weights": True, "attn_implementation": "eager",
        "dropout_impl": dropout_impl, "loss_impl": loss_impl,
    }


def llama_config(hidden, layers, vocab, kv_heads, intermediate, heads=4, dropout_impl="native", loss_impl="shift",
                 attention_dropout=0.0):
    return {
        "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": hidden // heads,
        "layers": layers, "intermediate": intermediate, "vocab": vocab, "max_position_embeddings": 2048,
        "attention_dropout": attention_dropout, "attention_bias": False, "mlp_bias": False,
        "activation": "silu", "eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "attn_implementation": "eager", "dropout_impl": dropout_impl, "loss_impl": loss_impl,
    }


def build_cases():
    cases = []
    # GPT-2 grid
    for (h, L, V) in [(64, 2, 1000), (128, 4, 5000), (64, 4, 5000), (128, 2, 1000)]:
        for (b, s) in [(1, 32), (2, 128), (4, 32)]:
            cases.append(("gpt2", gpt2_config(h, L, V), b, s))
    cases.append(("gpt2", gpt2_config(64, 2, 1000), 4, 128))
    # dropout disabled
    cases.append(("gpt2", gpt2_config(64, 2, 1000, pdrop=0.0), 2, 32))
    cases.append(("gpt2", gpt2_config(128, 4, 5000, pdrop=0.0), 2, 128))
    # CPU F.dropout (float noise saved instead of bool mask)
    cases.append(("gpt2", gpt2_config(64, 2, 1000, dropout_impl="cpu"), 2, 32))
    cases.append(("gpt2", gpt2_config(64, 2, 1000, loss_impl="pad"), 2, 32))
    # LLaMA grid
    for (h, i, L, V, kv) in [(64, 172, 2, 1000, 4), (64, 172, 2, 1000, 2), (128, 344, 4, 5000, 4),
                              (128, 344, 4, 5000, 2), (64, 344, 4, 5000, 2), (128, 172, 2, 1000, 4)]:
        for (b, s) in [(1, 32), (2, 128), (4, 32)]:
            cases.append(("llama", llama_config(h, L, V, kv, i), b, s))
    cases.append(("llama", llama_config(64, 2, 1000, 2, 172, loss_impl="pad"), 2, 32))
    cases.append(("llama", llama_config(64, 2, 1000, 4, 172, loss_impl="pad"), 4, 128))
    cases.append(("llama", llama_config(64, 2, 1000, 2, 172, loss_impl="pad"), 1, 32))
    cases.append(("llama", llama_config(64, 2, 1000, 2, 172, attention_dropout=0.1), 2, 32))
    cases.append(("llama", llama_config(64, 2, 1000, 2, 172, attention_dropout=0.1, dropout_impl="cpu"), 2, 32))
    return cases


# --------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------

def _node_saved_tensors(node, state):
    """(attr_name, tensor, pack_seq) for every tensor in node._saved_* attributes."""
    out = []
    for attr in sorted(dir(node)):
        if not attr.startswith("_saved_"):
            continue
        state["last_unpacked"] = []
        try:
            val = getattr(node, attr)
        except Exception:  # noqa: BLE001 - e.g. already-freed buffers
            continue
        seqs = state["last_unpacked"]
        vals = val if isinstance(val, (tuple, list)) else [val]
        tensors = [v for v in vals if isinstance(v, torch.Tensor)]
        if not tensors:
            continue
        if len(seqs) != len(tensors):
            seqs = [None] * len(tensors)
        for t, sq in zip(tensors, seqs):
            out.append((attr[len("_saved_"):], t, sq))
    return out


def measure(family, cfg, b, s, detail=False):
    torch.manual_seed(SEED)
    model = (GPT2LMHeadModel if family == "gpt2" else LlamaForCausalLM)(cfg)
    model.train()
    input_ids = torch.randint(0, cfg["vocab"], (b, s), dtype=torch.long)
    labels = input_ids  # HF convention: labels=input_ids, shift happens inside the model

    param_ptrs = {storage_key(p) for p in model.parameters()}
    buffer_ptrs = {storage_key(bf) for bf in model.buffers()}
    input_ptrs = {storage_key(input_ids)}

    # module-path tracking, to annotate where a tensor got packed
    names = {m: n for n, m in model.named_modules()}
    stack = []
    hooks = []
    for m in model.modules():
        hooks.append(m.register_forward_pre_hook(lambda mod, inp: stack.append(names[mod])))
        hooks.append(m.register_forward_hook(lambda mod, inp, out: (stack.pop(), None)[1]))

    state = {"packed": [], "last_unpacked": []}

    def pack(t):
        state["packed"].append((t, stack[-1] if stack else ""))
        return len(state["packed"]) - 1

    def unpack(i):
        state["last_unpacked"].append(i)
        return state["packed"][i][0]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(input_ids, labels)
    for hk in hooks:
        hk.remove()

    # ---- (a) hook-based total
    seen = {}
    for i, (t, mod) in enumerate(state["packed"]):
        k = storage_key(t)
        if k not in seen:
            seen[k] = (i, storage_nbytes(t), mod)
    saved_bytes = sum(nb for k, (_, nb, _) in seen.items() if k not in param_ptrs and k not in buffer_ptrs)
    saved_param_bytes = sum(nb for k, (_, nb, _) in seen.items() if k in param_ptrs)
    saved_buffer_bytes = sum(nb for k, (_, nb, _) in seen.items() if k in buffer_ptrs and k not in param_ptrs)
    saved_input_bytes = sum(nb for k, (_, nb, _) in seen.items() if k in input_ptrs)

    # ---- (b) graph walk
    nodes, stack_n, visited = [], [loss.grad_fn], set()
    while stack_n:
        n = stack_n.pop()
        if n is None or id(n) in visited:
            continue
        visited.add(id(n))
        nodes.append(n)
        for nxt, _ in n.next_functions:
            stack_n.append(nxt)
    node_entries = []
    for n in nodes:
        ents = _node_saved_tensors(n, state)
        order = min([sq for _, _, sq in ents if sq is not None], default=10 ** 9)
        node_entries.append((order, type(n).__name__, n, ents))
    node_entries.sort(key=lambda x: (x[0], x[1]))

    attributed = set()
    savers = {}  # storage -> set of (node name, attr)
    by_node = {}
    order_names = []
    rows = []
    ptr_label = {}
    for order, name, n, ents in node_entries:
        if not ents:
            continue
        if name not in by_node:
            by_node[name] = {"node": name, "bytes": 0, "count": 0, "saved_tensors": 0}
            order_names.append(name)
        by_node[name]["count"] += 1
        for attr, t, sq in ents:
            by_node[name]["saved_tensors"] += 1
            k = storage_key(t)
            savers.setdefault(k, set()).add((name, attr))
            if k not in ptr_label:
                ptr_label[k] = len(ptr_label)
            kind = "param" if k in param_ptrs else ("buffer" if k in buffer_ptrs else
                                                    ("input" if k in input_ptrs else "act"))
            new = k not in attributed
            nb = storage_nbytes(t)
            if new:
                attributed.add(k)
                if kind not in ("param", "buffer"):
                    by_node[name]["bytes"] += nb
            if detail:
                rows.append({
                    "node": name, "attr": attr, "module": state["packed"][sq][1] if sq is not None else "?",
                    "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                    "storage": ptr_label[k], "storage_bytes": nb, "kind": kind, "new": new,
                })
    walk_bytes = sum(v["bytes"] for v in by_node.values())
    storage_nbytes_by_key = {k: nb for k, (_, nb, _) in seen.items()}
    hook_keys = set(seen)
    assert attributed == hook_keys, (len(attributed), len(hook_keys))
    assert walk_bytes == saved_bytes, (walk_bytes, saved_bytes)

    # torch 1.13's MeanBackward1 keeps its whole input (derivatives.yaml used self.sizes() via _safe_size);
    # torch >= 2.0 keeps only sizes/numel.  Storages kept *only* by MeanBackward1.self are a 1.13 artifact.
    mean_only = sum(storage_nbytes_by_key[k] for k, sv in savers.items()
                    if sv == {("MeanBackward1", "self")} and k not in param_ptrs and k not in buffer_ptrs)

    res = {
        "family": family,
        "saved_bytes_modern_torch": saved_bytes - mean_only, "config": cfg, "batch": b, "seq": s, "dtype": "float32",
        "saved_bytes": saved_bytes, "saved_param_bytes": saved_param_bytes,
        "saved_buffer_bytes": saved_buffer_bytes, "saved_input_ids_bytes": saved_input_bytes,
        "by_node": [by_node[nm] for nm in order_names],
    }
    if detail:
        res["rows"] = rows
    return res


# --------------------------------------------------------------------------------------
# closed-form formula
# --------------------------------------------------------------------------------------

def formula_bytes(case, mean_saves_self=True):
    """Closed form of saved_bytes (fp32 model, bytes).  See oracle/README.md.

    mean_saves_self=True reproduces torch 1.13 (MeanBackward1 keeps its input);
    False gives the torch >= 2.0 number (`saved_bytes_modern_torch`)."""
    c = case["config"]
    b, s = case["batch"], case["seq"]
    h, a, L, V = c["hidden"], c["heads"], c["layers"], c["vocab"]
    d = h // a
    F32, I64, BOOL = 4, 8, 1
    native = c["dropout_impl"] == "native"
    # loss: log_softmax output (shared with NLL self) + int64 targets + 0-dim total_weight.
    # labels[..., 1:] of a [1, n] tensor is already contiguous, so for b == 1 `.contiguous()` is a no-op and
    # the NLL target shares storage with its source (input_ids for "shift" -> already counted; the
    # [1, s+1] padded labels for "pad").
    if c["loss_impl"] == "shift":
        rows = b * (s - 1)
        target = rows * I64 if b > 1 else 0
    else:
        rows = b * s
        target = rows * I64 if b > 1 else (s + 1) * I64
    loss = rows * V * F32 + target + F32
    if case["family"] == "gpt2":
        i = c["intermediate"]
        p_r, p_e, p_a = c["resid_pdrop"], c["embd_pdrop"], c["attn_pdrop"]

        def drop(n, p):  # bytes kept by one dropout over n elements
            if p == 0.0:
                return 0
            return n * (BOOL if native else F32)

        bsh = b * s * h
        layer = (
            2 * (bsh + 2 * b * s) * F32            # ln_1, ln_2: input + mean + rstd
            + bsh * F32                            # c_attn addmm mat1 (= ln_1 output)
            + 2 * b * a * s * d * F32              # matmul(q,k^T): contiguous copies of q and k^T
            + F32                                  # div by torch.full([]) scalar
            + b * a * s * s * F32                  # softmax result
            + drop(b * a * s * s, p_a)             # attn dropout mask
            + (b * a * s * s * F32 if p_a > 0 else 0)  # attn_weights after dropout (bmm input)
            + b * a * s * d * F32                  # matmul(attn, v): copy of v
            + bsh * F32                            # c_proj mat1 (merged heads)
            + drop(bsh, p_r)                       # resid dropout (attn)
            + bsh * F32                            # c_fc mat1 (= ln_2 output)
            + 4 * b * s * i * F32                  # gelu_new: x, tanh, 0.5*x, 1+tanh
            + 3 * 8                                # gelu_new: three python-float wrapped scalars (f64)
            + b * s * i * F32                      # mlp c_proj mat1 (gelu output)
            + drop(bsh, p_r)                       # mlp dropout
        )
        emb = b * s * I64 + s * I64 + drop(bsh, p_e)  # wte indices, wpe position_ids, embd dropout
        final = (bsh + 2 * b * s) * F32 + bsh * F32   # ln_f (input+mean+rstd), lm_head mm input (ln_f out)
        return emb + L * layer + final + loss
    # llama (kv_heads does not appear: every saved attention tensor is post-repeat_kv)
    i = c["intermediate"]
    p_a = c["attention_dropout"]
    native = c["dropout_impl"] == "native"
    bsh = b * s * h
    # LlamaRMSNorm: pow saves x; [torch 1.13 only] mean saves x^2; rsqrt result [b,s,1]; x*rsqrt saved by weight-mul
    rms = 2 * bsh * F32 + b * s * F32 + (bsh * F32 if mean_saves_self else 0)
    layer = (
        2 * rms
        + bsh * F32                                # q/k/v mm input (input_layernorm output, shared)
        + 3 * b * a * s * d * F32                  # bmm copies: q, k^T (post repeat_kv), v (post repeat_kv)
        + 8                                        # `* scaling` python-float wrapped scalar (f64)
        + b * a * s * s * F32                      # softmax result (fp32 softmax, .to() no-op)
        + (b * a * s * s * ((BOOL if native else F32) + F32) if p_a > 0 else 0)  # mask + dropout output
        + bsh * F32                                # o_proj mm input
        + bsh * F32                                # gate/up mm input (post_attention_layernorm output)
        + 4 * b * s * i * F32                      # silu input, silu out, up out, down_proj input
    )
    emb = b * s * I64                              # embed_tokens indices (input_ids)
    rope = 2 * s * d * F32                         # cos, sin [1,s,d]: computed once, shared by all layers
    final = rms + bsh * F32                        # final norm + lm_head mm input
    return emb + rope + L * layer + final + loss


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

def sym_shape(shape, dims):
    """Express each dim as a product of symbols (best effort, for human-readable tables)."""
    syms = dict(dims)
    table = {}
    items = sorted(syms.items())
    for r in (1, 2, 3):
        for combo in itertools.combinations_with_replacement(items, r):
            v = 1
            for _, x in combo:
                v *= x
            nm = "*".join(k for k, _ in combo)
            table.setdefault(v, nm)
    return "[" + ", ".join(table.get(x, str(x)) if x != 1 else "1" for x in shape) + "]"


def print_breakdown(res, dims):
    print(f"== {res['family']} b={res['batch']} s={res['seq']} saved_bytes={res['saved_bytes']}")
    for r in res["rows"]:
        print(f"  {r['node']:<22} {r['attr']:<14} {r['module']:<34} {sym_shape(r['shape'], dims):<18} "
              f"{r['dtype']:<8} st#{r['storage']:<4} {r['storage_bytes']:>9} {r['kind']:<6} "
              f"{'NEW' if r['new'] else 'dup'}")


BREAKDOWN_CASES = [
    # one layer, dims chosen so that every symbol / product is distinguishable in the shape tables
    ("gpt2", gpt2_config(64, 1, 1000), 3, 10),
    ("llama", llama_config(64, 1, 1000, 2, 172), 3, 10),
]


def breakdown_dims(fam, cfg, b, s):
    dims = {"b": b, "s": s, "h": cfg["hidden"], "a": cfg["heads"], "d": cfg["head_dim"],
            "i": cfg["intermediate"], "V": cfg["vocab"], "(s-1)": s - 1}
    if fam == "gpt2":
        dims["P"] = cfg["n_positions"]
    else:
        dims["kv"] = cfg["kv_heads"]
    return dims


def write_fixture(path, obj):
    """Write a fixture as the tests read it: sorted keys, one-space indent, final newline."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--breakdown", action="store_true", help="print the one-layer per-op tables")
    args = ap.parse_args()
    breakdowns = []
    for fam, cfg, b, s in BREAKDOWN_CASES:
        res = measure(fam, cfg, b, s, detail=True)
        dims = breakdown_dims(fam, cfg, b, s)
        for r in res["rows"]:
            r["shape_sym"] = sym_shape(r["shape"], dims)
        if args.breakdown:
            print_breakdown(res, dims)
        assert formula_bytes(res) == res["saved_bytes"]
        res["formula_bytes"] = formula_bytes(res)
        res["dims"] = dims
        breakdowns.append(res)
    if args.breakdown:
        return
    results = []
    for fam, cfg, b, s in build_cases():
        r = measure(fam, cfg, b, s)
        fb = formula_bytes(r)
        fb2 = formula_bytes(r, mean_saves_self=False)
        assert fb == r["saved_bytes"], (fam, cfg, b, s, r["saved_bytes"], fb, r["saved_bytes"] - fb)
        assert fb2 == r["saved_bytes_modern_torch"], (fam, cfg, b, s, r["saved_bytes_modern_torch"], fb2)
        r["formula_bytes"] = fb
        results.append(r)
        print(f"{fam:5} h={cfg['hidden']} L={cfg['layers']} V={cfg['vocab']} kv={cfg['kv_heads']} "
              f"i={cfg['intermediate']} b={b} s={s} drop={cfg.get('resid_pdrop', cfg.get('attention_dropout'))}"
              f"/{cfg['dropout_impl']} loss={cfg['loss_impl']}: saved={r['saved_bytes']} (formula ok)",
              file=sys.stderr)
    out = {"generator": "oracle/activations_oracle.py", "torch_version": torch.__version__,
           "cases": results, "breakdowns": breakdowns}
    if args.out:
        write_fixture(args.out, out)


if __name__ == "__main__":
    main()
