"""The wire format: every header field, truncation, extension and bit flip is caught."""
import struct
import zlib

import numpy as np
import pytest
import torch

from qsgd import PayloadError, QSGDConfig, decode, encode, wire


def _small(codec):
    x = torch.randn(2, 9, generator=torch.Generator().manual_seed(0))
    return encode(x, QSGDConfig(levels=3, bucket_size=8, codec=codec)).numpy()


def _reseal(buf):
    buf = buf.copy()
    struct.pack_into("<I", buf, buf.shape[0] - 4, zlib.crc32(buf[:-4].tobytes()))
    return buf


def test_layout_matches_docstring():
    buf = _small("packed")
    magic, version, codec, dtype, norm, levels, ndim, reserved, d, body = wire.FIXED.unpack_from(buf, 0)
    assert (magic, version, codec, dtype, norm, levels, ndim, reserved, d) == (b"QSGD", 1, 0, 0, 0, 3, 2, 0, 8)
    assert struct.unpack_from("<2Q", buf, 24) == (2, 9)
    assert buf.shape[0] == 24 + 16 + body + 4
    assert body == 4 * 3 + -(-18 * 3 // 8)
    assert struct.unpack_from("<I", buf, buf.shape[0] - 4)[0] == zlib.crc32(buf[:-4].tobytes())
    # packed body: three fp32 scales, then 3-bit codes LSB-first
    header, body_view = wire.parse(buf)
    assert header.shape == (2, 9) and header.cfg == QSGDConfig(levels=3, bucket_size=8)
    x = torch.randn(2, 9, generator=torch.Generator().manual_seed(0)).reshape(-1)
    want = np.array([float(x[i:i + 8].abs().max()) for i in (0, 8, 16)], dtype=np.float32)
    assert np.array_equal(body_view[:12].view(np.float32), want)


@pytest.mark.parametrize("codec", ["packed", "elias"])
def test_every_single_bit_flip_is_detected(codec):
    buf = _small(codec)
    good = decode(buf)
    for bit in range(buf.shape[0] * 8):
        bad = buf.copy()
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(PayloadError):
            decode(bad)
    assert torch.equal(decode(buf), good)


@pytest.mark.parametrize("codec", ["packed", "elias"])
def test_every_truncation_and_extension_is_detected(codec):
    buf = _small(codec)
    for size in range(buf.shape[0]):
        with pytest.raises(PayloadError, match="truncated"):
            decode(buf[:size])
    for extra in (1, 3, 100):
        with pytest.raises(PayloadError, match=f"extended: .* \\({extra} extra bytes\\)"):
            decode(np.concatenate([buf, np.zeros(extra, np.uint8)]))


@pytest.mark.parametrize("offset, value, match", [
    (0, ord("X"), r"bad magic b'XSGD', expected b'QSGD'"),
    (4, 2, r"unsupported format version 2, this decoder reads 1"),
    (5, 7, r"unknown codec code 7"),
    (6, 9, r"unknown dtype code 9"),
    (7, 5, r"unknown norm code 5"),
    (11, 1, r"reserved header byte is 1, expected 0"),
])
def test_header_fields_named_even_with_a_valid_crc(offset, value, match):
    buf = _small("packed").copy()
    buf[offset] = value
    with pytest.raises(PayloadError, match=match):
        decode(_reseal(buf))


def test_numeric_header_fields():
    buf = _small("packed")
    for fmt, offset, value, match in [("<H", 8, 0, r"levels 0 in header out of range"),
                                      ("<B", 10, 65, r"ndim 65 in header exceeds 64"),
                                      ("<I", 12, 0, r"bucket_size 0 in header out of range"),
                                      ("<Q", 24, 2**41, r"more than 1099511627776 elements")]:
        bad = buf.copy()
        struct.pack_into(fmt, bad, offset, value)
        with pytest.raises(PayloadError, match=match):
            decode(_reseal(bad))


def test_crc_mismatch_message():
    buf = _small("elias").copy()
    buf[-10] ^= 0x10
    with pytest.raises(PayloadError, match=r"CRC-32 mismatch: stored 0x[0-9a-f]{8}, computed 0x[0-9a-f]{8}"):
        decode(buf)


def test_packed_body_checks_with_valid_crc():
    buf = _small("packed")
    # a header claiming a different shape no longer fits the body's length
    bad = buf.copy()
    struct.pack_into("<Q", bad, 24, 3)
    with pytest.raises(PayloadError, match=r"packed body is 19 bytes, expected 27 for 27 elements"):
        decode(_reseal(bad))
    hdr = 24 + 16
    # a negative scale
    bad = buf.copy()
    bad[hdr + 3] |= 0x80
    with pytest.raises(PayloadError, match=r"bucket 0 has an invalid scale"):
        decode(_reseal(bad))
    # a code above 2s (3 bits hold 7 > 6)
    bad = buf.copy()
    bad[hdr + 12] |= 0b111
    with pytest.raises(PayloadError, match=r"a code above 2\*levels \(= 6\) in bucket 0"):
        decode(_reseal(bad))
    # nonzero padding bits (18 codes * 3 bits = 54 bits: the last byte uses 6)
    bad = buf.copy()
    bad[-5] |= 0x80
    with pytest.raises(PayloadError, match=r"nonzero padding bits"):
        decode(_reseal(bad))
    # a zero scale under nonzero levels
    bad = buf.copy()
    bad[hdr: hdr + 4] = 0
    with pytest.raises(PayloadError, match=r"bucket 0 has scale 0 but nonzero levels"):
        decode(_reseal(bad))
