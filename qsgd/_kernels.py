"""Numba CPU kernels of the QSGD codec: fused norm + quantize + pack, unpack, Elias coding.

Each parallel kernel splits the buckets into chunks whose first bit is byte-aligned and gives
the chunks to ``T`` workers round-robin (``prange`` over workers, not over chunks, so that each
worker owns one scratch row; allocating inside a ``prange`` body is hoisted by numba's parfors).
A bucket is read twice while it is hot in cache (norm, then quantize + pack) and the input is
never copied: encode reads 4 bytes and writes ``b/8`` bytes per element.

The arithmetic mirrors the torch reference of :mod:`qsgd.quantizer` and :mod:`qsgd.rng`
operation for operation in float32 (no fastmath, so no reassociation or FMA contraction), so
both give bit-identical levels; the tests check it.

Kernels never raise (numba exceptions cannot carry values); they return or fill error codes
that the Python callers turn into :class:`qsgd.PayloadError` messages.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_U32 = np.uint32
_C1 = np.uint32(0x7FEB352D)
_C2 = np.uint32(0x846CA68B)
_S8 = np.uint32(8)
_S15 = np.uint32(15)
_S16 = np.uint32(16)
_U24 = np.float32(1.0 / (1 << 24))
_FLT_MAX = np.float32(np.finfo(np.float32).max)
#: |x| bit patterns at or above this are Inf or NaN.
_EXP_ALL_ONES = np.uint32(0x7F800000)
_ABS_MASK = np.uint32(0x7FFFFFFF)
#: elements quantized per inner block (a multiple of 8 keeps blocks byte-aligned in a bucket).
BLOCK = 2048
#: below this many elements the single-threaded kernels run: waking the worker threads costs
#: more than the work (milliseconds on a loaded machine).
PARALLEL_MIN = 1 << 17

# Error codes of the decoders (see qsgd.codec for the messages).
OK = 0
E_TRUNCATED = 1
E_OMEGA_TOO_LONG = 2
E_NNZ = 3
E_GAP = 4
E_LEVEL = 5
E_SCALE = 6
E_ZERO_SCALE = 7
E_TRAILING = 8
E_PADDING = 9
E_CODE = 10

_JIT = dict(cache=True, nogil=True)
# Hot loops index views from 0 (``v = x[i0:i1]; for t in range(v.shape[0])``): an index that
# starts at a run-time value may be negative as far as numba knows, and its wrap-around select
# kept LLVM's vectorized loop 10-20x slower (0.63 against 0.033 ns per element for a max).
_PJIT = dict(cache=True, nogil=True, parallel=True)


@njit(**_JIT)
def _mix32(h):
    # lowbias32 (Wellons 2018); see qsgd.rng for the specification.
    h = _U32(h ^ (h >> _S16))
    h = _U32(h * _C1)
    h = _U32(h ^ (h >> _S15))
    h = _U32(h * _C2)
    return _U32(h ^ (h >> _S16))


@njit(**_JIT)
def _bucket_scale(x, xb, i0, i1, l2, scales, scales_u, bk):
    """Write the scale of x[i0:i1] (max |x|, or the l2 norm summed in float64) to scales[bk];
    returns (scale, finite). ``scales_u`` is ``scales`` viewed as uint32."""
    # max of the |x| bit patterns: an integer reduction that vectorizes; for finite floats it
    # orders like the values, and patterns >= 0x7f800000 are Inf or NaN
    mb = _U32(0)
    vb = xb[i0:i1]
    for i in range(vb.shape[0]):
        mb = max(mb, _U32(vb[i] & _ABS_MASK))
    if mb >= _EXP_ALL_ONES:
        scales[bk] = 0.0
        return np.float32(0.0), False
    if l2:
        acc = 0.0
        vx = x[i0:i1]
        for i in range(vx.shape[0]):
            v = np.float64(vx[i])
            acc += v * v
        scales[bk] = np.float32(np.sqrt(acc))
    else:
        scales_u[bk] = mb  # the float whose bits these are is max |x|
    return scales[bk], True


@njit(**_JIT)
def _inverse(scale, s):
    """(s / scale, scale) in float32; a bucket whose inverse overflows is flushed to zero."""
    if scale > np.float32(0.0):
        inv = np.float32(np.float32(s) / scale)
        if inv <= _FLT_MAX:
            return inv, scale
    return np.float32(0.0), np.float32(0.0)


@njit(**_JIT)
def _quantize_run(x, i0, m, inv, sf, bf, k0, kh, lo0, out, o0):
    """out[o0 + t] = signed level of x[i0 + t] + bias, t in [0, m): one 2**32-aligned run.

    Written in float32 selects (floor, compare, min, negate) with one explicit conversion to
    the output's type at the end, over views indexed from 0, which LLVM vectorizes (16 lanes
    with AVX-512).
    """
    one = np.float32(1.0)
    zero = np.float32(0.0)
    xs = x[i0:i0 + m]
    os = out[o0:o0 + m]
    for t in range(m):
        v = xs[t]
        a = np.float32(abs(v) * inv)
        fl = np.floor(a)
        frac = np.float32(a - fl)
        h = _mix32(_U32(_mix32(_U32(_U32(lo0 + _U32(t)) ^ k0)) ^ kh))
        u = np.float32(np.float32(h >> _S8) * _U24)
        lvf = fl + (one if u < frac else zero)
        lvf = lvf if lvf < sf else sf
        lvf = -lvf if v < zero else lvf
        os[t] = out.dtype.type(np.int32(lvf + bf))


@njit(**_JIT)
def _quantize_into(x, i0, i1, inv, s, k0, k1, bias, out, o0):
    """out[o0 + i - i0] = signed level of x[i] + bias, for i in [i0, i1).

    The element index ``i`` splits into 32-bit halves for the hash (see qsgd.rng): one run
    per 2**32 elements, each with its own high-word key. ``floor(a) == float(int(a))`` for
    ``a >= 0``, as in the torch reference.
    """
    sf = np.float32(s)
    bf = np.float32(bias)
    if i1 <= i0:
        return
    if (i1 - 1) >> 32 == i0 >> 32:
        # one run (always, below 2**32 elements): straight-line, so the run stays vectorized
        kh = _U32(k1 ^ _mix32(_U32(i0 >> 32)))
        _quantize_run(x, i0, i1 - i0, inv, sf, bf, k0, kh, _U32(i0 & 0xFFFFFFFF), out, o0)
        return
    j = i0
    while j < i1:
        hi = j >> 32
        seg = min(i1, (hi + 1) << 32)
        kh = _U32(k1 ^ _mix32(_U32(hi)))
        _quantize_run(x, j, seg - j, inv, sf, bf, k0, kh, _U32(j & 0xFFFFFFFF), out, o0 + j - i0)
        j = seg


@njit(**_JIT)
def _quantize_bucket(x, xb, bk, d, s, l2, k0, k1, scales, scales_u, levels, bad):
    n = x.shape[0]
    i0 = bk * d
    i1 = min(n, i0 + d)
    scale, finite = _bucket_scale(x, xb, i0, i1, l2, scales, scales_u, bk)
    if not finite:
        bad[bk] = 1
        return
    inv, scale = _inverse(scale, s)
    scales[bk] = scale
    _quantize_into(x, i0, i1, inv, s, k0, k1, 0, levels, i0)


@njit(**_PJIT)
def quantize_levels(x, xb, d, s, l2, k0, k1, scales, scales_u, levels, bad):
    """Signed levels (int8/int16, flat) and fp32 scales of a flat fp32 array ``x``.

    ``bad[b] = 1`` for every bucket with a NaN or Inf (its levels are then left unwritten).
    """
    for bk in prange(scales.shape[0]):
        _quantize_bucket(x, xb, bk, d, s, l2, k0, k1, scales, scales_u, levels, bad)


@njit(**_JIT)
def quantize_levels_serial(x, xb, d, s, l2, k0, k1, scales, scales_u, levels, bad):
    """:func:`quantize_levels` on one thread (small inputs: no thread wake-up cost)."""
    for bk in range(scales.shape[0]):
        _quantize_bucket(x, xb, bk, d, s, l2, k0, k1, scales, scales_u, levels, bad)


@njit(**_JIT)
def _pack(buf, m, b, body, pos, acc, nacc):
    """Append m codes of b bits (LSB-first) to body at byte pos; returns (pos, acc, nacc)."""
    start = 0
    if nacc == 0:
        if b == 4:
            full = m // 2
            dst = body[pos:pos + full]
            for k in range(full):
                dst[k] = np.uint8(buf[2 * k] | (buf[2 * k + 1] << 4))
            pos += full
            start = 2 * full
        elif b == 8:
            dst = body[pos:pos + m]
            for k in range(m):
                dst[k] = np.uint8(buf[k])
            pos += m
            start = m
        elif b == 2:
            full = m // 4
            dst = body[pos:pos + full]
            for k in range(full):
                dst[k] = np.uint8(buf[4 * k] | (buf[4 * k + 1] << 2)
                                  | (buf[4 * k + 2] << 4) | (buf[4 * k + 3] << 6))
            pos += full
            start = 4 * full
    for k in range(start, m):
        acc |= np.uint64(buf[k]) << np.uint64(nacc)
        nacc += b
        while nacc >= 8:
            body[pos] = np.uint8(acc & np.uint64(0xFF))
            acc >>= np.uint64(8)
            nacc -= 8
            pos += 1
    return pos, acc, nacc


@njit(**_JIT)
def _encode_chunk(c, x, xb, d, s, b, l2, k0, k1, chunk_buckets, scales, scales_u, body, buf, bad):
    n = x.shape[0]
    nb = scales.shape[0]
    blk = buf.shape[0]
    b0 = c * chunk_buckets
    b1 = min(nb, b0 + chunk_buckets)
    pos = (b0 * d * b) // 8
    acc = np.uint64(0)
    nacc = 0
    for bk in range(b0, b1):
        i0 = bk * d
        i1 = min(n, i0 + d)
        scale, finite = _bucket_scale(x, xb, i0, i1, l2, scales, scales_u, bk)
        if not finite:
            bad[bk] = 1
        inv, scale = _inverse(scale, s)
        scales[bk] = scale
        j = i0
        while j < i1:
            m = min(blk, i1 - j)
            _quantize_into(x, j, j + m, inv, s, k0, k1, s, buf, 0)
            pos, acc, nacc = _pack(buf, m, b, body, pos, acc, nacc)
            j += m
    if nacc > 0:
        body[pos] = np.uint8(acc & np.uint64(0xFF))


@njit(**_PJIT)
def encode_packed(x, xb, d, s, b, l2, k0, k1, chunk_buckets, scales, scales_u, body, scratch, bad):
    """Fused quantize + pack: fp32 scales into ``scales``, codes ``level + s`` into ``body``.

    ``chunk_buckets * d * b`` must be a multiple of 8 (chunks start on a byte).
    ``bad[b] = 1`` marks buckets with NaN or Inf.
    """
    nchunks = (scales.shape[0] + chunk_buckets - 1) // chunk_buckets
    workers = scratch.shape[0]
    for t in prange(workers):
        for c in range(t, nchunks, workers):
            _encode_chunk(c, x, xb, d, s, b, l2, k0, k1, chunk_buckets, scales, scales_u, body,
                          scratch[t], bad)


@njit(**_JIT)
def encode_packed_serial(x, xb, d, s, b, l2, k0, k1, chunk_buckets, scales, scales_u, body, scratch, bad):
    """:func:`encode_packed` on one thread."""
    nchunks = (scales.shape[0] + chunk_buckets - 1) // chunk_buckets
    for c in range(nchunks):
        _encode_chunk(c, x, xb, d, s, b, l2, k0, k1, chunk_buckets, scales, scales_u, body,
                      scratch[0], bad)


@njit(**_JIT)
def _unpack(body, pos, acc, nacc, b, m, buf):
    """Read m codes of b bits (LSB-first) from body into buf; returns (pos, acc, nacc)."""
    start = 0
    if nacc == 0:
        if b == 4:
            full = m // 2
            src = body[pos:pos + full]
            for k in range(full):
                byte = src[k]
                buf[2 * k] = byte & 15
                buf[2 * k + 1] = byte >> 4
            pos += full
            start = 2 * full
        elif b == 8:
            src = body[pos:pos + m]
            for k in range(m):
                buf[k] = src[k]
            pos += m
            start = m
        elif b == 2:
            full = m // 4
            src = body[pos:pos + full]
            for k in range(full):
                byte = src[k]
                buf[4 * k] = byte & 3
                buf[4 * k + 1] = (byte >> 2) & 3
                buf[4 * k + 2] = (byte >> 4) & 3
                buf[4 * k + 3] = byte >> 6
            pos += full
            start = 4 * full
    mask = np.uint64((1 << b) - 1)
    for k in range(start, m):
        while nacc < b:
            acc |= np.uint64(body[pos]) << np.uint64(nacc)
            pos += 1
            nacc += 8
        buf[k] = acc & mask
        acc >>= np.uint64(b)
        nacc -= b
    return pos, acc, nacc


@njit(**_JIT)
def _decode_chunk(c, body, scales, n, d, s, b, chunk_buckets, out, buf, err_kind, err_bucket):
    nb = scales.shape[0]
    blk = buf.shape[0]
    sf = np.float32(s)
    top = 2 * s
    b0 = c * chunk_buckets
    b1 = min(nb, b0 + chunk_buckets)
    pos = (b0 * d * b) // 8
    acc = np.uint64(0)
    nacc = 0
    for bk in range(b0, b1):
        i0 = bk * d
        i1 = min(n, i0 + d)
        step = np.float32(scales[bk] / sf)
        j = i0
        while j < i1:
            m = min(blk, i1 - j)
            pos, acc, nacc = _unpack(body, pos, acc, nacc, b, m, buf)
            worst = 0
            dst = out[j:j + m]
            for k in range(m):
                code = np.int32(buf[k])
                if code > worst:
                    worst = code
                dst[k] = np.float32(np.float32(code - s) * step)
            if worst > top and err_kind[c] == OK:
                err_kind[c] = E_CODE
                err_bucket[c] = bk
            if step == np.float32(0.0) and err_kind[c] == OK:
                for k in range(m):
                    if buf[k] != s:
                        err_kind[c] = E_ZERO_SCALE
                        err_bucket[c] = bk
                        break
            j += m


@njit(**_PJIT)
def decode_packed(body, scales, n, d, s, b, chunk_buckets, out, scratch, err_kind, err_bucket):
    """Unpack codes and dequantize into fp32 ``out``; per chunk, the first error found.

    ``body`` must hold exactly ``ceil(n * b / 8)`` bytes and ``scales`` be finite and >= 0
    (the caller checks both); codes above ``2 s`` and nonzero levels under a zero scale are
    reported in ``err_kind[c]`` / ``err_bucket[c]``.
    """
    nchunks = (scales.shape[0] + chunk_buckets - 1) // chunk_buckets
    workers = scratch.shape[0]
    for t in prange(workers):
        for c in range(t, nchunks, workers):
            _decode_chunk(c, body, scales, n, d, s, b, chunk_buckets, out, scratch[t], err_kind, err_bucket)


@njit(**_JIT)
def decode_packed_serial(body, scales, n, d, s, b, chunk_buckets, out, scratch, err_kind, err_bucket):
    """:func:`decode_packed` on one thread."""
    nchunks = (scales.shape[0] + chunk_buckets - 1) // chunk_buckets
    for c in range(nchunks):
        _decode_chunk(c, body, scales, n, d, s, b, chunk_buckets, out, scratch[0], err_kind, err_bucket)


# ---------------------------------------------------------------------------------------------
# Elias omega coding (MSB-first bit stream). Layout per bucket: 32-bit scale, omega(nnz + 1),
# then for each nonzero omega(gap), one sign bit (1 = negative), omega(|level|).


@njit(**_JIT)
def _bitlen(k):
    """Number of bits of k >= 0 (binary search: no data-dependent loop)."""
    n = 0
    if k >= (1 << 32):
        k >>= 32
        n += 32
    if k >= (1 << 16):
        k >>= 16
        n += 16
    if k >= (1 << 8):
        k >>= 8
        n += 8
    if k >= (1 << 4):
        k >>= 4
        n += 4
    if k >= (1 << 2):
        k >>= 2
        n += 2
    if k >= 2:
        k >>= 1
        n += 1
    return n + k


@njit(**_JIT)
def omega_code(k):
    """(code, length) of the Elias omega code of k >= 1, the code in the low ``length`` bits."""
    code = np.uint64(0)
    length = 1  # the terminating "0"
    while k > 1:
        nb = _bitlen(k)
        code |= np.uint64(k) << np.uint64(length)
        length += nb
        k = nb - 1
    return code, length


@njit(**_JIT)
def omega_length(k):
    length = 1
    while k > 1:
        nb = _bitlen(k)
        length += nb
        k = nb - 1
    return length


#: omega codes of 1..OMEGA_TABLE-1 are looked up (gaps and levels are mostly small).
OMEGA_TABLE = 4096


@njit(**_JIT)
def omega_tables():
    """(codes, lengths) of the omega codes of 0..OMEGA_TABLE-1 (entry 0 unused)."""
    codes = np.zeros(OMEGA_TABLE, dtype=np.uint64)
    lengths = np.zeros(OMEGA_TABLE, dtype=np.int64)
    for k in range(1, OMEGA_TABLE):
        codes[k], lengths[k] = omega_code(k)
    return codes, lengths


@njit(**_JIT)
def _omega(k, tcodes, tlengths):
    if k < OMEGA_TABLE:
        return tcodes[k], tlengths[k]
    return omega_code(k)


@njit(**_JIT)
def _elias_bits_bucket(levels, d, bk, tlengths, nnzs):
    n = levels.shape[0]
    i0 = bk * d
    i1 = min(n, i0 + d)
    total = 0
    nnz = 0
    prev = i0 - 1
    for i in range(i0, i1):
        lv = np.int64(levels[i])
        if lv != 0:
            gap = i - prev
            lg = tlengths[gap] if gap < OMEGA_TABLE else omega_length(gap)
            a = abs(lv)
            la = tlengths[a] if a < OMEGA_TABLE else omega_length(a)
            total += lg + 1 + la
            prev = i
            nnz += 1
    nnzs[bk] = nnz
    return 32 + omega_length(nnz + 1) + total


@njit(**_PJIT)
def elias_bucket_bits(levels, d, tlengths, bits, nnzs):
    """Bits of each bucket's Elias coding into ``bits`` and its nonzeros into ``nnzs``."""
    for bk in prange(bits.shape[0]):
        bits[bk] = _elias_bits_bucket(levels, d, bk, tlengths, nnzs)


