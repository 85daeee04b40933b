#!/usr/bin/python3
"""CPU oracle: one training step under the tensor handling of real training loops.

step_oracle.py measures one loop only: the HF model computes the loss inside
forward and the loop keeps nothing but the loss.  Real loops differ in what
stays bound to a Python name while backward (and the optimizer, and the next
forward) runs.  This script runs the same small fp32 GPT-2 and LLaMA replicas
(activations_oracle.py, imported unchanged), the same profiler machinery and
the same AdamW(foreach=False) as step_oracle.py (imported: Phase, new_profile,
alloc_events, summarize, unique_params, measure), under six loops:

  hf       transformers >= 4.46: ForCausalLMLoss ("pad") inside forward, the
           loop keeps only the loss.  Must equal step_oracle.py's "pad" case
           (asserted against a fresh step_oracle.measure run and against the
           committed tests/fixtures/oracle/step_memory.json).
  nanogpt  karpathy/nanoGPT @ 3adf61e154c3fe3fca428ad6bc3818b27a3b8291
           model.py:186  `logits = self.lm_head(x)`
           model.py:187  `loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)`
           model.py:193  `return logits, loss`
           train.py:124-125  X, Y = data[i:i+block_size], data[i+1:i+1+block_size] (torch.stack; Y is its own
                         tensor, already the next tokens: no shift copy, no padding)
           train.py:300  `logits, loss = model(X, Y)`
           train.py:301  `loss = loss / gradient_accumulation_steps`
           train.py:303  `X, Y = get_batch('train')` (prefetch; not replicated, see below)
           train.py:305  `scaler.scale(loss).backward()` with `logits` still bound
           train.py:311-314  scaler.step(optimizer); scaler.update(); optimizer.zero_grad(set_to_none=True)
           `logits` and `loss` are rebound only by the next micro-step's line 300, i.e. after the next forward
           has returned: they stay alive through backward, the optimizer, zero_grad and the whole next forward.
  llama2c  karpathy/llama2.c @ 350e04fe35433e6d2941dce5a1f53308f87058eb
           model.py:262  `logits = self.output(h)`
           model.py:263  `self.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)`
           model.py:269  `return logits`
           train.py:305  `logits = model(X, Y)`;  train.py:306 `loss = raw_model.last_loss`;
           train.py:307  `loss = loss / gradient_accumulation_steps`;  train.py:309 `X, Y = next(train_batch_iter)`;
           train.py:311  `scaler.scale(loss).backward()`;  train.py:317-320 step, update, zero_grad(set_to_none=True).
           Same lifetimes as nanoGPT, plus the unscaled loss kept as a module attribute until the next forward
           reassigns it (model.py:263).
  chunked  pytorch/torchtune v0.5.0 @ 0bb00a47b12b7a900ed797d1f9a2ff5a997774c3 (the recipe still has
           `del logits`; the current main deletes `outputs` at the same place)
           torchtune/modules/transformer.py:499-502 chunked_output:
               `[self.output(chunk) for chunk in last_hidden_state.chunk(self.num_output_chunks, dim=1)]`
           torchtune/modules/transformer.py:655-656 unembed: `if self.num_output_chunks > 0: output = self.chunked_output(h)`
           torchtune/modules/loss/ce_chunked_output_loss.py:41-43 compute_cross_entropy:
               `F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")`
           ce_chunked_output_loss.py:66 `total_elements = (labels != self.ignore_index).sum()`
           ce_chunked_output_loss.py:69-76 labels.chunk(num_output_chunks, dim=1) -> reshape(-1);
                                            logit_chunk.reshape(-1, logit_chunk.size(-1))
           ce_chunked_output_loss.py:79-83 `total_loss += self.compute_cross_entropy(...)`; `return total_loss / total_elements`
           recipes/full_finetune_single_device.py:339-341 `self.ignore_labels_cache = torch.full((cfg.batch_size, 1), ignore_index)`
           recipes/full_finetune_single_device.py:626-647 _loss_step: `labels = batch.pop("labels")`;
               `logits = self._model(**batch)`; `labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))`;
               `loss = self._loss_fn(logits, labels)`; `del logits`; `return loss`
           recipes/full_finetune_single_device.py:695-716 train: `current_num_tokens = (batch["labels"] != ignore_index).sum()`;
               `num_tokens += current_num_tokens`; `current_loss = self._loss_step(batch) * current_num_tokens`;
               `running_loss += current_loss`; `current_loss.backward()`; `training.scale_grads(self._model, 1 / num_tokens)`;
               `self._optimizer.step()`; `self._optimizer.zero_grad(set_to_none=True)`
           recipes/full_finetune_single_device.py:723,757-758 `loss_to_log = running_loss.item() / num_tokens`;
               `running_loss = 0`; `num_tokens = 0`
           torchtune/training/_grad_scaler.py:25-31 scale_grads: `p.grad *= scaler` (in place)
           The loss is torchtune's default for its single-device configs, e.g.
           recipes/configs/llama3_2/1B_full_single_device.yaml:58-59.
  deleted  the HF model called without labels returns logits; the loop computes ForCausalLMLoss from them
           (`F.cross_entropy(logits.float().view(-1, V), shifted padded labels)`) and does `del logits` before
           backward.  Separates "loss inside forward" (no effect) from "logits kept" (the effect).
  kept     the HF loss inside forward, and the loop keeps `outputs` (hence `outputs.logits`) bound:
           `outputs = model(**batch); outputs.loss.backward(); optimizer.step(); optimizer.zero_grad()`, so the
           output object lives until the next iteration's `outputs = model(...)` has returned.

What is the same in every loop, on purpose, so that the loops differ only in tensor handling:
  * the backbone: the HF GPT-2 / LLaMA replicas of activations_oracle.py (not nanoGPT's, llama2.c's or
    torchtune's own modules; nanoGPT's default SDPA attention, llama2.c's RoPE etc. are not replicated);
    nanogpt/llama2c/chunked only change what happens from the output projection on.  The replica's
    lm_head call and its `causal_lm_loss(...)` call are where the loops plug in: the module-level
    activations_oracle.causal_lm_loss is swapped for the duration of the model call, and for "chunked"
    lm_head is wrapped (parameters and their order unchanged) so that it passes the hidden states through
    and the chunked projection runs in the swapped function, still inside the model's forward;
  * the optimizer: torch.optim.AdamW(lr=1e-3, foreach=False), one param group (not nanoGPT's fused AdamW
    with decay/no-decay groups), gradient_accumulation_steps = 1, no gradient clipping (nanoGPT and
    llama2.c default to grad_clip=1.0: per-parameter 0-dim norms, a few hundred bytes), GradScaler
    disabled (it only acts for fp16: `scaler.scale(loss)` is `loss`);
  * the data: the batch tensors are allocated before the profile and reused by both steps, as in
    step_oracle.py.  nanoGPT/llama2.c prefetch the next (X, Y) between forward and backward and torchtune
    pops and drops its labels; none of that turnover is replicated (it is <= 2 * 8*b*s bytes, int64).
    The hf/deleted/kept loops use labels = input_ids (one tensor); nanogpt/llama2c have separate
    targets Y (= next tokens), chunked has separate labels plus the [b, 1] ignore_labels_cache; those
    are in input_bytes / baseline_bytes.

Checks, for every loop and both steps:
  * live bytes at the end of backward / optimizer / zero_grad / release = baseline + optimizer state (after
    step 1's optimizer) + grads (param_bytes, between backward and zero_grad) + the storages still bound to
    the loop's names (logits, losses, ...; measured from the loop's variables);
  * step 2 ends where step 1 ended (steady state, nothing leaks);
  * at each step's peak, the allocations still alive (matched by allocator pointer, step 1's carried into
    step 2) add up to peak_bytes - baseline_bytes; they are listed, grouped by allocating op, in peak_live;
  * "hf" equals step_oracle.py's "pad" case exactly (every summarized field of both steps);
  * the per-loop differences from "hf" stated in oracle/README.md (formulas in b, s, V, h; vs_hf_formulas)
    hold exactly for deleted/kept/nanogpt/llama2c, and for chunked's forward and backward phase peaks up to
    <= 128 bytes of 0-dim scalars (token counts, running sums), whose measured amount is recorded; hf's own
    backward - forward phase-peak difference holds exactly.

Usage:
  /usr/bin/python3 oracle/loops_oracle.py --out tests/fixtures/oracle/loops.json
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import activations_oracle as A  # noqa: E402
import step_oracle as S  # noqa: E402  (pins torch.set_num_threads(2))

LOOPS = ["hf", "nanogpt", "llama2c", "chunked", "deleted", "kept"]
NUM_OUTPUT_CHUNKS = 8        # torchtune CEWithChunkedOutputLoss default
TT_IGNORE_INDEX = -100       # torchtune CEWithChunkedOutputLoss default
NANOGPT_IGNORE_INDEX = -1    # nanoGPT / llama2.c cross_entropy(..., ignore_index=-1)
GRAD_ACCUM = 1               # gradient_accumulation_steps (the division is still done, as in train.py)
HF_CAUSAL_LM_LOSS = A.causal_lm_loss  # the original, before any swap
PEAK_LIVE_MIN_BYTES = 1024   # peak_live lists allocations of at least this size one by one

FIXTURE_STEP_MEMORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "oracle",
                                   "step_memory.json")

NANOGPT = "karpathy/nanoGPT"
NANOGPT_AT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"
LLAMA2C = "karpathy/llama2.c"
LLAMA2C_AT = "350e04fe35433e6d2941dce5a1f53308f87058eb"
TORCHTUNE = "pytorch/torchtune"
TORCHTUNE_AT = "0bb00a47b12b7a900ed797d1f9a2ff5a997774c3"  # v0.5.0
TORCHTUNE_MAIN_AT = "bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1"
HF = "huggingface/transformers"

CITATIONS = {
    "hf": [
        f"{HF} src/transformers/loss/loss_utils.py@0114da07ec0e — ForCausalLMLoss: logits.float(), labels padded "
        "with -100 and shifted, cross_entropy over all b*s rows (replicated by activations_oracle.causal_lm_loss "
        "loss_impl='pad')",
        f"{HF} src/transformers/models/llama/modeling_llama.py@5dd4a6354885 — LlamaForCausalLM.forward computes "
        "the loss inside forward when labels are given; the loop keeps only the loss (step_oracle.py)",
    ],
    "nanogpt": [
        f"{NANOGPT} model.py@{NANOGPT_AT}:186 — logits = self.lm_head(x) on all b*s positions (training path)",
        f"{NANOGPT} model.py@{NANOGPT_AT}:187 — loss = F.cross_entropy(logits.view(-1, logits.size(-1)), "
        "targets.view(-1), ignore_index=-1): no upcast, no shift copy",
        f"{NANOGPT} model.py@{NANOGPT_AT}:193 — return logits, loss",
        f"{NANOGPT} train.py@{NANOGPT_AT}:124-125 — x, y = torch.stack of data[i:i+block_size] / "
        "data[i+1:i+1+block_size]: targets are the next tokens, a separate tensor",
        f"{NANOGPT} train.py@{NANOGPT_AT}:300 — logits, loss = model(X, Y): logits stays bound until this line "
        "runs again in the next micro-step",
        f"{NANOGPT} train.py@{NANOGPT_AT}:301 — loss = loss / gradient_accumulation_steps",
        f"{NANOGPT} train.py@{NANOGPT_AT}:303 — X, Y = get_batch('train'): next batch prefetched before backward",
        f"{NANOGPT} train.py@{NANOGPT_AT}:305 — scaler.scale(loss).backward() with logits alive",
        f"{NANOGPT} train.py@{NANOGPT_AT}:311-314 — scaler.step(optimizer); scaler.update(); "
        "optimizer.zero_grad(set_to_none=True): logits still alive",
        f"{NANOGPT} train.py@{NANOGPT_AT}:48,63,196 — defaults not replicated here: gradient_accumulation_steps = "
        "5 * 8, grad_clip = 1.0, GradScaler(enabled=(dtype == 'float16'))",
    ],
    "llama2c": [
        f"{LLAMA2C} model.py@{LLAMA2C_AT}:262 — logits = self.output(h) on all b*s positions (training path)",
        f"{LLAMA2C} model.py@{LLAMA2C_AT}:263 — self.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), "
        "targets.view(-1), ignore_index=-1): the loss is kept as a module attribute",
        f"{LLAMA2C} model.py@{LLAMA2C_AT}:269 — return logits",
        f"{LLAMA2C} train.py@{LLAMA2C_AT}:305 — logits = model(X, Y): logits stays bound until the next micro-step",
        f"{LLAMA2C} train.py@{LLAMA2C_AT}:306-307 — loss = raw_model.last_loss; loss = loss / "
        "gradient_accumulation_steps",
        f"{LLAMA2C} train.py@{LLAMA2C_AT}:309 — X, Y = next(train_batch_iter): next batch prefetched before backward",
        f"{LLAMA2C} train.py@{LLAMA2C_AT}:311 — scaler.scale(loss).backward() with logits alive",
        f"{LLAMA2C} train.py@{LLAMA2C_AT}:317-320 — scaler.step(optimizer); scaler.update(); "
        "optimizer.zero_grad(set_to_none=True): logits still alive",
        f"{LLAMA2C} train.py@{LLAMA2C_AT}:60,66,188 — defaults not replicated here: gradient_accumulation_steps = 4, "
        "grad_clip = 1.0, GradScaler(enabled=(dtype == 'float16'))",
    ],
    "chunked": [
        f"{TORCHTUNE} torchtune/modules/transformer.py@{TORCHTUNE_AT}:499-502 — chunked_output: "
        "[self.output(chunk) for chunk in last_hidden_state.chunk(self.num_output_chunks, dim=1)]",
        f"{TORCHTUNE} torchtune/modules/transformer.py@{TORCHTUNE_AT}:655-656 — unembed returns the list of "
        "chunk logits when num_output_chunks > 0 (no .float() there)",
        f"{TORCHTUNE} torchtune/modules/loss/ce_chunked_output_loss.py@{TORCHTUNE_AT}:41-43 — "
        "F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction='sum') per chunk",
        f"{TORCHTUNE} torchtune/modules/loss/ce_chunked_output_loss.py@{TORCHTUNE_AT}:66 — total_elements = "
        "(labels != self.ignore_index).sum()",
        f"{TORCHTUNE} torchtune/modules/loss/ce_chunked_output_loss.py@{TORCHTUNE_AT}:69-76 — labels.chunk("
        "num_output_chunks, dim=1) -> reshape(-1); logit_chunk.reshape(-1, vocab)",
        f"{TORCHTUNE} torchtune/modules/loss/ce_chunked_output_loss.py@{TORCHTUNE_AT}:79-83 — total_loss += "
        "compute_cross_entropy(chunk) for each chunk; return total_loss / total_elements",
        f"{TORCHTUNE} recipes/full_finetune_single_device.py@{TORCHTUNE_AT}:339-341 — ignore_labels_cache = "
        "torch.full((batch_size, 1), ignore_index)",
        f"{TORCHTUNE} recipes/full_finetune_single_device.py@{TORCHTUNE_AT}:626-647 — _loss_step: labels = "
        "batch.pop('labels'); logits = self._model(**batch); labels = torch.hstack((labels[..., 1:], "
        "ignore_labels_cache[:b])); loss = self._loss_fn(logits, labels); del logits; return loss",
        f"{TORCHTUNE} recipes/full_finetune_single_device.py@{TORCHTUNE_AT}:695-716 — current_num_tokens = "
        "(labels != ignore_index).sum(); current_loss = self._loss_step(batch) * current_num_tokens; "
        "running_loss += current_loss; current_loss.backward(); scale_grads(model, 1 / num_tokens); "
        "optimizer.step(); optimizer.zero_grad(set_to_none=True)",
        f"{TORCHTUNE} recipes/full_finetune_single_device.py@{TORCHTUNE_AT}:723,757-758 — loss_to_log = "
        "running_loss.item() / num_tokens; running_loss = 0; num_tokens = 0",
        f"{TORCHTUNE} torchtune/training/_grad_scaler.py@{TORCHTUNE_AT}:25-31 — scale_grads: p.grad *= scaler "
        "(in place)",
        f"{TORCHTUNE} recipes/configs/llama3_2/1B_full_single_device.yaml@{TORCHTUNE_AT}:58-59 — loss: "
        "torchtune.modules.loss.CEWithChunkedOutputLoss (the single-device default)",
        f"{TORCHTUNE} recipes/full_finetune_single_device.py@{TORCHTUNE_MAIN_AT}:551-569 — current main: "
        "_loss_step does `del outputs` (line 567) at the same place (CEWithChunkedOutputLoss is deprecated there in favour "
        "of LinearCrossEntropyLoss, ce_chunked_output_loss.py:17)",
    ],
    "deleted": [
        f"{HF} src/transformers/models/llama/modeling_llama.py@5dd4a6354885 — without labels the model returns "
        "logits and computes no loss; here the loop applies ForCausalLMLoss (loss/loss_utils.py@0114da07ec0e) to "
        "them and deletes them before backward",
        f"{TORCHTUNE} recipes/full_finetune_single_device.py@{TORCHTUNE_AT}:644-645 — the same idiom in a real "
        "recipe: '# free logits otherwise it peaks backward memory', del logits",
    ],
    "kept": [
        f"{HF} src/transformers/models/llama/modeling_llama.py@5dd4a6354885 — LlamaForCausalLM.forward returns "
        "CausalLMOutputWithPast(loss=loss, logits=logits, ...): a loop that keeps `outputs` keeps the [b, s, V] "
        "logits until `outputs` is rebound by the next iteration's forward",
        f"{HF} src/transformers/models/llama/modeling_llama.py@5dd4a6354885 — LlamaModel.forward: use_cache "
        "defaults to config.use_cache (True), `if use_cache and past_key_values is None: past_key_values = "
        "DynamicCache()`, returned in the output: a kept `outputs` also keeps every layer's K/V (not replicated "
        "here, see oracle/README.md)",
    ],
}


# --------------------------------------------------------------------------------------
# plumbing
# --------------------------------------------------------------------------------------

class swap_loss:
    """Swap activations_oracle.causal_lm_loss (called by the replicas' forward right after lm_head) for fn."""

    def __init__(self, fn):
        self.fn = fn

    def __enter__(self):
        A.causal_lm_loss = self.fn
        return self

    def __exit__(self, *exc):
        A.causal_lm_loss = HF_CAUSAL_LM_LOSS
        return False


class SkipOutput(nn.Module):
    """Wraps lm_head (same parameter, same position in model.parameters()): passes the hidden states through,
    so the swapped loss function can apply the projection per chunk (torchtune's chunked_output)."""

    def __init__(self, proj):
        super().__init__()
        self.proj = proj

    def forward(self, h):
        return h


def tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


def alloc_ptrs(prof, events):
    """The allocator pointer of every event of S.alloc_events(prof), in the same order (same tree walk, same
    sort key); the deltas are checked against `events`."""
    out, seq = [], [0]

    def walk(ev):
        ef = ev.extra_fields
        if isinstance(ef, torch._C._profiler._ExtraFields_Allocation):
            out.append((ev.start_time_ns, seq[0], int(ef.alloc_size), int(ef.ptr)))
            seq[0] += 1
            return
        for c in ev.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    out.sort(key=lambda e: (e[0], e[1]))
    assert [d for _, _, d, _ in out] == [e["delta"] for e in events]
    return [p for _, _, _, p in out]


def inplace_grad_sum_events(events):
    """`events` as torch >= 2.0 makes them: autograd's InputBuffer adds a further gradient into the first in
    place (torch/csrc/autograd/input_buffer.cpp InputBuffer::accumulate: can_accumulate_inplace -> add_), where
    torch 1.13 allocates the sum (`old_var + var`) and then frees the old buffer.  Such a sum is an aten::add
    directly under a node's evaluate_function; it and the next free of its size in that node are dropped."""
    out, pending = [], []
    for e in events:
        path = e["path"].split(" / ") if e["path"] else []
        node = path[0] if path else ""
        if (e["delta"] > 0 and len(path) == 2 and node.startswith("autograd::engine::evaluate_function:")
                and path[1] == "aten::add"):
            pending.append((e["delta"], node))
            continue
        if e["delta"] < 0 and (-e["delta"], node) in pending:
            pending.remove((-e["delta"], node))
            continue
        out.append(e)
    assert not pending, pending
    return out


def op_label(e):
    path = e["path"].split(" / ") if e["path"] else []
    if not path:
        return e["phase"]
    outer = path[0].replace("autograd::engine::evaluate_function: ", "")
    inner = path[-1]
    return f"{e['phase']}: {outer}" + ("" if inner == path[0] or inner == outer else f" > {inner}")


def live_at_peak(events, ptrs, carried, step, peak_index):
    """Allocations made inside the profiles (this step's, and still-live ones of step 1) that are alive at the
    step's peak, grouped by (step, phase, allocating op, size).  Returns (rows, live dict at the step's end)."""
    live = dict(carried)
    at_peak = dict(live) if peak_index < 0 else None
    for i, (e, p) in enumerate(zip(events, ptrs)):
        if e["delta"] > 0:
            live[p] = (e["delta"], f"step{step} {op_label(e)}")
        else:
            assert live.pop(p)[0] == -e["delta"]
        if i == peak_index:
            at_peak = dict(live)
    groups = {}
    for nbytes, label in at_peak.values():
        groups[(label, nbytes)] = groups.get((label, nbytes), 0) + 1
    total = sum(nb * n for (_, nb), n in groups.items())
    rows = sorted(((n, nb, label) for (label, nb), n in groups.items()), key=lambda r: (-r[0] * r[1], r[2], r[1]))
    big = [f"{n} x {nb} {label}" for n, nb, label in rows if nb >= PEAK_LIVE_MIN_BYTES]
    small = sum(n * nb for n, nb, _ in rows if nb < PEAK_LIVE_MIN_BYTES)
    return {"total_bytes": total, "tensors": big, "rest_bytes": small, "min_bytes": PEAK_LIVE_MIN_BYTES}, live


def storage_bytes(tensors, exclude=()):
    seen, total = set(exclude), 0
    for t in tensors:
        k = A.storage_key(t)
        if k not in seen:
            seen.add(k)
            total += A.storage_nbytes(t)
    return total


# --------------------------------------------------------------------------------------
# loops.  Each keeps its Python names in `env` (the loop's scope, alive across steps).  forward/backward/
# optimizer/release run inside the step's phase ranges; held() lists what the loop's names keep alive.
# --------------------------------------------------------------------------------------

class Loop:
    name = None

    def __init__(self, model, cfg, b, s):
        self.model, self.cfg, self.b, self.s = model, cfg, b, s
        self.V = cfg["vocab"]
        self.env = {}

    def inputs(self, input_ids):
        """Batch tensors allocated before the profile (in the baseline)."""
        self.input_ids = input_ids
        return [input_ids]

    def backward(self):
        self.env["loss"].backward()

    def pre_optimizer(self):
        pass

    def release(self):
        pass

    def held(self):
        return tensors_in(self.env)


class HFLoop(Loop):
    """step_oracle.py: loss = model(input_ids, labels); loss.backward(); ...; del loss"""
    name = "hf"

    def forward(self):
        self.env["loss"] = self.model(self.input_ids, self.input_ids)

    def release(self):
        del self.env["loss"]


class NanoGPTLoop(Loop):
    name = "nanogpt"

    def inputs(self, input_ids):
        self.X = input_ids
        # train.py:124-125: y is data[i+1:i+1+block_size], its own tensor (here: X shifted, one new last token)
        g = torch.Generator().manual_seed(A.SEED + 1)
        self.Y = torch.cat([input_ids[:, 1:], torch.randint(0, self.V, (self.b, 1), generator=g)], dim=1)
        return [self.X, self.Y]

    @staticmethod
    def head(logits, targets, vocab_size, loss_impl, upcast):
        # model.py:186-193 (no upcast in nanoGPT)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=NANOGPT_IGNORE_INDEX)
        return logits, loss

    def forward(self):
        with swap_loss(self.head):
            self.env["logits"], self.env["loss"] = self.model(self.X, self.Y)   # train.py:300
        self.env["loss"] = self.env["loss"] / GRAD_ACCUM                         # train.py:301
    # backward: scaler.scale(loss).backward() (train.py:305); GradScaler disabled unless fp16
    # release: nothing; logits and loss are rebound by the next forward (train.py:300)


class Llama2cLoop(NanoGPTLoop):
    name = "llama2c"

    def __init__(self, *a):
        super().__init__(*a)
        self.model.last_loss = None  # model.py:239

    def head(self, logits, targets, vocab_size, loss_impl, upcast):
        # model.py:262-269
        self.model.last_loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                               ignore_index=NANOGPT_IGNORE_INDEX)
        return logits

    def forward(self):
        with swap_loss(self.head):
            self.env["logits"] = self.model(self.X, self.Y)      # train.py:305
        self.env["loss"] = self.model.last_loss                    # train.py:306
        self.env["loss"] = self.env["loss"] / GRAD_ACCUM           # train.py:307

    def held(self):
        return tensors_in(self.env) + tensors_in(self.model.last_loss)


