"""Fast, sync-free PyTorch paged attention (v1 / v2) and reshape_and_cache.

Serves every device with no compiled kernel (registered for CompositeExplicitAutograd). Same
arguments, in vLLM's order, and same results as the oracle (reference.py), which stays the judge.

Algorithm (all sequences at once; no Python loop over sequences, no host sync):
  1. The token extent is STATIC: v2 covers tmp_out.shape[2] * 512 tokens (capped at the block
     table's capacity), v1 the capacity max_blocks_per_seq * block_size. It is cut into chunks of
     whole 512-token partitions (and, for big batches, of sequences; a last partial partition,
     extent % 512 tokens, is a chunk of its own so nothing past the extent is read); a static
     Python loop walks them (shapes only, so torch.compile unrolls it and CUDA graphs capture it).
  2. Per chunk, the chunk's blocks of K and V are read ONCE from the cache (index_select of whole
     blocks: contiguous rows, the fastest gather) into reused buffers, block ids clamped into
     [0, num_blocks) so garbage entries past a row's used blocks are never dereferenced out of
     bounds; then one copy lays them out for the matmuls and converts to fp32: K token-major
     [seqs, kv_heads, C, 512, d] (the (d/x, block) transpose moves 16-byte units), V
     head-dim-major [seqs, kv_heads, C, d, 512] (its inner runs are whole block rows).
  3. logits = (scale * k_scale * q) . k as one batched matmul with the query viewed as
     [seqs, kv_heads, 1, group, head_size] (GQA by broadcasting, K/V never expanded per query
     head), + ALiBi; tokens >= seq_len get logit -inf AND their V rows are zeroed (masked_fill:
     NaN-poisoned slots must not leak, 0 * NaN = NaN).
  4. Per partition: max, exp sum, output (one batched matmul P.V), normalised by its exp sum;
     -inf-safe, so an empty partition or seq_len 0 gives zeros, never NaN. Once a group of rows
     has all its partitions, v2 writes them to the scratch, and both v1 and v2 combine them with
     reference.partition_weights (the mirror of csrc/core/compound_state.h); out is rounded once
     to the dtype.
Everything is fp32.

Memory bound: no fp32 copy of the KV cache. A chunk covers at most CHUNK_BYTES (2 MiB) of fp32 K
(and as much V), or one 512-token partition of one sequence if that is bigger (kv_heads * 512 *
head_size * 4 bytes: 2 MiB for 8 KV heads of 128 or 4 of 256). Its buffers (K and V gathered raw,
K transposed, K and V in fp32) are allocated once per call and reused by every chunk, so peak
extra memory is about 5 chunks plus O(num_seqs * num_heads * head_size) for q, the running state
and the result: ~10-30 MiB whatever the context length (docs/FALLBACK.md has measurements).
Small chunks are also the fast choice on a CPU: each chunk's pipeline stays in cache.

Rows the contract forbids (seq_len < 0 or beyond the block table's capacity, v2 scratch too small
for the row, a used block id outside [0, num_blocks)) cannot be checked without a host sync on a
GPU: there the row's output is NaN (loud, never an out-of-bounds read). CPU tensors are cheap to
read, so on the CPU (outside torch.compile tracing) the data checks run and raise ValueError, as
the compiled CPU kernel does.
"""

import math

import torch

from . import validation
from .reference import _scale_value, encode_cache, inv_sum, partition_weights
from .validation import PARTITION_SIZE

# fp32 K (and as much V) gathered per chunk, at most (unless one partition of one row is bigger).
CHUNK_BYTES = 2 << 20
_NEG_INF = float("-inf")