@njit(**_JIT)
def elias_bucket_bits_serial(levels, d, tlengths, bits, nnzs):
    """:func:`elias_bucket_bits` on one thread."""
    for bk in range(bits.shape[0]):
        bits[bk] = _elias_bits_bucket(levels, d, bk, tlengths, nnzs)


@njit(**_JIT)
def _put(body, pos, first, last, acc, nacc, value, length, head, tail, c):
    """Append ``length`` bits of ``value`` MSB-first; bytes at ``first``/``last`` go to head/tail."""
    acc = (acc << np.uint64(length)) | value
    nacc += length
    while nacc >= 8:
        nacc -= 8
        byte = np.uint8((acc >> np.uint64(nacc)) & np.uint64(0xFF))
        if pos == first:
            head[c] = byte
        elif pos == last:
            tail[c] = byte
        else:
            body[pos] = byte
        pos += 1
        acc &= (np.uint64(1) << np.uint64(nacc)) - np.uint64(1)
    return pos, acc, nacc


@njit(**_JIT)
def _elias_write_chunk(c, levels, scale_bits, nnzs, d, offsets, chunk_buckets, tcodes, tlengths,
                       body, head, tail):
    n = levels.shape[0]
    nb = scale_bits.shape[0]
    b0 = c * chunk_buckets
    b1 = min(nb, b0 + chunk_buckets)
    start = offsets[b0]
    stop = offsets[b1]
    first = start // 8
    last = (stop - 1) // 8
    pos = first
    acc = np.uint64(0)
    nacc = start % 8
    for bk in range(b0, b1):
        i0 = bk * d
        i1 = min(n, i0 + d)
        pos, acc, nacc = _put(body, pos, first, last, acc, nacc,
                              np.uint64(scale_bits[bk]), 32, head, tail, c)
        code, length = _omega(nnzs[bk] + 1, tcodes, tlengths)
        pos, acc, nacc = _put(body, pos, first, last, acc, nacc, code, length, head, tail, c)
        prev = i0 - 1
        for i in range(i0, i1):
            lv = np.int64(levels[i])
            if lv != 0:
                gcode, glen = _omega(i - prev, tcodes, tlengths)
                code, length = _omega(abs(lv), tcodes, tlengths)
                sign = np.uint64(1) if lv < 0 else np.uint64(0)
                code |= sign << np.uint64(length)
                length += 1
                if glen + length <= 48:  # one append: the accumulator holds < 8 + 48 bits
                    code |= gcode << np.uint64(length)
                    length += glen
                else:
                    pos, acc, nacc = _put(body, pos, first, last, acc, nacc, gcode, glen,
                                          head, tail, c)
                pos, acc, nacc = _put(body, pos, first, last, acc, nacc, code, length,
                                      head, tail, c)
                prev = i
    if nacc > 0:
        byte = np.uint8((acc << np.uint64(8 - nacc)) & np.uint64(0xFF))
        if pos == first:
            head[c] = byte
        else:
            tail[c] = byte