class ChunkedLoop(Loop):
    """torchtune v0.5.0 full_finetune_single_device with CEWithChunkedOutputLoss(num_output_chunks=8)."""
    name = "chunked"

    def __init__(self, *a):
        super().__init__(*a)
        self.model.lm_head = SkipOutput(self.model.lm_head)  # same Parameter, same order in model.parameters()
        self.env["running_loss"] = 0
        self.env["num_tokens"] = 0

    def inputs(self, input_ids):
        self.tokens = input_ids
        self.labels = input_ids.clone()  # batch["labels"]: its own tensor in torchtune's SFT batches
        # recipe :339-341 (int fill -> int64)
        self.ignore_labels_cache = torch.full((self.b, 1), TT_IGNORE_INDEX)
        return [self.tokens, self.labels, self.ignore_labels_cache]

    def head(self, h, labels, vocab_size, loss_impl, upcast):
        # transformer.py:499-502 chunked_output (self.output = the wrapped lm_head Linear)
        proj = self.model.lm_head.proj
        return [proj(chunk) for chunk in h.chunk(NUM_OUTPUT_CHUNKS, dim=1)]

    @staticmethod
    def loss_fn(logits, labels):
        # ce_chunked_output_loss.py:66-83
        total_elements = (labels != TT_IGNORE_INDEX).sum()
        labels = [target_chunk.reshape(-1) for target_chunk in labels.chunk(NUM_OUTPUT_CHUNKS, dim=1)]
        logits = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
        total_loss = 0.0
        for logits_chunk, labels_chunk in zip(logits, labels):
            total_loss += F.cross_entropy(logits_chunk.float(), labels_chunk, ignore_index=TT_IGNORE_INDEX,
                                          reduction="sum")
        return total_loss / total_elements

    def loss_step(self):
        # recipe :626-647
        labels = self.labels  # batch.pop("labels")
        with swap_loss(self.head):
            logits = self.model(self.tokens, self.tokens)  # self._model(**batch)
        labels = torch.hstack((labels[..., 1:], self.ignore_labels_cache[: labels.shape[0]]))
        loss = self.loss_fn(logits, labels)
        del logits
        return loss

    def forward(self):
        e = self.env
        # recipe :695-703
        e["current_num_tokens"] = (self.labels != TT_IGNORE_INDEX).sum()
        e["num_tokens"] += e["current_num_tokens"]
        e["current_loss"] = self.loss_step() * e["current_num_tokens"]
        e["running_loss"] += e["current_loss"]

    def backward(self):
        self.env["current_loss"].backward()

    def pre_optimizer(self):
        # training.scale_grads(self._model, 1 / num_tokens) (recipe :709, _grad_scaler.py:25-31)
        scaler = 1 / self.env["num_tokens"]
        device = None
        for p in self.model.parameters():
            if not device:
                device = p.device
                scaler = scaler.to(device)
            if p.grad is not None:
                p.grad *= scaler

    def release(self):
        e = self.env
        # recipe :723, :757-758 (current_loss / current_num_tokens stay bound until the next iteration)
        e["loss_to_log"] = e["running_loss"].item() / e["num_tokens"]
        e["running_loss"] = 0
        e["num_tokens"] = 0


