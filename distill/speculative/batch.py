"""Prompts of different lengths as one batch: left-padded, so every row's last prompt token sits in
the last column and generation continues all rows from the same position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def left_pad(prompts: Sequence[Sequence[int]], pad: int, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`prompts` (lists of ids) as one [rows, longest] batch: `pad` on the left of the shorter rows,
    and the attention mask (0 on the padding, 1 on the prompt)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask
