"""``transformer``: a small Transformer encoder over seeded random token ids.

Token embedding plus a fixed sinusoidal positional encoding (Vaswani et al. 2017), a stack of
``nn.TransformerEncoderLayer`` (pre-norm, GELU, batch first), a final LayerNorm and a linear
head over the vocabulary; cross-entropy against a target token at every position. Dropout is
off: its random masks differ between backends, so no two could compute the same step and the
parity check would have nothing to compare. Throughput counts tokens (batch x ``seq_len``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from .. import hookimpl
from .base import check_positive


class TokenEncoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, ff: int, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        position = torch.arange(seq_len).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(seq_len, d_model)
        pe[:, 0::2] = torch.sin(position * frequency)
        pe[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
        self.positions: torch.Tensor
        self.register_buffer("positions", pe)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        # enable_nested_tensor only matters for padded batches in inference; off avoids its warning.
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * self.scale + self.positions[: tokens.shape[1]]
        return self.head(self.encoder(x))


class TransformerWorkload:
    name = "transformer"
    sample_unit = "sequence"
    throughput_unit = "token"
    description = "Transformer encoder over token ids (embedding, sinusoidal positions, pre-norm layers), cross-entropy"
    options = {"seq_len": 64, "vocab": 1000, "d_model": 128, "heads": 4, "layers": 2, "ff": 512}

    def check_options(self, options: Mapping[str, Any]) -> None:
        check_positive(options, self.options)
        if options["d_model"] % options["heads"]:
            raise ValueError(f"d_model: must be a multiple of heads ({options['heads']}), got {options['d_model']}")
        if options["d_model"] % 2:
            raise ValueError(f"d_model: must be even (sine and cosine positions), got {options['d_model']}")

    def units_per_sample(self, options: Mapping[str, Any]) -> int:
        return int(options["seq_len"])

    def build_model(self, options: Mapping[str, Any]) -> nn.Module:
        return TokenEncoder(options["vocab"], options["d_model"], options["heads"], options["layers"], options["ff"],
                            options["seq_len"])

    def make_batch(self, options: Mapping[str, Any], n: int, generator: torch.Generator,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` sequences of ``seq_len`` uniform token ids, and a uniform target token per position."""
        shape = (n, options["seq_len"])
        tokens = torch.randint(0, options["vocab"], shape, generator=generator, device=device)
        targets = torch.randint(0, options["vocab"], shape, generator=generator, device=device)
        return tokens, targets

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.flatten(0, 1), targets.flatten())


@hookimpl
def cnncompare_register_workloads(register):
    register(TransformerWorkload())
