"""Fast, sync-free PyTorch paged attention (v1 / v2, and decode over NHD-ordered caches),
reshape_and_cache and reshape_and_cache_flash.

Serves every device with no compiled kernel (registered for CompositeExplicitAutograd). Same
arguments, in vLLM's order, and same results as the oracle (reference.py), which stays the judge.

Algorithm (all sequences at once; no Python loop over sequences, no host sync):
  1. The token extent is STATIC: v2 covers tmp_out.shape[2] * 512 tokens (capped at the block
     table's capacity), v1 the capacity max_blocks_per_seq * block_size. A static plan (_plan:
     shapes only, so torch.compile unrolls it and CUDA graphs capture it) cuts it into passes of
     whole 512-token partitions for a group of rows (a last partial partition, extent % 512
     tokens, is a pass of its own so nothing past the extent is read), and each pass into
     sub-chunks: the partitions gathered at once.
  2. Per sub-chunk, its blocks of K are read ONCE from the cache (index_select of whole blocks:
     contiguous rows, the fastest gather) into a reused buffer, block ids clamped into
     [0, num_blocks) so garbage entries past a row's used blocks are never dereferenced out of
     bounds; one copy lays them out token-major [C', S', kv_heads, 512, d] (the (d/x, block)
     transpose moves 16-byte units), converted to fp32; logits = (scale * k_scale * q) . k is one
     batched matmul per sub-chunk with the query viewed as [1, S', kv_heads, group, d] (GQA by
     broadcasting: K/V never expanded per query head), written into the pass's logits.
  3. Per pass (few, larger ops: on a CPU every op wakes the worker threads): ALiBi, tokens >=
     seq_len get logit -inf (torch.where: a NaN-poisoned K slot gives a NaN logit), per
     partition max, exp, exp sum (-inf safe: an empty partition or seq_len 0 gives zeros, never
     NaN).
  4. Per sub-chunk again, its blocks of V are read ONCE, slots >= seq_len zeroed (NaN-poisoned
     slots must not leak: 0 * NaN = NaN) and laid out head-dim-major [C', S', kv_heads, d, 512]
     in fp32 (for an fp32 cache the zeroing IS the layout copy: an AND of the bits with an
     integer mask), then one batched matmul P.V per sub-chunk.
  5. Once a group of rows has all its partitions, the outputs are normalised by their exp sums,
     v2 writes them to the scratch, and both v1 and v2 combine them with
     core.partition_weights (the mirror of csrc/core/compound_state.h); out is rounded once
     to the dtype.
Everything is fp32. Blocks that straddle partitions (block_size not dividing 512) are gathered
one partition at a time and cut at the partition's first token.

Memory bound: no fp32 copy of the KV cache. A sub-chunk gathers at most CHUNK_BYTES (4 MiB on a
CPU) of fp32 K (and as much V), or one 512-token partition of one row if that is bigger
(kv_heads * 512 * head_size * 4 bytes: 2 MiB for 8 KV heads of 128 or 4 of 256). Its three
buffers (the blocks as gathered, their layout copy, the fp32 conversion) are allocated once per
call and reused by every sub-chunk, K and V taking turns. A pass holds at most PASS_LOGIT_BYTES
(2 MiB on a CPU) of logits, plus its exp and masks. Beyond these: per group of rows the partition
states (rows * heads * partitions * (head_size + 2) * 4 bytes) and O(num_seqs * num_heads *
head_size) for q and the result (docs/FALLBACK.md has measurements). Small sub-chunks are the
fast choice on a CPU (each one's gather, copy and matmul stay in cache); off the CPU both budgets
are ACCELERATOR_BUDGET_SCALE (16) times bigger, since there every op is a kernel launch.

Rows the contract forbids (seq_len < 0 or beyond the block table's capacity, v2 scratch too small
for the row, a used block id outside [0, num_blocks)) cannot be checked without a host sync on a
GPU: there the row's output is NaN (loud, never an out-of-bounds read). CPU tensors are cheap to
read, so on the CPU (outside torch.compile tracing) the data checks run and raise ValueError, as
the compiled CPU kernel does.
"""

import math

import torch

from . import op_args, validation
from .core import FP8_DTYPES, PARTITION_SIZE, encode_cache, inv_sum, partition_weights, scale_value