def _run_data_checks(device):
    """Data checks read tensors (a host sync off the CPU): CPU only, and never while tracing."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


def _masked_fill(t, mask, value):
    """In place on our own buffers in eager mode; out of place under torch.compile (an in-place
    write through a strided view is what functionalization handles worst)."""
    if torch.compiler.is_compiling():
        return t.masked_fill(mask, value)
    return t.masked_fill_(mask, value)


# ---- chunk plan (shapes only) ----

def _chunk_plan(num_seqs, extent, bytes_per_row_token):
    """Static plan [(s0, s1, [(p0, p1, part_len), ...])]: groups of rows, and for each the chunks
    of partitions covering `extent` tokens.

    Partitions hold 512 tokens except a last partial one (extent % 512 tokens: nothing past the
    extent is gathered), which is a chunk of its own. A chunk gathers at most CHUNK_BYTES of fp32
    K (bytes_per_row_token = kv_heads * head_size * 4 per token of one row), or one partition of
    one row if that is bigger.
    """
    full, tail = divmod(extent, PARTITION_SIZE)
    row_part = (PARTITION_SIZE if full else tail) * bytes_per_row_token  # one row, one partition
    if num_seqs * row_part <= CHUNK_BYTES:  # all rows, several partitions per chunk
        seqs, parts = num_seqs, max(1, CHUNK_BYTES // (num_seqs * row_part))
    else:  # big batch: groups of rows, one partition per chunk
        seqs, parts = max(1, CHUNK_BYTES // row_part), 1
    spans = [(p0, min(p0 + parts, full), PARTITION_SIZE) for p0 in range(0, full, parts)]
    if tail:
        spans.append((full, full + 1, tail))
    return [(s0, min(s0 + seqs, num_seqs), spans) for s0 in range(0, num_seqs, seqs)]


# ---- gather ----

class _Workspace:
    """Chunk-sized buffers allocated once per call and reused by every chunk (eager mode).

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


def _gather_blocks(ws, name, cache, block_ids):
    """cache rows block_ids [S', nb] -> [S' * nb, *cache.shape[1:]] (contiguous, cache dtype)."""
    ids = block_ids.flatten()
    if not ws.reuse:
        return cache.index_select(0, ids)
    out = ws.empty(name, (ids.shape[0],) + tuple(cache.shape[1:]), cache.dtype)
    return torch.index_select(cache, 0, ids, out=out)


def _to_fp32(ws, name, t, kind):
    """Cache elements (contiguous) -> fp32 values, fp8 decoded (scale NOT applied)."""
    if kind != "auto":
        t = t.view(validation.FP8_DTYPES[kind])
    if t.dtype == torch.float32:
        return t
    return ws.empty(name, t.shape, torch.float32).copy_(t)


def _gather_keys(ws, key_cache, block_ids, groups, kind):
    """K of the blocks block_ids [S', nb] (in range), token-major, fp32 (fp8: scale NOT applied).

    key_cache [num_blocks, kvh, d/x, block_size, x]; the nb blocks form `groups` equal groups.
    Returns [S', kvh, groups, nb / groups * block_size, d], contiguous.
    NOTE: x elements are 16 bytes whatever the dtype, so the permutation moves 16-byte units
    (viewed as complex128): the (d/x, block_size) transpose costs about one more copy, not the
    4-16x of an element-wise one.
    """
    seqs, nb = block_ids.shape
    _, kvh, dx, block_size, x = key_cache.shape
    g = _gather_blocks(ws, "blocks", key_cache, block_ids)  # [S' * nb, kvh, d/x, bs, x]
    shape = (seqs, kvh, groups, nb // groups, block_size, dx)
    if ws.reuse:
        g = g.view(torch.complex128).view(seqs, groups, nb // groups, kvh, dx, block_size)
        t = ws.empty("tokens", shape, torch.complex128).copy_(g.permute(0, 3, 1, 2, 5, 4))
        t = t.view(key_cache.dtype)  # [S', kvh, G, nb/G, bs, d/x * x] in the cache dtype
    else:  # compiling: inductor fuses the permutation (and has no complex codegen)
        g = g.view(seqs, groups, nb // groups, kvh, dx, block_size, x)
        t = g.permute(0, 3, 1, 2, 5, 4, 6).contiguous()  # [S', kvh, G, nb/G, bs, d/x, x]
    t = _to_fp32(ws, "k_fp32", t, kind)
    return t.view(seqs, kvh, groups, nb // groups * block_size, dx * x)


def _gather_values(ws, value_cache, block_ids, groups, kind):
    """V of the blocks block_ids [S', nb] (in range), head-dim-major, fp32 (fp8: scale NOT
    applied). value_cache [num_blocks, kvh, d, block_size]. Returns
    [S', kvh, groups, d, nb / groups * block_size], contiguous (one copy permutes and converts;
    its inner runs are whole block rows)."""
    seqs, nb = block_ids.shape
    _, kvh, head_size, block_size = value_cache.shape
    g = _gather_blocks(ws, "blocks", value_cache, block_ids)  # [S' * nb, kvh, d, bs]
    if kind != "auto":
        g = g.view(validation.FP8_DTYPES[kind])
    g = g.view(seqs, groups, nb // groups, kvh, head_size, block_size)
    t = ws.empty("tokens", (seqs, kvh, groups, head_size, nb // groups, block_size),
                 torch.float32).copy_(g.permute(0, 3, 1, 4, 2, 5))
    return t.view(seqs, kvh, groups, head_size, nb // groups * block_size)


def _chunk_block_ids(block_tables, s0, s1, b0, b1, num_blocks):
    """int64 [s1 - s0, b1 - b0] block ids clamped into [0, num_blocks); columns past the table
    (the chunk runs beyond its capacity) read block 0: those tokens are >= seq_len, masked."""
    ids = block_tables[s0:s1, b0:min(b1, block_tables.shape[1])].long()
    pad = b1 - b0 - ids.shape[1]
    if pad > 0:
        ids = torch.nn.functional.pad(ids, (0, pad))
    return ids.clamp(0, num_blocks - 1)


# ---- one chunk: per-partition states ----

def _chunk_states(ws, q, key_cache, value_cache, kind, logit_scale, v_scale, block_tables,
                  seq_lens, slopes, block_size, s0, s1, p0, p1, part_len):
    """Partition states of sequences [s0, s1), partitions [p0, p1) of part_len tokens (512, or
    fewer for a last partial partition, alone in its chunk).

    q [S, kvh, 1, group, d] fp32 (unscaled); slopes [1, kvh, 1, group, 1] fp32 or None.
    Returns max, sum [S', kvh, C, group] and out [S', kvh, C, group, d] (out UNnormalised).
    """
    num_parts = p1 - p0
    t0 = p0 * PARTITION_SIZE
    t1 = t0 + num_parts * part_len  # the chunk's tokens
    b0, b1 = t0 // block_size, -(-t1 // block_size)  # blocks covering them
    offset = t0 - b0 * block_size  # first chunk token inside the gathered blocks
    ids = _chunk_block_ids(block_tables, s0, s1, b0, b1, key_cache.shape[0])
    seqs = s1 - s0
    # block_size divides 512: gathered straight into [S', kvh, C, L, d] / [S', kvh, C, d, L];
    # other block sizes: the gathered tokens are cut into partitions (matmul may copy).
    # NOTE: block_size must divide part_len, not only the chunk: with block_size 3 a chunk of
    # 3 x 512 tokens is 512 whole blocks, but they do not split into 3 groups of whole blocks.
    aligned = (offset == 0 and part_len % block_size == 0
               and (b1 - b0) * block_size == num_parts * part_len)
    span = slice(offset, offset + num_parts * part_len)

    # Token positions [1, 1, C, 1, L] and validity t < seq_len [S', 1, C, 1, L] (L = part_len).
    pos = torch.arange(t0, t1, device=q.device).view(1, 1, num_parts, 1, part_len)
    lens = seq_lens[s0:s1].view(seqs, 1, 1, 1, 1)
    valid = pos < lens

    # Keys first, then values: they take turns in the workspace buffers.
    if aligned:
        k = _gather_keys(ws, key_cache, ids, num_parts, kind)
    else:
        k = _gather_keys(ws, key_cache, ids, 1, kind)[:, :, 0, span]
        k = k.unflatten(2, (num_parts, part_len))
    # GQA by broadcasting: [S', kvh, 1, g, d] @ [S', kvh, C, d, L] -> [S', kvh, C, g, L]
    logits = torch.matmul(q[s0:s1] * logit_scale, k.transpose(-1, -2))
    if slopes is not None:  # ALiBi: slope * (t - seq_len + 1), 0 at the last token
        logits = logits + slopes * (pos - lens + 1).float()
    logits = _masked_fill(logits, ~valid, _NEG_INF)

    part_max = logits.amax(dim=-1)  # [S', kvh, C, g]; -inf for an empty partition
    safe_max = torch.where(part_max == _NEG_INF, 0.0, part_max)  # exp(-inf - 0) = 0, never NaN
    p = torch.exp(logits - safe_max[..., None])
    part_sum = p.sum(dim=-1)

    if aligned:
        v = _gather_values(ws, value_cache, ids, num_parts, kind)
    else:
        v = _gather_values(ws, value_cache, ids, 1, kind)[:, :, 0, :, span]
        v = v.unflatten(3, (num_parts, part_len)).transpose(2, 3)
    # NOTE: zero V past seq_len (NaN-poisoned slots: p = 0 is not enough, 0 * NaN = NaN).
    v = _masked_fill(v, ~valid, 0.0)  # [S', kvh, C, d, L]
    part_out = torch.matmul(p, v.transpose(-1, -2))  # [S', kvh, C, g, L] @ [..., L, d]
    if kind != "auto":
        part_out = part_out * v_scale
    return part_max, part_sum, part_out


def _to_heads(t):
    """[S, kvh, C, g(, d)] -> [S, kvh * g, C(, d)] (query head h = kv_head * g + j)."""
    return t.transpose(2, 3).flatten(1, 2)


def _bad_rows(block_tables, seq_lens, block_size, num_blocks, extent):
    """bool [S]: rows the contract forbids, found without a sync (see the module docstring)."""
    cols = block_tables.shape[1]
    used = torch.arange(cols, device=seq_lens.device) * block_size < seq_lens[:, None]
    bad_id = used & ((block_tables < 0) | (block_tables >= num_blocks))
    return (seq_lens < 0) | (seq_lens > extent) | bad_id.any(dim=1)


def _attention(op, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
               num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
               alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank, bs_local, bs_vert,
               bs_block, bs_step):
    kind = validation.check_attention_args(
        op, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
        scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
        k_scale, v_scale, tp_rank, bs_local, bs_vert, bs_block, bs_step)
    if _run_data_checks(query.device):
        validation.check_attention_data(op, key_cache, block_tables, seq_lens, block_size,
                                        tmp_out)
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // num_kv_heads
    num_blocks = key_cache.shape[0]
    capacity = block_tables.shape[1] * block_size
    extent = capacity if tmp_out is None else min(capacity, tmp_out.shape[2] * PARTITION_SIZE)
    dev = query.device

    q = query.float().view(num_seqs, num_kv_heads, 1, group, head_size)
    logit_scale = scale * _scale_value(k_scale, dev) if kind != "auto" else scale
    vs = _scale_value(v_scale, dev)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().view(1, num_kv_heads, 1, group, 1)

    result = torch.zeros((num_seqs, num_heads, head_size), device=dev)  # fp32
    ws = _Workspace(dev)
    row_token = num_kv_heads * head_size * 4  # fp32 K bytes of one token of one row
    plan = _chunk_plan(num_seqs, extent, row_token) if num_blocks > 0 and extent > 0 else []
    for s0, s1, spans in plan:
        states = [_chunk_states(ws, q, key_cache, value_cache, kind, logit_scale, vs,
                                block_tables, seq_lens, slopes, block_size, s0, s1, p0, p1,
                                part_len) for p0, p1, part_len in spans]
        # All partitions of these rows: max, sum [S', kvh, P, g]; out [S', kvh, P, g, d].
        part_max, part_sum, part_out = (torch.cat(t, dim=2) for t in zip(*states))
        part_out = part_out * inv_sum(part_sum)[..., None]  # normalised by its own exp sum
        if tmp_out is not None:  # v2 scratch: the partitions' stats and normalised outputs
            num_parts = part_max.shape[2]
            max_logits[s0:s1, :, :num_parts] = _to_heads(part_max)
            exp_sums[s0:s1, :, :num_parts] = _to_heads(part_sum)
            tmp_out[s0:s1, :, :num_parts] = _to_heads(part_out)
        # Phase 2 (compound_state.h partition_weights: -inf safe, all-empty rows give zeros).
        w = partition_weights(part_max.transpose(2, 3), part_sum.transpose(2, 3))  # [S',kvh,g,P]
        rows = torch.einsum("skgp,skpgd->skgd", w, part_out)
        result[s0:s1] = rows.reshape(s1 - s0, num_heads, head_size)

    bad = _bad_rows(block_tables, seq_lens, block_size, num_blocks, extent)
    out.copy_(torch.where(bad[:, None, None], float("nan"), result))


def paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                       seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype="auto",
                       k_scale=1.0, v_scale=1.0, tp_rank=0, blocksparse_local_blocks=0,
                       blocksparse_vert_stride=0, blocksparse_block_size=64,
                       blocksparse_head_sliding_step=0):
    """out [num_seqs, num_heads, head_size] <- paged attention (vLLM's v1 contract)."""
    _attention("v1", out, None, None, None, query, key_cache, value_cache, num_kv_heads, scale,
               block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
               k_scale, v_scale, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
               blocksparse_block_size, blocksparse_head_sliding_step)


def paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                       num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                       alibi_slopes, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, tp_rank=0,
                       blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                       blocksparse_block_size=64, blocksparse_head_sliding_step=0):
    """out as v1; exp_sums / max_logits / tmp_out hold every partition's max, exp sum and output
    normalised by its exp sum (query dtype) for p < ceil(seq_len / 512); beyond: unspecified."""
    _attention("v2", out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
               num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
               alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank, blocksparse_local_blocks,
               blocksparse_vert_stride, blocksparse_block_size, blocksparse_head_sliding_step)


# ---- reshape_and_cache ----

def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                      k_scale=1.0, v_scale=1.0):
    """Write token i's key/value [num_kv_heads, head_size] into slot slot_mapping[i] of the caches.

    Sync-free: every token writes (one index_put_ per cache, no boolean-mask indexing). A skipped
    token (negative slot = padding; off the CPU also a slot >= num_slots, which the CPU rejects)
    is redirected to the first live token's slot carrying that token's bytes (a duplicate write
    of identical bytes), or, with no live token, rewrites slot 0 with its own current bytes.
    """
    op = "reshape_and_cache"
    kind = validation.check_cache_args(op, key, value, key_cache, value_cache, slot_mapping,
                                       kv_cache_dtype, k_scale, v_scale)
    if _run_data_checks(key.device):
        validation.check_cache_data(op, key_cache, slot_mapping)
    num_tokens, kvh, head_size = key.shape
    num_blocks, block_size, x = key_cache.shape[0], key_cache.shape[3], key_cache.shape[4]
    if num_tokens == 0 or num_blocks == 0:
        return
    k = encode_cache(key, kind, _scale_value(k_scale, key.device))  # [N, kvh, d]
    k = k.reshape(num_tokens, kvh, head_size // x, x)  # [N, kvh, d/x, x]
    v = encode_cache(value, kind, _scale_value(v_scale, key.device))  # [N, kvh, d]

    live = (slot_mapping >= 0) & (slot_mapping < num_blocks * block_size)  # [N]
    first = torch.argmax(live.to(torch.int32)).view(1)  # the first live token (0 if none)
    any_live = live.any()
    slot = torch.where(live, slot_mapping, torch.where(any_live, slot_mapping[first], 0))
    blocks, offsets = slot // block_size, slot % block_size
    # Current bytes of slot 0 (block 0, offset 0): what a no-live-token call writes back.
    k_fill = torch.where(any_live, k[first], key_cache[0, :, :, 0, :][None])  # [1, kvh, d/x, x]
    v_fill = torch.where(any_live, v[first], value_cache[0, :, :, 0][None])  # [1, kvh, d]
    k = torch.where(live[:, None, None, None], k, k_fill)
    v = torch.where(live[:, None, None], v, v_fill)
    # key_cache[b, :, :, o, :] is [kvh, d/x, x]; value_cache[b, :, :, o] is [kvh, d].
    key_cache[blocks, :, :, offsets, :] = k
    value_cache[blocks, :, :, offsets] = v