@njit(**_PJIT)
def elias_write(levels, scale_bits, nnzs, d, offsets, chunk_buckets, tcodes, tlengths, body,
                head, tail):
    """Write the Elias coding of every bucket at bit ``offsets[b]`` of a zeroed ``body``.

    The first and last byte of chunk ``c`` may be shared with a neighbour: they are returned in
    ``head[c]`` / ``tail[c]`` for the caller to OR in after the parallel loop.
    """
    nchunks = (scale_bits.shape[0] + chunk_buckets - 1) // chunk_buckets
    for c in prange(nchunks):
        _elias_write_chunk(c, levels, scale_bits, nnzs, d, offsets, chunk_buckets, tcodes,
                           tlengths, body, head, tail)


@njit(**_JIT)
def elias_write_serial(levels, scale_bits, nnzs, d, offsets, chunk_buckets, tcodes, tlengths,
                       body, head, tail):
    """:func:`elias_write` on one thread."""
    nchunks = (scale_bits.shape[0] + chunk_buckets - 1) // chunk_buckets
    for c in range(nchunks):
        _elias_write_chunk(c, levels, scale_bits, nnzs, d, offsets, chunk_buckets, tcodes,
                           tlengths, body, head, tail)


@njit(**_JIT)
def _read_bits(body, pos, count, end):
    """(value, pos) of ``count`` <= 32 bits at bit ``pos``, MSB-first; pos = -1 past ``end``."""
    if pos + count > end:
        return np.uint64(0), -1
    value = np.uint64(0)
    while count > 0:
        byte = np.uint64(body[pos >> 3])
        avail = 8 - (pos & 7)
        take = min(avail, count)
        shift = avail - take
        bits = (byte >> np.uint64(shift)) & np.uint64((1 << take) - 1)
        value = (value << np.uint64(take)) | bits
        pos += take
        count -= take
    return value, pos


