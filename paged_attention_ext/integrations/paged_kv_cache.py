"""A paged KV pool for a whole model, its block allocator, and the metadata of one forward step.

vLLM's scheme in plain torch (no model framework here):
  - every layer owns key_cache [num_blocks, num_kv_heads, head_size // x, block_size, x] and
    value_cache [num_blocks, num_kv_heads, head_size, block_size]; the layers share block ids, so
    one block table per sequence serves all of them;
  - blocks come from a free list, shuffled when a seed is given, so a sequence's blocks are
    non-contiguous and interleaved with other sequences' (as in a server that has run a while);
  - a step that adds n tokens to a sequence first reserves slots seq_len .. seq_len + n - 1
    (allocating blocks on demand); every layer then writes its K/V there with reshape_and_cache
    and attends over seq_len + n tokens (the new ones included).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ..api import allocate_kv_cache, num_partitions

PAD_BLOCK = -1  # block_tables entries past a sequence's used blocks: garbage the ops must not read


@dataclass
class StepMetadata:
    """What every layer's attention needs for one forward step (shared by all layers)."""

    cache: "PagedKVCache"
    slot_mapping: torch.Tensor  # int64 [num_new_tokens], sequence-major like the model's tokens
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], PAD_BLOCK past used blocks
    seq_lens: torch.Tensor  # int32 [num_seqs]: lengths after this step (new tokens included)
    max_seq_len: int  # max(seq_lens), kept on the host so no op call needs a device sync
    query_lens: List[int]  # new tokens of each sequence in this step
    alibi_slopes: Optional[torch.Tensor] = None  # float32 [num_heads] or None
    version: str = "auto"  # "v1", "v2" or "auto" (api.choose_version)
    _v2_scratch: Dict[tuple, tuple] = field(default_factory=dict, repr=False)

    def v2_scratch(self, num_heads: int, head_size: int, dtype: torch.dtype):
        """(exp_sums, max_logits, tmp_out) for v2, allocated once per step and reused by every
        layer (they are only read inside the op):
        exp_sums, max_logits float32 [num_seqs, num_heads, P]; tmp_out [num_seqs, num_heads, P,
        head_size] in the query dtype; P = ceil(max_seq_len / 512)."""
        key = (num_heads, head_size, dtype)
        if key not in self._v2_scratch:
            num_seqs, parts = len(self.query_lens), num_partitions(self.max_seq_len)
            device = self.seq_lens.device
            exp_sums = torch.empty(num_seqs, num_heads, parts, dtype=torch.float32, device=device)
            max_logits = torch.empty_like(exp_sums)
            tmp_out = torch.empty(num_seqs, num_heads, parts, head_size, dtype=dtype,
                                  device=device)
            self._v2_scratch[key] = (exp_sums, max_logits, tmp_out)
        return self._v2_scratch[key]


class PagedKVCache:
    """Paged K/V pools for `num_layers` layers plus the block tables of the live sequences.

    poison=True fills the pools with NaN so that a kernel reading a slot it must not read
    (past seq_len, an unreferenced block) shows up as NaN in the output.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_size: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float16,
                 device="cpu", seed: Optional[int] = None, poison: bool = False):
        self.num_kv_heads, self.head_size = num_kv_heads, head_size
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype, self.device = dtype, torch.device(device)
        self.layers = [allocate_kv_cache(num_blocks, num_kv_heads, head_size, block_size, dtype,
                                         device) for _ in range(num_layers)]
        if poison:
            for key_cache, value_cache in self.layers:
                key_cache.fill_(float("nan"))
                value_cache.fill_(float("nan"))
        if seed is None:
            order = list(range(num_blocks))
        else:
            generator = torch.Generator().manual_seed(seed)
            order = torch.randperm(num_blocks, generator=generator).tolist()
        self._free = order[::-1]  # pop() hands out order[0], order[1], ...
        self._tables: Dict[int, List[int]] = {}
        self._lens: Dict[int, int] = {}
        self._next_id = 0

    # ---- sequences ----

    def add_sequence(self) -> int:
        """A new empty sequence; returns its id."""
        seq_id, self._next_id = self._next_id, self._next_id + 1
        self._tables[seq_id], self._lens[seq_id] = [], 0
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        """Return the sequence's blocks to the free list."""
        self._free.extend(reversed(self._tables.pop(seq_id)))
        del self._lens[seq_id]

    def seq_len(self, seq_id: int) -> int:
        return self._lens[seq_id]

    def block_table(self, seq_id: int) -> List[int]:
        return list(self._tables[seq_id])

    def num_free_blocks(self) -> int:
        return len(self._free)

    # ---- one forward step ----

    def _reserve(self, seq_id: int, num_new: int) -> List[int]:
        """Slots for tokens seq_len .. seq_len + num_new - 1, allocating blocks as needed."""
        table, start = self._tables[seq_id], self._lens[seq_id]
        end = start + num_new
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self._free):
            raise RuntimeError(f"PagedKVCache: out of blocks (sequence {seq_id} needs {needed} "
                               f"more, {len(self._free)} free of {self.num_blocks})")
        table.extend(self._free.pop() for _ in range(needed))
        self._lens[seq_id] = end
        return [table[t // self.block_size] * self.block_size + t % self.block_size
                for t in range(start, end)]

    def prepare_step(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int], *,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     version: str = "auto") -> StepMetadata:
        """Reserve slots for `num_new_tokens[i]` new tokens of sequence `seq_ids[i]` and return
        the step's metadata (lengths include the new tokens)."""
        slots: List[int] = []
        for seq_id, num_new in zip(seq_ids, num_new_tokens):
            slots.extend(self._reserve(seq_id, num_new))
        tables = [self._tables[s] for s in seq_ids]
        width = max(1, max(len(t) for t in tables))
        padded = [t + [PAD_BLOCK] * (width - len(t)) for t in tables]
        lens = [self._lens[s] for s in seq_ids]
        return StepMetadata(
            cache=self,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            max_seq_len=max(lens),
            query_lens=list(num_new_tokens),
            alibi_slopes=alibi_slopes,
            version=version)
