"""Elias omega coding: known codes, the exact bucket layout, Theorem 3.2's length bound, and a
decoder that stays safe on corrupt bodies that carry a valid CRC."""
import struct

import numpy as np
import pytest
import torch

from qsgd import PayloadError, QSGDConfig, _kernels, decode, elias, encode, quantize, wire


@pytest.mark.parametrize("k, code", [(1, "0"), (2, "100"), (3, "110"), (4, "101000"), (7, "101110"),
                                     (8, "1110000"), (16, "10100100000"), (100, "1011011001000")])
def test_known_omega_codes(k, code):
    assert elias.omega_bits(k) == code
    assert elias.omega_length(k) == len(code)


def test_numba_omega_matches_reference():
    for k in list(range(1, 3000)) + [2**16 - 1, 2**16, 2**31 - 1, 2**31]:
        code, length = _kernels.omega_code(k)
        ref = elias.omega_bits(k)
        assert length == len(ref) == _kernels.omega_length(k)
        assert format(int(code), "b").zfill(length) == ref


def test_omega_reference_refuses_bad_k():
    with pytest.raises(ValueError, match=r"k must be an int >= 1, got 0"):
        elias.omega_bits(0)


def _reference_body(levels, scales, d):
    bits = []
    for b, scale in enumerate(scales):
        chunk = levels[b * d:(b + 1) * d]
        bits.append(format(struct.unpack("<I", struct.pack("<f", scale))[0], "032b"))
        nz = [i for i, v in enumerate(chunk) if v != 0]
        bits.append(elias.omega_bits(len(nz) + 1))
        prev = -1
        for i in nz:
            bits.append(elias.omega_bits(i - prev) + ("1" if chunk[i] < 0 else "0") + elias.omega_bits(abs(int(chunk[i]))))
            prev = i
    s = "".join(bits)
    s += "0" * (-len(s) % 8)
    return bytes(int(s[i:i + 8], 2) for i in range(0, len(s), 8))