class DeletedLoop(Loop):
    """HF model without labels returns logits; the loop computes the loss and deletes the logits."""
    name = "deleted"

    @staticmethod
    def head(logits, labels, vocab_size, loss_impl, upcast):
        return logits

    def forward(self):
        with swap_loss(self.head):
            logits = self.model(self.input_ids, self.input_ids)
        self.env["loss"] = HF_CAUSAL_LM_LOSS(logits, self.input_ids, self.V, "pad", True)
        del logits

    def release(self):
        del self.env["loss"]


class KeptLoop(Loop):
    """outputs = model(**batch); outputs.loss.backward(); ... -- outputs rebound by the next forward."""
    name = "kept"

    @staticmethod
    def head(logits, labels, vocab_size, loss_impl, upcast):
        return HF_CAUSAL_LM_LOSS(logits, labels, vocab_size, "pad", upcast), logits  # (outputs.loss, outputs.logits)

    def forward(self):
        with swap_loss(self.head):
            self.env["outputs"] = self.model(self.input_ids, self.input_ids)

    def backward(self):
        self.env["outputs"][0].backward()


LOOP_CLASSES = {c.name: c for c in (HFLoop, NanoGPTLoop, Llama2cLoop, ChunkedLoop, DeletedLoop, KeptLoop)}
LOSS_IMPL = {"hf": "pad", "deleted": "pad", "kept": "pad", "nanogpt": "targets", "llama2c": "targets",
             "chunked": "chunked"}


# --------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------

def build_model(fam, cfg, b, s):
    """As step_oracle.measure: same seed, same init, same input_ids."""
    torch.manual_seed(A.SEED)
    model = (A.GPT2LMHeadModel if fam == "gpt2" else A.LlamaForCausalLM)(cfg)
    input_ids = torch.randint(0, cfg["vocab"], (b, s), dtype=torch.long)
    model.train()
    return model, input_ids


def measure(loop_name, fam, cfg, b, s):
    mcfg = dict(cfg, loss_impl="pad")  # the replica's own loss (used by hf/deleted/kept)
    model, input_ids = build_model(fam, mcfg, b, s)
    loop = LOOP_CLASSES[loop_name](model, mcfg, b, s)
    inputs = loop.inputs(input_ids)
    params = S.unique_params(model)
    param_bytes = sum(A.storage_nbytes(p) for p in params)
    opt = torch.optim.AdamW(model.parameters(), lr=S.LR, foreach=False)
    assert opt.param_groups[0]["foreach"] is False
    input_bytes = storage_bytes(inputs)
    baseline = param_bytes + input_bytes
    base_keys = {A.storage_key(t) for t in list(params) + inputs}
    state_total = 2 * param_bytes + 4 * len(params)  # exp_avg, exp_avg_sq, 0-dim fp32 step (asserted below)

    steps = []
    start = baseline
    carried = {}
    for step in (1, 2):
        held = {}
        with S.new_profile() as prof:
            with S.Phase("forward"):
                loop.forward()
            held["forward"] = storage_bytes(loop.held(), base_keys)
            with S.Phase("backward"):
                loop.backward()
            held["backward"] = storage_bytes(loop.held(), base_keys)
            with S.Phase("optimizer"):
                loop.pre_optimizer()
                opt.step()
            held["optimizer"] = storage_bytes(loop.held(), base_keys)
            with S.Phase("zero_grad"):
                opt.zero_grad(set_to_none=True)
            held["zero_grad"] = storage_bytes(loop.held(), base_keys)
            with S.Phase("release"):
                loop.release()
            held["release"] = storage_bytes(loop.held(), base_keys)
        ev = S.alloc_events(prof)
        summ = S.summarize(ev, start)
        summ["peak_live"], carried = live_at_peak(ev, alloc_ptrs(prof, ev), carried, step, summ["peak_event_index"])
        # every byte above the baseline at the peak is one of these allocations
        assert summ["peak_live"]["total_bytes"] == summ["peak_bytes"] - baseline, (loop_name, step, summ["peak_live"])
        # live bytes at phase ends = baseline + optimizer state (from step 1's optimizer on) + grads (backward
        # to zero_grad) + the storages the loop's names hold
        st_bwd = 0 if step == 1 else state_total
        assert summ["after_backward"] == baseline + st_bwd + param_bytes + held["backward"], (loop_name, step, held)
        assert summ["after_optimizer"] == baseline + state_total + param_bytes + held["optimizer"], (loop_name, step)
        assert summ["after_zero_grad"] == baseline + state_total + held["zero_grad"], (loop_name, step, held)
        assert summ["after_release"] == baseline + state_total + held["release"], (loop_name, step, held)
        summ["held_bytes"] = held  # {phase: bytes bound to the loop's names at the end of the phase}
        # the same step with torch >= 2.0's in-place gradient sums (inplace_grad_sum_events)
        modern = S.summarize(inplace_grad_sum_events(ev), start)
        assert modern["after_release"] == summ["after_release"]
        summ["inplace_grad_sum"] = {k: modern[k] for k in ("peak_bytes", "peak_phase", "peak_op_path", "phase_peaks")}
        steps.append(summ)
        start = summ["after_release"]
    assert steps[1]["after_release"] == steps[0]["after_release"], loop_name  # steady state
    state_bytes = sum(A.storage_nbytes(v) for p in params for k, v in opt.state[p].items()
                      if isinstance(v, torch.Tensor))
    assert state_bytes == state_total, (state_bytes, state_total)

    V, h = cfg["vocab"], cfg["hidden"]
    res = {
        "name": f"{case_key(fam, cfg, b, s)}-{loop_name}",
        "loop": loop_name, "family": fam, "config": dict(cfg, loss_impl=LOSS_IMPL[loop_name]),
        "batch": b, "seq": s, "dtype": "float32",
        "logits_bytes": 4 * b * s * V,
        "logits_chunk_bytes": 4 * b * (s // NUM_OUTPUT_CHUNKS) * V if loop_name == "chunked" else None,
        "hidden_bytes": 4 * b * s * h,
        "param_bytes": param_bytes, "input_bytes": input_bytes, "baseline_bytes": baseline,
        "optimizer_state_bytes": state_total,
        "step1": steps[0], "step2": steps[1],
    }
    if res["logits_chunk_bytes"] is None:
        del res["logits_chunk_bytes"]
    return res


def case_key(fam, cfg, b, s):
    if fam == "gpt2":
        return f"gpt2-h{cfg['hidden']}-L{cfg['layers']}-V{cfg['vocab']}-b{b}-s{s}"
    return f"llama-h{cfg['hidden']}-kv{cfg['kv_heads']}-L{cfg['layers']}-V{cfg['vocab']}-b{b}-s{s}"


def build_cases():
    g, l = A.gpt2_config, A.llama_config
    return [
        # the first two of each family are step_memory.json "pad" cases (cross-checked against the fixture)
        ("gpt2", g(64, 2, 1000), 2, 32),
        ("gpt2", g(64, 2, 1000), 4, 128),
        ("gpt2", g(64, 2, 5000), 2, 64),
        ("llama", l(64, 2, 1000, 2, 172), 2, 32),
        ("llama", l(64, 2, 1000, 4, 172), 4, 128),
        ("llama", l(64, 2, 5000, 2, 172), 2, 64),
    ]


STEP_FIELDS = ["start_bytes", "peak_bytes", "peak_phase", "peak_op", "peak_op_path", "peak_event_index",
               "after_forward", "after_backward", "after_optimizer", "after_zero_grad", "after_release",
               "phase_peaks", "num_memory_events", "num_memory_events_by_phase"]


CHUNKED_SCALARS_MAX = 128  # bytes of 0-dim tensors (token counts, running sums) allowed in the chunked check


def vs_hf_formulas(fam, cfg, b, s):
    """Closed forms (bytes, fp32) of loop - hf, from oracle/README.md.  L = logits = log_softmax = 4*b*s*V.
    E = what the replica's forward keeps in Python locals while the in-forward loss runs (freed before the
    loss when the loop computes it): GPT-2 inputs_embeds [b,s,h] and position_embeds [1,s,h]; LLaMA the fp32
    4-D causal mask [s, s+1] and the int64 cache_position [s].  The padded labels [b,s+1] (int64) of the HF
    loss are alive during its cross-entropy and are not in nanoGPT/llama2.c (8*b*(s+1))."""
    V, h = cfg["vocab"], cfg["hidden"]
    L = 4 * b * s * V
    E = 4 * b * s * h + 4 * s * h if fam == "gpt2" else 4 * s * (s + 1) + 8 * s
    pad = 8 * b * (s + 1)
    Y = 8 * b * s  # nanoGPT/llama2.c targets: a second int64 [b, s] tensor
    f = {"L": L, "E": E}
    # {loop: {step: {phase or "peak": diff}}}; phases after forward share one value
    f["deleted"] = {k: {"forward": -E, "after": 0, "peak": 0} for k in ("step1", "step2")}
    # "after": every phase peak after forward and the live bytes at the end of backward/optimizer/zero_grad;
    # "after_release": hf drops its 4-byte loss there, these loops keep theirs bound (+4, llama2.c +8)
    f["kept"] = {"step1": {"forward": 0, "after": L, "after_release": L + 4, "peak": L},
                 "step2": {"forward": L + 4, "after": L, "after_release": L + 4, "peak": L}}
    f["nanogpt"] = {"step1": {"forward": -pad, "after": L + Y, "after_release": L + Y + 4, "peak": L + Y},
                    "step2": {"forward": -pad + L + 4, "after": L + Y, "after_release": L + Y + 4, "peak": L + Y}}
    f["llama2c"] = {"step1": {"forward": -pad, "after": L + Y + 4, "after_release": L + Y + 8, "peak": L + Y + 4},
                    "step2": {"forward": -pad + L + 8, "after": L + Y + 4, "after_release": L + Y + 8,
                              "peak": L + Y + 4}}
    # chunked forward: hf's forward minus E (the loss runs outside the model's forward), plus its own labels
    # (input 8bs + 8b; hstack [b,s] + per-chunk label copies [b,s] for b > 1, against hf's padded [b,s+1] and
    # shift copy [b,s]), plus 0-dim scalars (checked to be within CHUNKED_SCALARS_MAX)
    f["chunked"] = {k: {"forward": -E + 8 * b * s + (0 if b > 1 else -8 * b * s)} for k in ("step1", "step2")}
    # chunked backward phase peak: the larger of
    #  * the cross-entropy part, 1.25 L instead of hf's 3 L (8 log_softmax chunks + one chunk's nll grad + one
    #    chunk's log_softmax grad; the chunk grads wait for the mm backward nodes, which run after every CE
    #    node), plus the inputs (8bs + 8b) and 7/8 of the per-chunk label copies (7bs, b > 1);
    #  * the lm_head weight grad summed over the 8 chunks out of place in the engine's input buffer: three
    #    [V, h] buffers and 6/8 of the chunk grads alive, 12Vh + 0.75 L instead of 3 L, plus the inputs.
    inputs = 8 * b * s + 8 * b
    ce = -(7 * L) // 4 + inputs + (7 * b * s if b > 1 else 0)
    wgrad = 12 * V * h - (9 * L) // 4 + inputs
    for k in ("step1", "step2"):
        f["chunked"][k].update({"backward_ce": ce, "backward_weight_grad": wgrad, "backward": max(ce, wgrad)})
    # hf itself: backward peak (third L-sized CE buffer) vs forward peak (E, padded and shifted labels alive)
    f["hf"] = {"backward_minus_forward": L - E - pad - 8 * b * s}
    return f


def check_formulas(by_loop, fam, cfg, b, s):
    f = vs_hf_formulas(fam, cfg, b, s)
    hf = by_loop["hf"]
    later = [p for p in S.PHASES if p != "forward"]
    for loop in ("deleted", "kept", "nanogpt", "llama2c"):
        r = by_loop[loop]
        for k in ("step1", "step2"):
            want = f[loop][k]
            got_fwd = r[k]["phase_peaks"]["forward"] - hf[k]["phase_peaks"]["forward"]
            assert got_fwd == want["forward"], (loop, k, "forward", got_fwd, want)
            for p in later:
                d = r[k]["phase_peaks"][p] - hf[k]["phase_peaks"][p]
                assert d == want["after"], (loop, k, p, d, want)
            for p in ("after_backward", "after_optimizer", "after_zero_grad", "after_release"):
                d = r[k][p] - hf[k][p]
                assert d == want.get(p, want["after"]), (loop, k, p, d, want)
            assert r[k]["peak_bytes"] - hf[k]["peak_bytes"] == want["peak"], (loop, k, want)
    r = by_loop["chunked"]
    for k in ("step1", "step2"):
        for p in ("forward", "backward"):
            eps = r[k]["phase_peaks"][p] - hf[k]["phase_peaks"][p] - f["chunked"][k][p]
            assert 0 <= eps <= CHUNKED_SCALARS_MAX, ("chunked", k, p, eps, f["chunked"][k])
            f["chunked"][k][p + "_scalars_measured"] = eps
        pp = hf[k]["phase_peaks"]
        assert pp["backward"] - pp["forward"] == f["hf"]["backward_minus_forward"], (k, pp, f["hf"])
    return f


def check_hf_against_step_oracle(r, fam, cfg, b, s, fixture):
    ref, _ = S.measure(fam, dict(cfg, loss_impl="pad"), b, s)
    for k in ("step1", "step2"):
        for f in STEP_FIELDS:
            assert r[k][f] == ref[k][f], ("hf vs step_oracle.measure", k, f, r[k][f], ref[k][f])
    assert r["param_bytes"] == ref["param_bytes"] and r["baseline_bytes"] == ref["baseline_bytes"]
    name = ref["name"]
    if fixture is not None and name in fixture:
        fx = fixture[name]
        for k in ("step1", "step2"):
            for f in STEP_FIELDS:
                assert r[k][f] == fx[k][f], ("hf vs step_memory.json", name, k, f, r[k][f], fx[k][f])
        return name
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-step-oracle-check", action="store_true",
                    help="skip re-running step_oracle.measure for the hf cases (the fixture check still runs)")
    args = ap.parse_args()
    S.selftest()
    fixture = None
    if os.path.exists(FIXTURE_STEP_MEMORY):
        with open(FIXTURE_STEP_MEMORY) as f:
            fixture = {c["name"]: c for c in json.load(f)["cases"] if "name" in c}
    cases = []
    checked_fixture = []
    for fam, cfg, b, s in build_cases():
        key = case_key(fam, cfg, b, s)
        by_loop = {}
        for loop_name in LOOPS:
            r = measure(loop_name, fam, cfg, b, s)
            r["case"] = key
            by_loop[loop_name] = r
        hf = by_loop["hf"]
        if not args.no_step_oracle_check:
            nm = check_hf_against_step_oracle(hf, fam, cfg, b, s, fixture)
            if nm:
                checked_fixture.append(nm)
        formulas = check_formulas(by_loop, fam, cfg, b, s)
        for loop_name in LOOPS:
            r = by_loop[loop_name]
            if loop_name in formulas:
                r["vs_hf_formula" if loop_name != "hf" else "formula"] = formulas[loop_name]
            r["formula_terms"] = {"L": formulas["L"], "E": formulas["E"]}
            r["vs_hf"] = {
                k: {"peak_bytes": r[k]["peak_bytes"] - hf[k]["peak_bytes"],
                    "phase_peaks": {p: r[k]["phase_peaks"][p] - hf[k]["phase_peaks"][p] for p in S.PHASES},
                    "after_forward": r[k]["after_forward"] - hf[k]["after_forward"]}
                for k in ("step1", "step2")}
            r["vs_hf"]["input_bytes"] = r["input_bytes"] - hf["input_bytes"]
            cases.append(r)
            s1, s2 = r["step1"], r["step2"]
            print(f"{key:<32} {loop_name:<8} step1 peak={s1['peak_bytes']:>10} ({s1['peak_phase']}/{s1['peak_op']}) "
                  f"d={r['vs_hf']['step1']['peak_bytes']:>9}  step2 peak={s2['peak_bytes']:>10} "
                  f"({s2['peak_phase']}/{s2['peak_op']}) d={r['vs_hf']['step2']['peak_bytes']:>9}", file=sys.stderr)
    out = {"generator": "oracle/loops_oracle.py", "torch_version": torch.__version__, "phases": S.PHASES,
           "num_threads": torch.get_num_threads(), "loops": LOOPS, "num_output_chunks": NUM_OUTPUT_CHUNKS,
           "gradient_accumulation_steps": GRAD_ACCUM,
           "optimizer": {"name": "adamw", "foreach": False, "lr": S.LR, "weight_decay": 0.01},
           "citations": CITATIONS, "cases": cases,
           "hf_equals_step_memory_cases": sorted(checked_fixture)}
    if args.out:
        A.write_fixture(args.out, out)


if __name__ == "__main__":
    main()
