"""The GPT-2 model, all of it in this one file.

Token embedding + learned position embedding, then L pre-LayerNorm blocks of masked
multi-head self-attention and a GELU MLP, a final LayerNorm, and an unembedding tied to the
token embedding: P = softmax(LN(h) W_e^T). Parameter names follow GPT-2 (and nanoGPT), so
released weights map onto it one to one.

Shapes in comments: B batch, T new tokens, S keys attended (cached + new), C n_embd,
nh heads, hs head size (C // nh), V vocabulary.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptcli.config import ModelConfig

IGNORE_INDEX = -1  # targets with this value add nothing to the loss (padding, SFT prompts)


def not_cudnn() -> list[SDPBackend]:
    """The attention kernels enabled now but cuDNN's, which builds a graph for every new shape
    (tens to hundreds of ms on a GPU, then cached): a KV cache one slot longer at every step
    would build one every token (math where nothing else is left). In a graph being compiled,
    where the flags cannot be read, every kernel but cuDNN's."""
    kernels = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    kept = list(kernels)
    if not torch.compiler.is_compiling():
        cuda = torch.backends.cuda
        on = (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled())
        kept = [k for k, enabled in zip(kernels, on, strict=True) if enabled] or [SDPBackend.MATH]
    return [*kept, SDPBackend.OVERRIDEABLE]


