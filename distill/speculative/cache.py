"""KV caches in which every row of a batch keeps its own accepted length.

Each round every row writes the same k+1 slots (rectangular tensors), then keeps only the first
n_b + 1 of them: the slots a row rejected become holes that its `valid` mask hides from later
queries, and the slots no row kept are cut off the end. Positions are given per row, so a hole
never shifts a later token's position. `compact` squeezes the holes out (each row's kept slots
right-aligned), which a loop calls when holes would fill the cache.

`DynamicSide` grows transformers' `DynamicCache` and passes a 2-D mask only when some slot is a
hole or padding (else the causal fast path runs); `StaticSide` writes a preallocated `SlotCache`
at slots named by a device-side length, so its forward can be captured in a CUDA graph."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache


class SlotCache(StaticCache):
    """transformers' StaticCache written at `slots` (set by the loop before each forward) instead of
    at a length of its own, so all layers share one device-side length that graphs can move."""

    slots: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        layer.keys.index_copy_(2, self.slots, key_states)
        layer.values.index_copy_(2, self.slots, value_states)
        return layer.keys, layer.values


class _Side:
    """One model and its cache; `valid` [B, capacity] marks the slots that hold kept tokens."""

    length: int | torch.Tensor  # slots written so far, the same for every row

    def __init__(self, model: PreTrainedModel, batch: int, capacity: int, rows: int | None, context: int):
        param = next(model.parameters())
        self.model, self.rows, self.context = model, rows, context
        self.valid = torch.ones(batch, capacity, dtype=torch.bool, device=param.device)
        self.columns = torch.arange(capacity, device=param.device)  # slot indices, for the masks
        self.size = 0  # host-side copy of `length`, kept by the loop (a graph's replay moves only `length`)

    def _inputs(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rows is not None:  # ids past a smaller draft's embedding (padding rows): feed 0 instead
            ids = ids.masked_fill(ids >= self.rows, 0)
        return ids, positions.clamp(0, self.context - 1)

    def reject(self, kept: torch.Tensor, k: int) -> None:
        """After a round that wrote k+1 slots, hide those past each row's first kept[b] + 1."""
        columns = self.columns[None]
        self.valid &= ~((columns >= self.length - k + kept[:, None]) & (columns < self.length))

    def shrink(self, drop: torch.Tensor) -> None:
        """Cut the last `drop` slots (those no row kept) off the end; slots past the end stay valid,
        ready to be written."""
        raise NotImplementedError

    def compact(self, keep: int) -> None:
        """Squeeze the holes out: each row's valid slots right-aligned into the first `keep` slots
        (`keep` at least every live row's valid count)."""
        used = self.valid[:, : self.size]
        order = torch.sort(used.int(), dim=1, stable=True).indices[:, self.size - keep :]
        for layer in self.cache.layers:
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            self._store(layer, layer.keys[:, :, : self.size].gather(2, idx), layer.values[:, :, : self.size].gather(2, idx))
        valid = used.gather(1, order)
        self.valid[:, :keep] = valid
        self.valid[:, keep:] = True
        self.size = keep
        self._compacted(keep, bool(valid.all()))

    def _store(self, layer, keys: torch.Tensor, values: torch.Tensor) -> None:
        raise NotImplementedError

    def _compacted(self, length: int, no_holes: bool) -> None:
        raise NotImplementedError


class DynamicSide(_Side):
    """A side on transformers' DynamicCache; `length` is a Python int."""

    def __init__(self, model: PreTrainedModel, batch: int, capacity: int, rows: int | None = None, context: int = 1 << 30):
        super().__init__(model, batch, capacity, rows, context)
        self.cache, self.length, self.holes = DynamicCache(config=model.config), 0, False

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor:
        """Logits of the last `keep` positions after appending `ids` [B, q] at `positions` [B, q]."""
        end = self.length + ids.shape[1]
        if end > self.valid.shape[1]:
            self.valid = torch.cat([self.valid, torch.ones_like(self.valid)], 1)
            self.columns = torch.arange(self.valid.shape[1], device=self.valid.device)
        ids, positions = self._inputs(ids, positions)
        mask = self.valid[:, :end].long() if self.holes else None
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.length = end
        return out.logits

    def reject(self, kept: torch.Tensor, k: int) -> None:
        if kept.shape[0] == 1:  # one row keeps exactly what `shrink` leaves: no holes to mark
            return
        super().reject(kept, k)
        self.holes = self.holes or bool((kept != kept.max()).any())

    def shrink(self, drop: torch.Tensor) -> None:
        drop = int(drop)
        if drop:
            self.cache.crop(-drop)
            self.valid[:, self.length - drop : self.length] = True
            self.length -= drop

    def _store(self, layer, keys: torch.Tensor, values: torch.Tensor) -> None:
        layer.keys, layer.values = keys, values

    def _compacted(self, length: int, no_holes: bool) -> None:
        self.length, self.holes = length, not no_holes


class StaticSide(_Side):
    """A side on a preallocated SlotCache; `length` is a device scalar, and `forward` reads and
    writes only tensors of fixed address, so it can run inside a CUDA graph."""

    def __init__(self, model: PreTrainedModel, batch: int, capacity: int, rows: int | None = None, context: int = 1 << 30):
        super().__init__(model, batch, capacity, rows, context)
        cfg = model.config.get_text_config()
        param = next(model.parameters())
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cache = SlotCache(config=cfg, max_cache_len=capacity)
        self.cache.early_initialization(batch, cfg.num_key_value_heads, head_dim, param.dtype, param.device)
        self.length = torch.zeros((), dtype=torch.long, device=param.device)
        self.masked = torch.finfo(param.dtype).min

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor:
        """Logits of the last `keep` positions after writing `ids` [B, q] at the next q slots."""
        slots = self.length + torch.arange(ids.shape[1], device=ids.device)
        self.cache.slots = slots
        # A query sees earlier slots that hold kept tokens, and always itself (so no row of the
        # mask is empty for left-padding queries, which would turn into NaNs).
        seen = (self.columns[None, None] <= slots[None, :, None]) & self.valid[:, None]
        seen |= self.columns[None, None] == slots[None, :, None]
        mask = torch.zeros(seen.shape, dtype=self.cache.layers[0].keys.dtype, device=ids.device)
        mask.masked_fill_(~seen, self.masked)
        ids, positions = self._inputs(ids, positions)
        out = self.model(
            input_ids=ids, attention_mask={"full_attention": mask[:, None]}, position_ids=positions, cache=self.cache, use_cache=True, logits_to_keep=keep
        )
        self.length += ids.shape[1]
        return out.logits

    def shrink(self, drop: torch.Tensor) -> None:
        self.length -= drop
        self.valid |= self.columns[None] >= self.length

    def _store(self, layer, keys: torch.Tensor, values: torch.Tensor) -> None:
        layer.keys[:, :, : keys.shape[2]].copy_(keys)
        layer.values[:, :, : values.shape[2]].copy_(values)

    def _compacted(self, length: int, no_holes: bool) -> None:
        self.length.fill_(length)