@njit(**_JIT)
def _read_omega(body, pos, end, limit):
    """(k, pos, err) of one omega code; refuses codes for k > limit (<= 2**31)."""
    n = 1
    while True:
        bit, pos = _read_bits(body, pos, 1, end)
        if pos < 0:
            return 0, pos, E_TRUNCATED
        if bit == 0:
            return n, pos, OK
        # the group is n + 1 bits whose first bit (1) was just read
        if n + 1 > 32 or (np.int64(1) << n) > limit:
            return 0, pos, E_OMEGA_TOO_LONG
        rest, pos = _read_bits(body, pos, n, end)
        if pos < 0:
            return 0, pos, E_TRUNCATED
        n = np.int64((np.uint64(1) << np.uint64(n)) | rest)


@njit(**_JIT)
def elias_decode(body, n, d, s, out):
    """Decode an Elias body into the zeroed fp32 ``out``; returns (err, bucket, bit position).

    Every read is bounds-checked against the body's end, every count against its bucket, so a
    corrupt body ends with an error code, never with an out-of-bounds read or an endless loop.
    """
    end = np.int64(body.shape[0]) * 8
    pos = np.int64(0)
    nb = (n + d - 1) // d
    sf = np.float32(s)
    fbits = np.empty(1, np.uint32)
    fview = fbits.view(np.float32)
    for bk in range(nb):
        i0 = bk * d
        size = min(n, i0 + d) - i0
        raw, pos2 = _read_bits(body, pos, 32, end)
        if pos2 < 0:
            return E_TRUNCATED, bk, pos
        if np.uint32(raw) >= _EXP_ALL_ONES:
            # negative, Inf or NaN scale: no encoder writes one
            return E_SCALE, bk, pos
        pos = pos2
        fbits[0] = np.uint32(raw)
        step = np.float32(fview[0] / sf)
        cnt, pos2, e = _read_omega(body, pos, end, size + 1)
        if e != OK:
            return e, bk, pos
        pos = pos2
        nnz = cnt - 1
        if nnz > size:
            return E_NNZ, bk, pos
        if nnz > 0 and step == np.float32(0.0):
            return E_ZERO_SCALE, bk, pos
        prev = -1
        for _ in range(nnz):
            gap, pos2, e = _read_omega(body, pos, end, size)
            if e != OK:
                return e, bk, pos
            if prev + gap >= size:
                return E_GAP, bk, pos
            pos = pos2
            prev += gap
            sign, pos2 = _read_bits(body, pos, 1, end)
            if pos2 < 0:
                return E_TRUNCATED, bk, pos
            pos = pos2
            lv, pos2, e = _read_omega(body, pos, end, s)
            if e != OK:
                return e, bk, pos
            if lv > s:
                return E_LEVEL, bk, pos
            pos = pos2
            value = np.float32(np.float32(lv) * step)
            out[i0 + prev] = -value if sign else value
    used = (pos + 7) // 8
    if used != body.shape[0]:
        return E_TRAILING, nb, pos
    if pos % 8 != 0:
        pad, _ = _read_bits(body, pos, 8 - pos % 8, end)
        if pad != 0:
            return E_PADDING, nb, pos
    return OK, nb, pos