class KVCache:
    """Keys and values of every position seen so far, preallocated for `max_len` tokens.

    Incremental decoding feeds only the new tokens; each attention layer appends its keys
    and values here and attends over everything stored. `key_mask` (B, max_len) marks real
    tokens when the prompt batch was padded, and stays None otherwise.

    static: every step has the same shapes, for a compiled decoding step that never
    recompiles (and CUDA graphs): the position is a tensor (`pos_t`), the new keys are
    written at it, and attention always spans all max_len slots, those not yet written
    masked out. Python's `pos` is then not kept: the caller counts. Its tensors are marked
    as static addresses, which the step writes in place: CUDA graphs replay such writes,
    and skip (running the compiled step without graphs) any function that writes to an
    input not so marked.
    """

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        static: bool = False,
    ) -> None:
        # each slot's heads side by side, so that the slots a row has written are one stretch of
        # memory however many it has room for: the CPU decoding step reads a row's keys and
        # values from start to end (gptcli/infer/decode.c, attend)
        shape = (config.n_layer, batch_size, max_len, config.n_head, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, B, max_len, nh, hs)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.key_mask: torch.Tensor | None = None  # (B, max_len) bool
        # (B, max_len) int32 or None: which row of k and v holds each slot of each row, where
        # a reorder has not moved them (see reorder); None: every row holds its own
        self.sources: torch.Tensor | None = None
        self.max_len = max_len
        self.pos = 0  # tokens stored
        self.resets = 0  # times emptied to be filled again (reset): each a new generation
        self.static = static
        self.pos_t = torch.zeros((), dtype=torch.long, device=device)  # tokens stored (static)
        self.slots = torch.arange(max_len, device=device)
        if static:
            self._mark_static()

    def _mark_static(self) -> None:
        # unguarded: a new cache (the next generate call's) must not recompile the step
        for t in (self.k, self.v, self.pos_t):
            torch._dynamo.mark_static_address(t, guard=False)

    def reset(self) -> None:
        """Empty, to be filled again from position 0 (the same buffers)."""
        self.pos = 0
        self.resets += 1
        self.pos_t.zero_()
        self.sources = None

    def static_positions(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Static cache: the positions (T,) of T new tokens, and which slots each may see,
        (1, 1, T, max_len): those written before it, and itself."""
        pos = self.pos_t + self.slots[:T]
        return pos, (self.slots[None, :] <= pos[:, None])[None, None]

    @property
    def batch_size(self) -> int:
        return self.k.size(1)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new (B, nh, T, hs) keys/values of `layer`; return all (B, nh, S, hs)
        (static: all max_len slots)."""
        self.settle()
        if self.static:
            at = self.pos_t + self.slots[: k.size(2)]
            self.k[layer].index_copy_(1, at, k.transpose(1, 2))
            self.v[layer].index_copy_(1, at, v.transpose(1, 2))
            return self.k[layer].transpose(1, 2), self.v[layer].transpose(1, 2)
        end = self.pos + k.size(2)
        self.k[layer, :, self.pos : end] = k.transpose(1, 2)
        self.v[layer, :, self.pos : end] = v.transpose(1, 2)
        return self.k[layer, :, :end].transpose(1, 2), self.v[layer, :, :end].transpose(1, 2)

    def set_key_mask(self, valid: torch.Tensor) -> None:
        """Remember which of the first S positions hold real tokens; valid: (B, S)."""
        if self.key_mask is None:
            self.key_mask = torch.ones(self.batch_size, self.max_len, dtype=torch.bool, device=valid.device)
        self.key_mask[:, : valid.size(1)] = valid

    def reorder(self, index: torch.Tensor) -> None:
        """Keep the rows `index` of the batch, in that order (beam search survivors).

        With as many rows as before, on the CPU and not static, nothing is copied: `sources`
        records which row holds each slot (the C decoding step reads them there; the
        slots still to be written stay each row's own), and `settle` moves them the first
        time anything else reads the cache. Otherwise in place where the size stays (only
        the rows that change, only the slots written so far: a static cache keeps its
        buffers, which a compiled step holds on to), or into new buffers."""
        same = index.numel() == self.batch_size
        if self.key_mask is not None:
            moved = self.key_mask.index_select(0, index)
            self.key_mask = self.key_mask.copy_(moved) if same else moved
        if same and not self.static and self.k.device.type == "cpu":
            if self.sources is None:
                rows = torch.arange(self.batch_size, dtype=torch.int32)
                self.sources = rows[:, None].expand(-1, self.max_len).contiguous()
            self.sources[:, : self.pos] = self.sources[index, : self.pos]
            return
        self.settle()
        if same:
            self._move_rows(index.tolist())
            return
        self.k = self.k.index_select(1, index)
        self.v = self.v.index_select(1, index)
        if self.static:  # new buffers, of the new batch size
            self._mark_static()

    def settle(self) -> None:
        """Move every slot into its own row, as `sources` says (see reorder): k and v then
        hold each row's keys and values where the model's own attention reads them."""
        if self.sources is None:
            return
        src, self.sources = self.sources[:, : self.pos], None
        if src.size(1) == 0:
            return
        if bool((src == src[:, :1]).all()):  # each row's slots all in one row: whole rows move
            self._move_rows(src[:, 0].tolist())
            return
        slots = torch.arange(src.size(1))
        for t in (self.k, self.v):  # (L, B, S, nh, hs) gathered, then put back in place
            t[:, :, : src.size(1)] = t[:, src.long(), slots]

    def _move_rows(self, index: list[int]) -> None:
        """Row r takes row index[r]'s slots written so far, in place: only the rows that
        change are copied, one by one (faster than one indexed copy of them all), those read
        after being written over from a copy."""
        moved = [(dst, src) for dst, src in enumerate(index) if src != dst]
        if not moved:
            return
        end = self.max_len if self.static else self.pos  # a static cache's position is a tensor
        rows = {src: (self.k[:, src, :end], self.v[:, src, :end]) for _, src in moved}
        for src in {dst for dst, _ in moved} & rows.keys():  # read before they are written over
            rows[src] = (rows[src][0].clone(), rows[src][1].clone())
        for dst, src in moved:
            self.k[:, dst, :end].copy_(rows[src][0])
            self.v[:, dst, :end].copy_(rows[src][1])

    def expand(self, n: int) -> None:
        """Repeat every row n times: prefill a prompt once, then decode n continuations.

        On the CPU (not static, no padding mask) row b's slots written so far are copied once,
        into row b * n, and the other n - 1 copies are recorded in `sources` (see reorder):
        16 samples of 200 tokens from GPT-2 124M copied 127 MB (70 ms) before their first step."""
        B = self.batch_size
        if n == 1:
            return
        moved_as_stored = self.static or self.k.device.type != "cpu" or self.key_mask is not None
        if moved_as_stored or self.sources is not None:
            self.reorder(torch.arange(B, device=self.k.device).repeat_interleave(n))
            return
        shape = (self.k.size(0), B * n, *self.k.shape[2:])
        k, v = torch.empty(shape, dtype=self.k.dtype), torch.empty(shape, dtype=self.v.dtype)
        k[:, ::n, : self.pos] = self.k[:, :, : self.pos]  # (the slots past pos are written before read)
        v[:, ::n, : self.pos] = self.v[:, :, : self.pos]
        self.k, self.v = k, v
        rows = torch.arange(B * n, dtype=torch.int32)
        self.sources = rows[:, None].expand(-1, self.max_len).contiguous()
        self.sources[:, : self.pos] = (rows // n * n)[:, None]


class Probe:
    """Looks inside one forward pass (GPT.hidden_states(..., probe=...)): the residual
    stream after the embeddings and after every block, and every layer's attention
    weights. Subclass it and override what you need; the base class keeps nothing.

    While a probe that wants attention is attached, attention is computed step by step
    (softmax(QK^T / sqrt(d_head)) written out) so that its weights exist to be seen; a probe
    with wants_attention = False leaves the forward pass exactly as it is without one."""

    wants_attention = True

    def residual(self, layer: int, x: torch.Tensor) -> None:
        """x (B, T, C): layer 0 is the embeddings, layer l the output of block l (before ln_f)."""

    def attention(self, layer: int, weights: torch.Tensor) -> None:
        """weights (B, nh, T, S): how each query of layer `layer` spread its attention over the keys."""


class CausalSelfAttention(nn.Module):
    """Masked multi-head self-attention: position t attends to positions <= t only."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # W_q|W_k|W_v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_o
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.layer_idx = layer_idx
        self.explicit = False  # compute softmax(QK^T/sqrt(d)) @ V step by step (see GPT.set_attention)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        kv_cache: KVCache | None = None,
        probe: Probe | None = None,
    ) -> torch.Tensor:
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_idx, k, v)  # (B, nh, S, hs)

        y = self.attend(q, k, v, mask, probe)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        probe: Probe | None = None,
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(hs)) v for q (B, nh, T, hs) and k, v (B, nh, S, hs), with
        mask (broadcastable to (B, nh, T, S), True = may attend) or None (causal); the
        weights go to the probe, if one is attached."""
        T, S, hs = q.size(2), k.size(2), q.size(3)
        if (probe is None or not probe.wants_attention) and not self.explicit:
            # fused kernel (flash / memory-efficient where available); mask=None means the
            # plain causal case with T == S, or a single new token that sees everything
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=self.dropout if self.training else 0.0,
                is_causal=mask is None and T > 1,
            )
        # the same computation written out, so the weights can be handed back
        if mask is None:
            mask = causal_mask(T, S, q.device)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        if probe is not None and probe.wants_attention:
            probe.attention(self.layer_idx, att)
        return self.attn_dropout(att) @ v  # (B, nh, T, S) x (B, nh, S, hs) -> (B, nh, T, hs)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    Under torch.compile it is written as x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), the
    same function (tanh(z) = 2 sigmoid(2z) - 1), which compiles to a faster kernel."""
    if torch.compiler.is_compiling():
        return x * torch.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(C, 4C), GELU (tanh approximation, as GPT-2), Linear(4C, C)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + MHA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        kv_cache: KVCache | None = None,
        probe: Probe | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, kv_cache, probe)
        x = x + self.mlp(self.ln_2(x))
        return x


def causal_mask(T: int, S: int, device: torch.device | str) -> torch.Tensor:
    """(T, S) bool: query i (absolute position S - T + i) may attend to keys j <= S - T + i."""
    past = S - T
    return torch.arange(S, device=device)[None, :] <= (past + torch.arange(T, device=device))[:, None]


def _embedding(n: int, dim: int) -> nn.Embedding:
    """nn.Embedding; on the meta device (GPT.from_weights lays a model out there) without its
    random draw, which has nothing to fill there and whose meta kernel imports Dynamo: a
    second of every load."""
    if torch.empty(0).is_meta:
        return nn.Embedding(n, dim, _weight=torch.empty(n, dim))
    return nn.Embedding(n, dim)


class GPT(nn.Module):
    """Decoder-only transformer language model with GPT-2's architecture and init."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        if config.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size must be set (it comes from the tokenizer)")
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=_embedding(config.vocab_size, config.n_embd),  # W_e
                wpe=_embedding(config.block_size, config.n_embd),  # W_p
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # unembedding tied to W_e
        # GPT-1's finetuning head: class scores from the last token's final hidden state
        self.classifier = nn.Linear(config.n_embd, config.n_classes) if config.n_classes else None

        # GPT-2 init: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2L)
        if self.lm_head.weight.is_meta:
            return  # laid out for from_weights: nothing to draw (see _embedding)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @classmethod
    def from_weights(cls, config: ModelConfig, state: dict[str, torch.Tensor]) -> GPT:
        """A GPT holding these weights (fp32), built without first drawing random ones: the
        model is laid out on the meta device and takes the tensors as they are (a GPT-2 124M
        loads in a fraction of the time its initialization takes). Weights the state lacks
        are initialized as usual."""
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(state, strict=False, assign=True)
        if "lm_head.weight" not in state:  # the tie is a shared Parameter: assign replaced one side
            model.lm_head.weight = model.transformer.wte.weight
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):  # some were not in the state
            filled = cls(config)
            filled.load_state_dict(state, strict=False)
            return filled
        return model.float()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def crop_block_size(self, block_size: int) -> None:
        """Shorten the context to block_size positions (as nanoGPT does): the position
        embeddings beyond it are dropped; a model can be finetuned on shorter texts so."""
        if not 1 <= block_size <= self.config.block_size:
            raise ValueError(f"block_size {block_size}: must be between 1 and {self.config.block_size}")
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())

    def add_token_rows(self, ids: Sequence[int]) -> None:
        """Make ids (new tokens, such as a chat template's) rows of the tied embedding, growing
        it if they lie past its end, each set to the mean embedding of the tokens before the
        first of them: an input the model has seen the like of, and an output neither
        favoured nor ruled out. The other tokens' rows, and so their logits, stay as they were."""
        w = self.lm_head.weight  # (V, C), W_e
        first, vocab = min(ids), max(w.size(0), max(ids) + 1)
        with torch.no_grad():
            grown = torch.empty(vocab, w.size(1), dtype=w.dtype, device=w.device)
            grown[: w.size(0)] = w
            grown[list(ids)] = w[:first].float().mean(0).to(w.dtype)
        weight = nn.Parameter(grown, requires_grad=w.requires_grad)
        self.lm_head.weight = self.transformer.wte.weight = weight
        self.lm_head.out_features = self.transformer.wte.num_embeddings = vocab
        self.config.vocab_size = vocab

    def set_classifier(self, n_classes: int) -> None:
        """A new classification head of n_classes (none for 0), on the model's device."""
        self.config.n_classes = n_classes
        device = self.lm_head.weight.device
        self.classifier = nn.Linear(self.config.n_embd, n_classes, device=device) if n_classes else None

    def set_dropout(self, p: float) -> None:
        """Use dropout probability p everywhere (a finetuning run may pick its own)."""
        self.config.dropout = p
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
            elif isinstance(m, CausalSelfAttention):
                m.dropout = p

    def set_attention(self, kind: str) -> None:
        """ "sdpa": F.scaled_dot_product_attention (flash kernels on GPUs, the default), or
        "explicit": the same maths as separate matmuls and a softmax, which bf16 CPUs run
        faster than their fused kernel."""
        if kind not in ("sdpa", "explicit"):
            raise ValueError(f"attention kind {kind!r}: use sdpa or explicit")
        for block in self.transformer.h:
            block.attn.explicit = kind == "explicit"

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings excluded by default (token ones are tied)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), as in the PaLM paper's appendix B:
        6N, of which 2N for the forward pass, 2N for the gradient of the activations and 2N
        for the gradient of the weights, which frozen weights (LoRA's base) do not take."""
        cfg = self.config
        T = seq_len or cfg.block_size
        n = self.num_params()
        trained = min(n, sum(p.numel() for p in self.parameters() if p.requires_grad))
        return 4 * n + 2 * trained + 12 * cfg.n_layer * cfg.n_embd * T

    def hidden_states(
        self,
        idx: torch.Tensor,
        *,
        kv_cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        probe: Probe | None = None,
    ) -> torch.Tensor:
        """Final-LayerNorm hidden states (B, T, C) of the tokens idx (B, T).

        kv_cache: continue after the positions it holds, and store the new ones.
        attention_mask: (B, T), 0 where the batch is padded (left or right); padded
            positions are never attended to and do not advance the positions of later tokens.
        probe: sees the residual stream and the attention weights of every layer (see Probe).
        """
        B, T = idx.size()
        if kv_cache is not None and kv_cache.static:  # same shapes every step: no Python position
            if attention_mask is not None or kv_cache.key_mask is not None:
                raise ValueError("a static KV cache takes unpadded batches")
            pos, mask = kv_cache.static_positions(T)
        else:
            past = kv_cache.pos if kv_cache is not None else 0
            if kv_cache is not None and past + T > kv_cache.max_len:
                raise ValueError(f"KV cache holds {kv_cache.max_len} tokens, asked for {past + T}")
            if past + T > self.config.block_size:
                block = self.config.block_size
                raise ValueError(f"{past + T} positions exceed the model's block_size {block}")
            pos, mask = self._positions_and_mask(B, T, past, idx.device, kv_cache, attention_mask)

        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        if probe is not None:
            probe.residual(0, x)
        # a shape new at every call (a cache that grows, a prompt read into one) leaves cuDNN's
        # attention out; the compiled step over a static cache (one shape) keeps it. (The flags
        # are the process's: one thread decodes, in every verb.)
        new_shapes = kv_cache is not None and (not kv_cache.static or T > 1)
        with sdpa_kernel(not_cudnn()) if new_shapes else contextlib.nullcontext():
            for i, block in enumerate(self.transformer.h):
                x = block(x, mask, kv_cache, probe)
                if probe is not None:
                    probe.residual(i + 1, x)
        if kv_cache is not None and kv_cache.static:
            kv_cache.pos_t += T
        elif kv_cache is not None:
            kv_cache.pos += T
        return self.transformer.ln_f(x)

    def _positions_and_mask(
        self,
        B: int,
        T: int,
        past: int,
        device: torch.device,
        kv_cache: KVCache | None,
        attention_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Position ids (T,) or (B, T), and the attention mask (None, or bool broadcastable
        to (B, nh, T, S)); None means plain causal with T == S, or one query seeing all keys."""
        padded = attention_mask is not None or (kv_cache is not None and kv_cache.key_mask is not None)
        if not padded:
            pos = torch.arange(past, past + T, device=device)  # (T,)
            mask = None if past == 0 or T == 1 else causal_mask(T, past + T, device)
            return pos, mask

        S = past + T
        new_valid = (
            attention_mask.to(device=device, dtype=torch.bool)
            if attention_mask is not None
            else torch.ones(B, T, dtype=torch.bool, device=device)
        )
        if kv_cache is not None and kv_cache.key_mask is not None:
            valid = torch.cat([kv_cache.key_mask[:, :past], new_valid], dim=1)  # (B, S)
        else:
            valid = torch.cat([torch.ones(B, past, dtype=torch.bool, device=device), new_valid], 1)
        if kv_cache is not None:
            kv_cache.set_key_mask(valid)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)[:, past:]  # (B, T): real tokens before
        causal = causal_mask(T, S, device)  # (T, S)
        itself = torch.arange(S, device=device)[None, :] == torch.arange(past, S, device=device)[:, None]
        # a padded query would otherwise see no key at all (NaN softmax): let it see itself
        mask = (causal[None] & valid[:, None, :]) | itself[None]  # (B, T, S)
        return pos, mask[:, None]  # (B, 1, T, S)

    def next_logits(self, idx: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The logits (B, V) of the token after each row of idx (B, T): what decoding asks
        the model, one position at a time (kwargs as hidden_states takes them)."""
        return self.lm_head(self.hidden_states(idx, **kwargs)[:, -1])

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) for idx (B, T); with targets (B, T), also the mean next-token NLL."""
        h = self.hidden_states(idx, kv_cache=kv_cache, attention_mask=attention_mask)
        logits = self.lm_head(h)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX
            )
        return logits, loss
