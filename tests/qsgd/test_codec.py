"""encode/decode round trips: decode(encode(x)) == dequantize(quantize(x)) bit for bit."""
import pytest
import torch

from qsgd import ConfigError, PayloadError, QSGDConfig, decode, dequantize, encode, payload_nbytes, quantize

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (2, 0, 3), (), (1,), (7,), (513,), (3, 5, 67)]
CONFIGS = [QSGDConfig(), QSGDConfig(levels=1, bucket_size=7, norm="l2"), QSGDConfig(levels=2, bucket_size=5),
           QSGDConfig(levels=127, bucket_size=64), QSGDConfig(levels=1000, bucket_size=33, norm="l2"),
           QSGDConfig(levels=32767, bucket_size=1)]


def _bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("codec", ["packed", "elias"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"s{c.levels}d{c.bucket_size}{c.norm}")
def test_round_trip_equals_dequantize(codec, dtype, cfg):
    cfg = QSGDConfig(levels=cfg.levels, bucket_size=cfg.bucket_size, norm=cfg.norm, codec=codec)
    gen = torch.Generator().manual_seed(cfg.levels + cfg.bucket_size)
    for shape in SHAPES:
        x = (torch.randn(shape, generator=gen) * 5).to(dtype)
        payload = encode(x, cfg, seed=3, rank=1, step=2, bucket=4)
        assert payload.dtype == torch.uint8 and payload.dim() == 1
        y = decode(payload)
        want = dequantize(quantize(x, cfg, seed=3, rank=1, step=2, bucket=4))
        assert y.shape == x.shape and y.dtype == dtype
        assert torch.equal(_bits(y), _bits(want)), shape
        if codec == "packed":
            assert payload.numel() == payload_nbytes(x.numel(), cfg, ndim=x.dim())
        # the torch path writes the same bytes
        assert torch.equal(payload, encode(x, cfg, seed=3, rank=1, step=2, bucket=4, backend="torch"))


@pytest.mark.parametrize("codec", ["packed", "elias"])
@pytest.mark.parametrize("cfg", [QSGDConfig.from_bits(2, bucket_size=128), QSGDConfig.from_bits(4, bucket_size=100),
                                 QSGDConfig.from_bits(8, norm="l2"), QSGDConfig(levels=5, bucket_size=37)], ids=str)
def test_parallel_kernels_round_trip(codec, cfg):
    # large enough for the multi-threaded kernels, with a tail bucket and unaligned chunks
    cfg = QSGDConfig(levels=cfg.levels, bucket_size=cfg.bucket_size, norm=cfg.norm, codec=codec)
    x = torch.randn(300_007, generator=torch.Generator().manual_seed(1))
    x[1000:5000] = 0
    payload = encode(x, cfg, seed=8)
    assert torch.equal(payload, encode(x, cfg, seed=8, backend="torch"))
    assert torch.equal(decode(payload), dequantize(quantize(x, cfg, seed=8)))


def test_payload_nbytes_formula():
    for n in (0, 1, 7, 511, 512, 513, 10**6 + 3):
        for b in (2, 3, 4, 8, 13, 16):
            for d in (1, 100, 512):
                cfg = QSGDConfig.from_bits(b, bucket_size=d)
                want = -(-n * b // 8) + 4 * -(-n // d) + 24 + 8 + 4
                assert payload_nbytes(n, cfg) == want
    assert payload_nbytes(12, QSGDConfig(), ndim=3) == payload_nbytes(12, QSGDConfig()) + 16
    assert payload_nbytes(1, QSGDConfig(), ndim=0) == 1 + 4 + 28
    assert encode(torch.tensor(1.5), QSGDConfig()).numel() == payload_nbytes(1, QSGDConfig(), ndim=0)


def test_payload_nbytes_errors():
    with pytest.raises(ConfigError, match=r"exact only for codec='packed', got codec='elias'"):
        payload_nbytes(10, QSGDConfig(codec="elias"))
    with pytest.raises(ValueError, match=r"numel must be an int >= 0, got -1"):
        payload_nbytes(-1, QSGDConfig())
    with pytest.raises(ValueError, match=r"ndim must be an int in \[0, 64\], got 65"):
        payload_nbytes(1, QSGDConfig(), ndim=65)
    with pytest.raises(ValueError, match=r"a 0-D tensor has 1 element, got numel=4"):
        payload_nbytes(4, QSGDConfig(), ndim=0)


def test_compression_of_packed_and_elias():
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(2))
    raw = x.numel() * 4
    p4 = encode(x, QSGDConfig.from_bits(4))
    assert 7.5 < raw / p4.numel() < 8  # 4 bits plus a scale per 512
    # at s = 1 most levels are zero under the max norm: Elias beats 2-bit packing
    e1 = encode(x, QSGDConfig(levels=1, codec="elias"))
    p2 = encode(x, QSGDConfig(levels=1))
    assert e1.numel() < p2.numel()


def test_decode_accepts_bytes_and_device():
    x = torch.randn(100)
    payload = encode(x, QSGDConfig())
    want = decode(payload)
    assert torch.equal(decode(bytes(payload.numpy())), want)
    assert torch.equal(decode(bytearray(payload.numpy()), device="cpu"), want)
    assert torch.equal(decode(payload.numpy()), want)


def test_encode_refuses_nan_and_bad_input():
    x = torch.ones(10)
    x[4] = float("nan")
    for codec in ("packed", "elias"):
        with pytest.raises(ValueError, match=r"x holds 1 NaN or Inf value\(s\); the first at flat index 4"):
            encode(x, QSGDConfig(codec=codec))
        with pytest.raises(ValueError, match=r"x holds 1 NaN"):
            encode(x, QSGDConfig(codec=codec), backend="torch")
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor"):
        encode(x.numpy(), QSGDConfig())
    with pytest.raises(PayloadError, match=r"payload dtype must be torch.uint8, got torch.float32"):
        decode(torch.ones(40))
    with pytest.raises(PayloadError, match=r"payload must be 1-D, got shape \(2, 40\)"):
        decode(torch.ones(2, 40, dtype=torch.uint8))
    with pytest.raises(PayloadError, match=r"payload must be a uint8 tensor or bytes, got list"):
        decode([1, 2, 3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_trip_matches_cpu():
    x = torch.randn(200_003)
    for codec in ("packed", "elias"):
        for cfg in CONFIGS:
            cfg = QSGDConfig(levels=cfg.levels, bucket_size=cfg.bucket_size, norm="max", codec=codec)
            p_cpu = encode(x, cfg, seed=1)
            p_gpu = encode(x.cuda(), cfg, seed=1)
            assert p_gpu.is_cuda
            assert torch.equal(p_cpu, p_gpu.cpu())
            y = decode(p_gpu)
            assert y.is_cuda
            assert torch.equal(y.cpu(), decode(p_cpu))