# Budgets on a CPU. Gathered fp32 K per sub-chunk (and as much V), at most (unless one partition
# of one row is bigger): small enough that a sub-chunk's gather, layout copy and matmul stay in
# cache. fp32 logits per pass, at most (unless one sub-chunk's are bigger): the softmax steps run
# once per pass, not once per sub-chunk (on a CPU each op costs a wake-up of the worker threads).
CHUNK_BYTES = 4 << 20
PASS_LOGIT_BYTES = 2 << 20
# Off the CPU both budgets are this many times bigger: there every op is a kernel launch (a few
# microseconds: 4 MiB sub-chunks would leave a GPU launch-bound) and no cache to stay in.
ACCELERATOR_BUDGET_SCALE = 16
_NEG_INF = float("-inf")


def _run_data_checks(device):
    """Data checks read tensors (a host sync off the CPU): CPU only, and never while tracing."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


# ---- plan (shapes only) ----

def _plan(num_seqs, extent, k_bytes_per_row_token, logit_bytes_per_row_token, aligned,
          budget_scale=1):
    """Static plan [(s0, s1, [(p0, p1, part_len, step), ...])]: groups of rows, and for each the
    passes over `extent` tokens: partitions [p0, p1) of part_len tokens, gathered `step`
    partitions at a time (a sub-chunk).

    Partitions hold 512 tokens except a last partial one (extent % 512 tokens: nothing past the
    extent is gathered), which is a pass of its own. A sub-chunk gathers at most CHUNK_BYTES of
    fp32 K (or one partition of one row if that is bigger); a pass holds at most
    PASS_LOGIT_BYTES of logits (or one sub-chunk's). `aligned` (block_size divides 512): else
    blocks straddle partitions and each partition is gathered on its own (step 1).
    budget_scale multiplies both budgets (ACCELERATOR_BUDGET_SCALE off the CPU).
    """
    if num_seqs <= 0 or extent <= 0 or min(k_bytes_per_row_token, logit_bytes_per_row_token) <= 0:
        return []  # nothing to gather (and no division by an empty batch or head count)
    chunk_bytes, pass_logit_bytes = CHUNK_BYTES * budget_scale, PASS_LOGIT_BYTES * budget_scale
    full, tail = divmod(extent, PARTITION_SIZE)
    part_tokens = PARTITION_SIZE if full else tail
    row_part = part_tokens * k_bytes_per_row_token  # fp32 K of one row, one partition
    if num_seqs * row_part <= chunk_bytes:  # all rows, several partitions per sub-chunk
        seqs, step = num_seqs, max(1, chunk_bytes // (num_seqs * row_part))
    else:  # big batch: groups of rows, one partition per sub-chunk
        seqs, step = max(1, chunk_bytes // row_part), 1
    step = step if aligned else 1
    pass_logits = seqs * part_tokens * logit_bytes_per_row_token  # one partition of the rows
    per_pass = max(step, pass_logit_bytes // pass_logits // step * step)
    passes = [(p0, min(p0 + per_pass, full), PARTITION_SIZE, step)
              for p0 in range(0, full, per_pass)]
    if tail:
        passes.append((full, full + 1, tail, 1))
    return [(s0, min(s0 + seqs, num_seqs), passes) for s0 in range(0, num_seqs, seqs)]


# ---- gather ----

class _Workspace:
    """Chunk-sized buffers allocated once per call and reused by every sub-chunk (eager mode).

    NOTE: a fresh multi-MiB tensor per chunk is a fresh mmap and page faults on every chunk (the
    allocator hands big blocks back to the OS); reusing them keeps the chunk pipeline in cache.
    Under torch.compile the compiler plans memory itself: plain torch.empty.
    """

    def __init__(self, device):
        self.device = device
        self.reuse = not torch.compiler.is_compiling()
        self.flat = {}

    def empty(self, name, shape, dtype):
        """A [shape] dtype tensor in buffer `name` (bytes, grown on demand: K and V of a chunk
        take turns in the same buffers, so the chunk's working set stays small)."""
        if not self.reuse:
            return torch.empty(shape, dtype=dtype, device=self.device)
        nbytes = math.prod(shape) * dtype.itemsize
        buf = self.flat.get(name)
        if buf is None or buf.numel() < nbytes:
            buf = self.flat[name] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return buf[:nbytes].view(dtype).view(shape)


def _gather_blocks(ws, cache, block_ids):
    """The blocks block_ids [C', S', nb] of cache, contiguous in the cache dtype: the elements of
    cache[block_ids] [C', S', nb, *cache.shape[1:]] (callers view them in that shape).

    NOTE: gathered one KV head at a time (rows of cache.shape[2:]) when [num_blocks * kvh, ...]
    is a view of the cache: index_select of 32 rows of 256 KiB (an MHA block of 32 heads) ran
    3-4x slower than of 1024 rows of 8 KiB; for 64 KiB blocks both are alike.
    """
    ids = block_ids.flatten()
    kvh = cache.shape[1]
    if cache.stride(0) == kvh * cache.stride(1):
        ids = (ids[:, None] * kvh + torch.arange(kvh, device=ids.device)).flatten()
        cache = cache.flatten(0, 1)
    if not ws.reuse:
        return cache.index_select(0, ids)
    out = ws.empty("blocks", (ids.shape[0],) + tuple(cache.shape[1:]), cache.dtype)
    return torch.index_select(cache, 0, ids, out=out)


def _to_fp32(ws, t, kind):
    """Cache elements (contiguous) -> fp32 values, fp8 decoded (scale NOT applied)."""
    if kind != "auto":
        t = t.view(FP8_DTYPES[kind])
    if t.dtype == torch.float32:
        return t
    return ws.empty("fp32", t.shape, torch.float32).copy_(t)


def _gather_keys(ws, key_cache, block_ids, kind):
    """K of the blocks block_ids [C', S', nb] (in range), token-major, fp32 (fp8: scale NOT
    applied). key_cache [num_blocks, kvh, d/x, block_size, x] -> [C', S', kvh, nb * bs, d].
    NOTE: x elements are 16 bytes whatever the dtype, so the (d/x, block_size) transpose moves
    16-byte units (viewed as complex128): about the cost of a plain copy, not the 4-16x of an
    element-wise one.
    """
    parts, seqs, nb = block_ids.shape
    _, kvh, dx, block_size, x = key_cache.shape
    g = _gather_blocks(ws, key_cache, block_ids)  # [C' * S' * nb, kvh, d/x, bs, x]
    shape = (parts, seqs, kvh, nb, block_size, dx)
    if ws.reuse:
        g = g.view(torch.complex128).view(parts, seqs, nb, kvh, dx, block_size)
        t = ws.empty("tokens", shape, torch.complex128).copy_(g.permute(0, 1, 3, 2, 5, 4))
        t = t.view(key_cache.dtype)  # [C', S', kvh, nb, bs, d/x * x] in the cache dtype
    else:  # compiling: inductor fuses the permutation (and has no complex codegen)
        g = g.view(parts, seqs, nb, kvh, dx, block_size, x)
        t = g.permute(0, 1, 3, 2, 5, 4, 6).contiguous()  # [C', S', kvh, nb, bs, d/x, x]
    return _to_fp32(ws, t, kind).view(parts, seqs, kvh, nb * block_size, dx * x)


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def _bit_mask(valid, element_size):
    """bool mask -> integer mask of the given element width: True -> -1 (all ones), False -> 0."""
    return valid.to(_SAME_WIDTH_INT[element_size]).neg_()


def _gather_values(ws, value_cache, block_ids, valid, kind):
    """V of the blocks block_ids [C', S', nb] (in range), fp32, the slots where
    `valid` [C', S', 1 or kvh, nb * block_size] is False zeroed (fp8: scale NOT applied).
    value_cache [num_blocks, kvh, d, block_size] -> [C', S', kvh, nb * block_size, d], a
    transposed view of head-dim-major memory (the P.V matmul reads it as it is).

    NOTE: NaN-poisoned slots must really be zeroed (p = 0 is not enough: 0 * NaN = NaN), and
    masked_fill / torch.where are element-by-element loops on the CPU (10-16x slower than a
    vectorised op on a chunk); an AND of the bits with an all-ones / all-zeros integer mask
    vectorises and gives exactly +0.0 whatever the float format. For an fp32 cache that AND is
    also the layout copy (one pass); otherwise it zeroes the gathered elements in place and one
    copy lays them out and converts them.
    """
    parts, seqs, nb = block_ids.shape
    _, kvh, head_size, block_size = value_cache.shape
    g = _gather_blocks(ws, value_cache, block_ids)  # [C' * S' * nb, kvh, d, bs]
    if kind != "auto":
        g = g.view(FP8_DTYPES[kind])
    g = g.view(parts, seqs, nb, kvh, head_size, block_size)
    # [C', S', 1|kvh, nb * bs] -> [C', S', nb, 1|kvh, 1, bs]
    valid = valid.view(parts, seqs, -1, nb, 1, block_size).transpose(2, 3)
    order = (0, 1, 3, 4, 2, 5)  # -> [C', S', kvh, d, nb, bs]
    shape = (parts, seqs, kvh, head_size, nb * block_size)
    if not ws.reuse:  # compiling: inductor fuses mask, permutation and conversion
        return torch.where(valid, g.float(), 0.0).permute(order).reshape(shape).transpose(-1, -2)
    t = ws.empty("tokens", (parts, seqs, kvh, head_size, nb, block_size), torch.float32)
    if g.dtype == torch.float32:  # mask + layout in one pass
        torch.bitwise_and(g.view(torch.int32).permute(order), _bit_mask(valid, 4).permute(order),
                          out=t.view(torch.int32))
    else:
        g.view(_SAME_WIDTH_INT[g.element_size()]).bitwise_and_(_bit_mask(valid, g.element_size()))
        t.copy_(g.permute(order))
    return t.view(shape).transpose(-1, -2)


# v1 / v2's caches: K [num_blocks, kvh, d/x, block_size, x], V [num_blocks, kvh, d, block_size].
_LEGACY_GATHER = (_gather_keys, _gather_values)


def _gather_tokens_nhd(ws, cache, block_ids, kind, valid=None):
    """The tokens of the blocks block_ids [C', S', nb] (in range) of an NHD-ordered cache
    [num_blocks, block_size, kvh, d] (any strides, last dim contiguous), token-major fp32
    [C', S', kvh, nb * block_size, d] (fp8: scale NOT applied); valid [C', S', 1, nb *
    block_size] (V): the slots where it is False are zeroed (see _gather_values).

    Blocks are gathered in their memory order: an HND cache's view (head stride > token stride)
    is gathered as [.., kvh, block_size, d] rows, an NHD one as [.., block_size, kvh, d]; one
    copy then lays them out token-major per KV head and converts them to fp32.
    """
    parts, seqs, nb = block_ids.shape
    _, block_size, kvh, head_size = cache.shape
    head_major = cache.stride(2) > cache.stride(1)
    src = cache.transpose(1, 2) if head_major else cache  # memory order
    g = _gather_blocks(ws, src, block_ids)  # the elements of src[block_ids], contiguous
    if kind != "auto":
        g = g.view(FP8_DTYPES[kind])
    g = g.view((parts * seqs * nb,) + tuple(src.shape[1:]))  # [n, bs, kvh, d] or [n, kvh, bs, d]
    if valid is not None:  # [C', S', 1, nb * bs] -> [n, bs], broadcast over g's dims
        valid = valid.reshape(parts * seqs * nb, block_size)
        valid = valid[:, None, :, None] if head_major else valid[:, :, None, None]
        if ws.reuse:  # zero in place: the bits AND an all-ones / all-zeros mask
            g.view(_SAME_WIDTH_INT[g.element_size()]).bitwise_and_(
                _bit_mask(valid, g.element_size()))
        else:  # compiling: inductor fuses mask, permutation and conversion
            g = torch.where(valid, g.float(), 0.0)
    g = g.view((parts, seqs, nb) + tuple(src.shape[1:]))
    order = (0, 1, 3, 2, 4, 5) if head_major else (0, 1, 4, 2, 3, 5)  # -> [C',S',kvh,nb,bs,d]
    shape = (parts, seqs, kvh, nb * block_size, head_size)
    if not ws.reuse:
        return g.float().permute(order).reshape(shape)
    t = ws.empty("tokens", (parts, seqs, kvh, nb, block_size, head_size), torch.float32)
    t.copy_(g.permute(order))  # layout and conversion in one copy
    return t.view(shape)


def _gather_keys_nhd(ws, key_cache, block_ids, kind):
    return _gather_tokens_nhd(ws, key_cache, block_ids, kind)


def _gather_values_nhd(ws, value_cache, block_ids, valid, kind):
    return _gather_tokens_nhd(ws, value_cache, block_ids, kind, valid)


# decode's caches: NHD-ordered [num_blocks, block_size, kvh, d], any strides.
_NHD_GATHER = (_gather_keys_nhd, _gather_values_nhd)


def _clamped_tables(block_tables, extent_blocks, num_blocks):
    """int64 [S, extent_blocks] block ids clamped into [0, num_blocks) (garbage entries past a
    row's used blocks are never dereferenced out of bounds: their tokens are masked); columns
    past the table (the extent runs beyond its capacity) read block 0, masked too."""
    ids = block_tables[:, :extent_blocks].long()
    pad = extent_blocks - ids.shape[1]
    if pad > 0:
        ids = torch.nn.functional.pad(ids, (0, pad))
    return ids.clamp(0, num_blocks - 1)


# ---- blocksparse ----

def _blocksparse_keep(sparse, blocks, lens, num_kv_heads, group, block_size):
    """bool [P, S', kvh, group, N]: does each query head attend cache block `blocks` [P, 1, N]
    (int64) of the rows of lengths lens [1, S', 1]? vLLM's rule (docs/CONTRACT.md); the oracle's
    reference.blocksparse_keep is the judge. Static head offsets, data-dependent local window."""
    k_blk = blocks * block_size // sparse.block_size  # sparse block of each block's first token
    q_blk = torch.div(lens.long() - 1, sparse.block_size, rounding_mode="floor")
    local = (k_blk > q_blk - sparse.local_blocks)[:, :, None, None, :]  # [P, S', 1, 1, N]
    tp_rank, step, num_heads = sparse.tp_rank, sparse.head_sliding_step, num_kv_heads * group
    offset = [((tp_rank * num_heads + h) * step + 1 if step >= 0 else
               (tp_rank * num_kv_heads + h // group) * -step + 1) % sparse.vert_stride
              for h in range(num_heads)]  # Python ints, exact (reduced: all terms are >= 0)
    offset = torch.tensor(offset, device=blocks.device).view(num_kv_heads, group, 1)
    vertical = (k_blk[:, :, None, None, :] + offset) % sparse.vert_stride == 0  # [P,1,kvh,g,N]
    return vertical | local


# ---- one pass: per-partition states ----

def _sub_chunk_blocks(tables, seq_lens, s0, s1, p0, p1, part_len, block_size, sparse, kv_group):
    """What sub-chunk (rows [s0, s1), partitions [p0, p1)) gathers: block ids [C', S', nb],
    which gathered V slots count [C', S', 1, nb * bs] (t < seq_len; blocksparse: [.., kvh, ..],
    and some query head of the KV head attends the slot's block) and where each partition's
    tokens start in its gathered slots (all partitions alike: aligned, or one partition)."""
    t0 = p0 * PARTITION_SIZE
    if p1 - p0 > 1:  # aligned: the partitions' blocks tile them exactly
        nb = part_len // block_size
        b0 = t0 // block_size
        ids = tables[s0:s1, b0:b0 + (p1 - p0) * nb].view(s1 - s0, p1 - p0, nb).transpose(0, 1)
        first_slot, offset = b0 * block_size, 0
    else:  # one partition: the blocks covering its tokens (the first may start before them)
        b0, b1 = t0 // block_size, -(-(t0 + part_len) // block_size)
        nb = b1 - b0
        ids = tables[s0:s1, b0:b1][None]
        first_slot, offset = b0 * block_size, t0 - b0 * block_size
    slots = torch.arange(first_slot, first_slot + (p1 - p0) * nb * block_size,
                         device=seq_lens.device).view(p1 - p0, 1, nb * block_size)
    lens = seq_lens[None, s0:s1, None]
    valid = (slots < lens)[:, :, None, :]
    if sparse is not None:
        keep = _blocksparse_keep(sparse, slots // block_size, lens, *kv_group, block_size)
        valid = valid & keep.any(dim=3)
    return ids, valid, offset


def _pass_states(ws, gather, q, key_cache, value_cache, kind, v_scale, tables, seq_lens, slopes,
                 sparse, block_size, s0, s1, p0, p1, part_len, step):
    """Partition states of rows [s0, s1), partitions [p0, p1) of part_len tokens (512, or fewer
    for a last partial partition, alone in its pass), gathered `step` partitions at a time.

    q [1, S, kvh, group, d] fp32, already times scale (* k_scale); slopes [1, 1, kvh, group, 1]
    or None; tables [S, >= blocks of the extent] int64 block ids clamped into [0, num_blocks);
    sparse: validation.Blocksparse or None (dense); gather: (keys, values) gatherers of the
    caches' layout (_LEGACY_GATHER or _NHD_GATHER).
    Returns max, sum [C, S', kvh, group] and out [C, S', kvh, group, d] (out UNnormalised).
    """
    parts, seqs = p1 - p0, s1 - s0
    _, _, kvh, group, head_size = q.shape
    subs = [(c0, min(c0 + step, parts)) for c0 in range(0, parts, step)]

    # logits [C, S', kvh, g, L] = q . k: one batched matmul per sub-chunk over (partition, row,
    # KV head); GQA by broadcasting the group's query heads as the rows (K never expanded).
    logits = torch.empty((parts, seqs, kvh, group, part_len), device=q.device)
    gathered = []
    for c0, c1 in subs:
        ids, slot_valid, offset = _sub_chunk_blocks(tables, seq_lens, s0, s1, p0 + c0, p0 + c1,
                                                    part_len, block_size, sparse, (kvh, group))
        gathered.append((ids, slot_valid, offset))
        k = gather[0](ws, key_cache, ids, kind)  # [C', S', kvh, nb * bs, d]
        k = k[:, :, :, offset:offset + part_len]  # the partitions' tokens [C', S', kvh, L, d]
        torch.matmul(q[:, s0:s1], k.transpose(-1, -2), out=logits[c0:c1])

    # Token positions [C, 1, L] and validity t < seq_len [C, S', 1, 1, L].
    pos = torch.arange(p0 * PARTITION_SIZE, p0 * PARTITION_SIZE + parts * part_len,
                       device=q.device).view(parts, 1, part_len)
    lens = seq_lens[None, s0:s1, None]
    valid = (pos < lens)[:, :, None, None, :]
    if sparse is not None:  # the tokens of the blocks each head skips
        valid = valid & _blocksparse_keep(sparse, pos // block_size, lens, kvh, group, block_size)
    if slopes is not None:  # ALiBi: slope * (t - seq_len + 1), 0 at the last token
        logits = logits + slopes * (pos - lens + 1).float()[:, :, None, None, :]
    # NOTE: where, not an additive -inf: a NaN-poisoned K slot (past seq_len, or in a skipped
    # block) gives a NaN logit.
    logits = torch.where(valid, logits, _NEG_INF)

    # Per partition: max, exp, sum; -inf safe (an empty partition has max -inf, sum 0).
    part_max = logits.amax(dim=-1)  # [C, S', kvh, g]
    safe_max = torch.where(part_max == _NEG_INF, 0.0, part_max)  # exp(-inf - 0) = 0, never NaN
    p = torch.exp(logits - safe_max[..., None])
    part_sum = p.sum(dim=-1)

    # out [C, S', kvh, g, d] = p . v, one batched matmul per sub-chunk.
    part_out = torch.empty((parts, seqs, kvh, group, head_size), device=q.device)
    for (c0, c1), (ids, slot_valid, offset) in zip(subs, gathered):
        v = gather[1](ws, value_cache, ids, slot_valid, kind)  # [C', S', kvh, nb * bs, d]
        v = v[:, :, :, offset:offset + part_len]
        torch.matmul(p[c0:c1], v, out=part_out[c0:c1])
    if kind != "auto":
        part_out = part_out * v_scale
    return part_max, part_sum, part_out


def _bad_rows(block_tables, seq_lens, block_size, num_blocks, extent):
    """bool [S]: rows the contract forbids, found without a sync (see the module docstring)."""
    cols = block_tables.shape[1]
    used = torch.arange(cols, device=seq_lens.device) * block_size < seq_lens[:, None]
    bad_id = used & ((block_tables < 0) | (block_tables >= num_blocks))
    return (seq_lens < 0) | (seq_lens > extent) | bad_id.any(dim=1)


def _attention(op, args):
    """v1 / v2 (args: op_args.V1Args / V2Args)."""
    a = args
    kind = validation.check_attention_args(op, a)
    if _run_data_checks(a.query.device):
        validation.check_attention_data(op, a)
    sparse = validation.blocksparse_spec(a)
    exp_sums, max_logits, tmp_out = op_args.scratch(a)
    capacity = a.block_tables.shape[1] * a.block_size
    extent = capacity if tmp_out is None else min(capacity, tmp_out.shape[2] * PARTITION_SIZE)
    _compute(a.out, exp_sums, max_logits, tmp_out, a.query, a.key_cache, a.value_cache,
             _LEGACY_GATHER, a.num_kv_heads, a.block_size, extent, a.scale, a.block_tables,
             a.seq_lens, a.alibi_slopes, kind, a.k_scale, a.v_scale, sparse)


def _compute(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, gather,
             num_kv_heads, block_size, extent, scale, block_tables, seq_lens, alibi_slopes, kind,
             k_scale, v_scale, sparse):
    """Steps 1-5 of the module docstring, after validation, for either cache layout (gather)
    over the first `extent` tokens of each row (exp_sums, max_logits, tmp_out: None for v1)."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // num_kv_heads
    num_blocks = key_cache.shape[0]
    dev = query.device

    logit_scale = scale * scale_value(k_scale, dev) if kind != "auto" else scale
    q = (query.float() * logit_scale).view(1, num_seqs, num_kv_heads, group, head_size)
    vs = scale_value(v_scale, dev)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().view(1, 1, num_kv_heads, group, 1)

    result = torch.zeros((num_seqs, num_heads, head_size), device=dev)  # fp32
    ws = _Workspace(dev)
    plan = []
    if result.numel() > 0 and num_blocks > 0 and extent > 0:  # else nothing to attend or write
        plan = _plan(num_seqs, extent, num_kv_heads * head_size * 4, num_heads * 4,
                     PARTITION_SIZE % block_size == 0,
                     1 if dev.type == "cpu" else ACCELERATOR_BUDGET_SCALE)
        tables = _clamped_tables(block_tables, -(-extent // block_size), num_blocks)
    for s0, s1, passes in plan:
        states = [_pass_states(ws, gather, q, key_cache, value_cache, kind, vs, tables, seq_lens,
                               slopes, sparse, block_size, s0, s1, *spec) for spec in passes]
        # All partitions of these rows: max, sum [P, S', kvh, g]; out [P, S', kvh, g, d].
        part_max, part_sum, part_out = (torch.cat(t) for t in zip(*states))
        part_out = part_out * inv_sum(part_sum)[..., None]  # normalised by its own exp sum
        rows, num_parts = s1 - s0, part_max.shape[0]
        if tmp_out is not None:  # v2 scratch: the partitions' stats and normalised outputs
            heads_last = part_max.permute(1, 2, 3, 0).reshape(rows, num_heads, num_parts)
            max_logits[s0:s1, :, :num_parts] = heads_last
            exp_sums[s0:s1, :, :num_parts] = part_sum.permute(1, 2, 3, 0).reshape(
                rows, num_heads, num_parts)
            tmp_out[s0:s1, :, :num_parts] = part_out.permute(1, 2, 3, 0, 4).reshape(
                rows, num_heads, num_parts, head_size)
        # Phase 2 (compound_state.h partition_weights: -inf safe, all-empty rows give zeros).
        w = partition_weights(part_max.permute(1, 2, 3, 0), part_sum.permute(1, 2, 3, 0))
        rows_out = torch.einsum("skgp,pskgd->skgd", w, part_out)  # w [S', kvh, g, P]
        result[s0:s1] = rows_out.reshape(rows, num_heads, head_size)

    bad = _bad_rows(block_tables, seq_lens, block_size, num_blocks, extent)
    out.copy_(torch.where(bad[:, None, None], float("nan"), result))


# The public functions take the ops' arguments (op_args.function: schemas.py's names, order and
# defaults, positionally or by name) and hand them on as one record.
paged_attention_v1 = op_args.function("v1", _attention, """\
out [num_seqs, num_heads, head_size] <- paged attention (vLLM's v1 contract).""")

paged_attention_v2 = op_args.function("v2", _attention, """\
out as v1; exp_sums / max_logits / tmp_out hold every partition's max, exp sum and output
normalised by its exp sum (query dtype) for p < ceil(seq_len / 512); beyond: unspecified.""")


def _decode(op, args):
    a = args
    kind = validation.check_decode_args(op, a)
    _, block_size, num_kv_heads, _ = a.key_cache.shape
    extent = a.block_tables.shape[1] * block_size
    if _run_data_checks(a.query.device):
        validation.check_decode_data(op, a)
        extent = min(extent, int(a.seq_lens.max())) if a.seq_lens.numel() else 0
    _compute(a.out, None, None, None, a.query, a.key_cache, a.value_cache, _NHD_GATHER,
             num_kv_heads, block_size, extent, a.scale, a.block_tables, a.seq_lens,
             a.alibi_slopes, kind, a.k_scale, a.v_scale, None)


decode = op_args.function("decode", _decode, """\
out [num_seqs, num_heads, head_size] <- decode attention over NHD-ordered caches
[num_blocks, block_size, num_kv_heads, head_size] (any strides, last dim contiguous): v1's
algorithm (above) with the NHD gathers. On the CPU outside tracing, where the lengths are
read anyway, the extent stops at the longest row instead of the block table's capacity.""")


# ---- reshape_and_cache ----

def _reshape_and_cache(op, args):
    kind = validation.check_cache_args(op, args)
    if _run_data_checks(args.key.device):
        validation.check_cache_data(op, args)
    key, key_cache, value_cache = args.key, args.key_cache, args.value_cache
    num_tokens = args.slot_mapping.shape[0]  # key / value rows past it: padding, never read
    kvh, head_size = key.shape[1:]
    num_blocks, block_size, x = key_cache.shape[0], key_cache.shape[3], key_cache.shape[4]
    if num_tokens == 0 or num_blocks == 0:
        return
    k = encode_cache(key[:num_tokens], kind, scale_value(args.k_scale, key.device))  # [N, kvh, d]
    k = k.reshape(num_tokens, kvh, head_size // x, x)  # [N, kvh, d/x, x]
    v = encode_cache(args.value[:num_tokens], kind, scale_value(args.v_scale, key.device))

    slot, fill_rows = _sync_free_slots(args.slot_mapping, num_blocks * block_size)
    blocks, offsets = slot // block_size, slot % block_size
    # key_cache[b, :, :, o, :] is [kvh, d/x, x]; value_cache[b, :, :, o] is [kvh, d].
    key_cache[blocks, :, :, offsets, :] = fill_rows(k, key_cache[0, :, :, 0, :])
    value_cache[blocks, :, :, offsets] = fill_rows(v, value_cache[0, :, :, 0])


reshape_and_cache = op_args.function("reshape_and_cache", _reshape_and_cache, """\
Write token i's key/value [num_kv_heads, head_size] into slot slot_mapping[i] of the caches.

Sync-free: every token writes (one index_put_ per cache, no boolean-mask indexing). A skipped
token (negative slot = padding; off the CPU also a slot >= num_slots, which the CPU rejects)
is redirected to the first live token's slot carrying that token's bytes (a duplicate write
of identical bytes), or, with no live token, rewrites slot 0 with its own current bytes.""")


def _sync_free_slots(slot_mapping, num_slots):
    """Slots for writing every token with no host sync (see reshape_and_cache): returns
    (slot [N] int64, fill_rows). A skipped token (slot < 0, or >= num_slots) gets the first live
    token's slot, or slot 0 when none is live. fill_rows(rows [N, ...], slot0_now [...]) gives
    the rows to write: a skipped token carries the first live token's row, or, with no live
    token, slot 0's current contents (so every write is a no-op or a duplicate)."""
    live = (slot_mapping >= 0) & (slot_mapping < num_slots)  # [N]
    first = torch.argmax(live.to(torch.int32)).view(1)  # the first live token (0 if none)
    any_live = live.any()
    slot = torch.where(live, slot_mapping, torch.where(any_live, slot_mapping[first], 0))

    def fill_rows(rows, slot0_now):
        fill = torch.where(any_live, rows[first], slot0_now[None])  # [1, ...]
        return torch.where(live.view((-1,) + (1,) * (rows.dim() - 1)), rows, fill)

    return slot, fill_rows


def _reshape_and_cache_flash(op, args):
    kind = validation.check_flash_cache_args(op, args)
    if _run_data_checks(args.key.device):
        validation.check_flash_cache_data(op, args)
    key, key_cache, value_cache = args.key, args.key_cache, args.value_cache
    num_tokens = args.slot_mapping.shape[0]
    num_blocks, block_size = key_cache.shape[:2]
    if num_tokens == 0 or num_blocks == 0:
        return
    k = encode_cache(key[:num_tokens], kind, scale_value(args.k_scale, key.device))  # [N, kvh, d]
    v = encode_cache(args.value[:num_tokens], kind, scale_value(args.v_scale, key.device))
    slot, fill_rows = _sync_free_slots(args.slot_mapping, num_blocks * block_size)
    blocks, offsets = slot // block_size, slot % block_size
    # key_cache[b, o] is [kvh, d].
    key_cache[blocks, offsets] = fill_rows(k, key_cache[0, 0])
    value_cache[blocks, offsets] = fill_rows(v, value_cache[0, 0])


reshape_and_cache_flash = op_args.function("reshape_and_cache_flash", _reshape_and_cache_flash,
                                           """\
Write token i's key/value [num_kv_heads, head_size] (i < slot_mapping.size(0); rows past
it are padding, not read) into slot slot_mapping[i] of the NHD-ordered caches (any strides:
the writes go through the views). Sync-free as reshape_and_cache.""")