@pytest.mark.parametrize("n, d, s", [(1, 1, 1), (50, 8, 1), (333, 64, 7), (1000, 10, 300), (200_011, 97, 3)])
def test_body_is_the_documented_bit_stream(n, d, s):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    cfg = QSGDConfig(levels=s, bucket_size=d, codec="elias")
    q = quantize(x, cfg, seed=2)
    _, body = wire.parse(encode(x, cfg, seed=2).numpy())
    if n > 10_000:  # the reference is slow: compare the first and last buckets only
        assert bytes(body[:20]) == _reference_body(q.levels[:d].tolist(), q.scales[:1].tolist(), d)[:20]
        assert body.shape[0] * 8 == 8 * -(-int(elias.bucket_bits(q.levels.numpy(), d).sum()) // 8)
    else:
        assert bytes(body) == _reference_body(q.levels.tolist(), q.scales.tolist(), d)


@pytest.mark.parametrize("s", [1, 3, 7, 22])  # 22 = floor(sqrt(512))
@pytest.mark.parametrize("data", ["gaussian", "flat", "spiky"])
def test_expected_bucket_length_under_theorem_3_2(s, data):
    d, k = 512, 400
    gen = torch.Generator().manual_seed(s)
    if data == "gaussian":
        x = torch.randn(k * d, generator=gen)
    elif data == "flat":
        x = torch.randint(0, 2, (k * d,), generator=gen).float() * 2 - 1
    else:  # heavy tails: a few large coordinates per bucket
        x = torch.randn(k * d, generator=gen) ** 3
    cfg = QSGDConfig(levels=s, bucket_size=d, norm="l2", codec="elias")
    q = quantize(x, cfg, seed=5)
    bits = elias.bucket_bits(q.levels.numpy(), d)
    assert float(bits.mean()) <= elias.theorem_3_2_bits(s, d)
    # the sealed payload holds exactly those bits, rounded up to a byte, plus the header
    payload = encode(x, cfg, seed=5)
    assert payload.numel() == -(-int(bits.sum()) // 8) + wire.overhead_nbytes(1)


def test_dense_levels_cost_three_bits_per_coordinate():
    # equal magnitudes at s = sqrt(d) under l2: every level is exactly 1, every gap 1, so each
    # coordinate costs omega(1) + sign + omega(1) = 3 bits
    d = 256
    x = torch.ones(d * 10)
    q = quantize(x, QSGDConfig(levels=16, bucket_size=d, norm="l2"))
    assert bool((q.levels == 1).all())
    bits = elias.bucket_bits(q.levels.numpy(), d)
    assert bits.tolist() == [32 + elias.omega_length(d + 1) + 3 * d] * 10


def _payload_with_body(cfg, shape, body):
    buf = wire.new_payload(cfg, torch.float32, shape, len(body))
    wire.body_view(buf, len(shape))[:] = np.frombuffer(bytes(body), np.uint8)
    return wire.seal(buf)


@pytest.mark.timeout(120)
def test_decoder_is_safe_on_corrupt_bodies_with_valid_crc():
    # The CRC catches corruption in transit; the decoder must stay safe without it: every
    # mutated body either raises PayloadError or decodes to a finite tensor within the scale.
    x = torch.randn(300, generator=torch.Generator().manual_seed(3))
    cfg = QSGDConfig(levels=3, bucket_size=40, codec="elias")
    _, body = wire.parse(encode(x, cfg).numpy())
    body = bytes(body)
    rng = np.random.default_rng(0)
    errors = 0
    for trial in range(3000):
        b = bytearray(body)
        kind = trial % 4
        if kind == 0:  # flip 1-3 bits
            for _ in range(rng.integers(1, 4)):
                bit = int(rng.integers(0, len(b) * 8))
                b[bit // 8] ^= 1 << (bit % 8)
        elif kind == 1:  # random bytes over a stretch
            i = int(rng.integers(0, len(b)))
            j = min(len(b), i + int(rng.integers(1, 8)))
            b[i:j] = rng.integers(0, 256, j - i, dtype=np.uint8).tobytes()
        elif kind == 2:  # truncate or extend the body (the header's length agrees)
            cut = int(rng.integers(0, len(b) + 8))
            b = b[:cut] if cut <= len(b) else b + bytes(rng.integers(0, 256, cut - len(b), dtype=np.uint8))
        else:  # pure garbage
            b = bytearray(rng.integers(0, 256, len(b), dtype=np.uint8).tobytes())
        try:
            y = decode(_payload_with_body(cfg, (300,), b))
        except PayloadError:
            errors += 1
            continue
        assert y.shape == (300,) and bool(torch.isfinite(y).all())
    assert errors > 2000  # almost every corruption is caught by the structure alone


def test_specific_body_errors():
    cfg = QSGDConfig(levels=1, bucket_size=8, codec="elias")
    scale = struct.pack(">f", 1.0)
    bits = lambda s: bytes(int(s.ljust(-(-len(s) // 8) * 8, "0")[i:i + 8], 2) for i in range(0, -(-len(s) // 8) * 8, 8))
    one = "".join(format(v, "08b") for v in scale)
    cases = [
        (b"", r"elias body of 0 bytes cannot hold 1 buckets"),
        (bits(one) + b"\xc0", r"ends inside bucket 0"),  # two nonzeros, the second cut short
        (bits(one + "0") + bits("1" * 6), r"ends inside bucket 0|bytes left"),
        (bits(one + "1110100"), r"claims more nonzeros than elements"),  # nnz + 1 = 10
        (bits(one + "100" + "1110010" + "0" + "0"), r"gap in bucket 0 .* runs past the bucket's end"),  # gap 9
        (bits("1" + one[1:] + "0"), r"negative, Inf or NaN scale"),
        (bits("0" * 32 + "100" + "0" + "0" + "0"), r"scale 0 but nonzero levels"),
        (bits(one + "0") + b"\x00", r"bytes left after the last bucket"),
        (bits(one + "0" + "1"), r"nonzero padding bits"),
        (bits(one + "1" + "1" * 40), r"longer than any valid count"),
    ]
    for body, match in cases:
        with pytest.raises(PayloadError, match=match):
            decode(_payload_with_body(cfg, (8,), body))
    # a header claiming many buckets for a short body is refused before any allocation
    with pytest.raises(PayloadError, match=r"elias body of 5 bytes cannot hold 2\*\*30 buckets|cannot hold 1073741824 buckets"):
        decode(_payload_with_body(QSGDConfig(levels=1, bucket_size=1024, codec="elias"), (2**40,), bits(one + "0")))
    # level 6 at s = 5 (omega "101100")
    with pytest.raises(PayloadError, match=r"a level in bucket 0 .* exceeds levels=5"):
        decode(_payload_with_body(QSGDConfig(levels=5, bucket_size=8, codec="elias"), (8,),
                                  bits(one + "100" + "0" + "0" + "101100")))
    # a valid hand-made body: one nonzero, -1 at index 2
    y = decode(_payload_with_body(cfg, (8,), bits(one + "100" + "110" + "1" + "0")))
    assert y.tolist() == [0, 0, -1, 0, 0, 0, 0, 0]
