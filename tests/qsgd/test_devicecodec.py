"""The packed codec with its checks on the device (qsgd.devicecodec, qsgd.crc): the bytes of the
host codec, and a False flag, never a silent decode, for every kind of damage."""
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

import qsgd
from qsgd import PayloadError, QSGDConfig, devicecodec, rng, wire
from qsgd.crc import CHUNK, crc32_tensor


@pytest.mark.parametrize("n", [0, 1, 3, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 7, 70_001])
def test_crc32_tensor_is_zlibs(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    got = crc32_tensor(torch.from_numpy(data))
    assert got.dtype == torch.uint8 and got.shape == (4,)
    assert int.from_bytes(bytes(got.tolist()), "little") == zlib.crc32(data.tobytes())


def test_crc32_tensor_spans_several_pieces(monkeypatch):
    # the matrix products run piece by piece; the pieces must join into one CRC
    from qsgd import crc

    monkeypatch.setattr(crc, "PIECE", 4 * CHUNK)
    data = np.random.default_rng(3).integers(0, 256, 37 * CHUNK + 11, dtype=np.uint8)
    got = crc32_tensor(torch.from_numpy(data))
    assert int.from_bytes(bytes(got.tolist()), "little") == zlib.crc32(data.tobytes())


def test_crc32_tensor_rejects_other_tensors():
    with pytest.raises(ValueError, match="1-D torch.uint8"):
        crc32_tensor(torch.zeros(4, dtype=torch.int32))


CASES = [(QSGDConfig.from_bits(b, bucket_size=d), n, dtype)
         for b, d, n in [(2, 512, 10_001), (3, 100, 4_099), (4, 512, 65_536), (8, 128, 1_000),
                         (5, 7, 33)]
         for dtype in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("cfg,n,dtype", CASES)
def test_device_payload_is_the_host_payload(cfg, n, dtype):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    key = rng.stream_key(11, 2, 5, 3)
    flat = x.float()
    payload, finite = devicecodec.encode(flat, cfg, key, dtype)
    host = qsgd.encode(x, cfg, seed=11, rank=2, step=5, bucket=3)
    assert bool(finite) and torch.equal(payload, host)
    y, ok = devicecodec.decode(payload, n, cfg, dtype)
    assert bool(ok)
    assert torch.equal(y.to(dtype), qsgd.decode(host))


def test_shaped_payload_matches_the_public_encoder():
    cfg = QSGDConfig.from_bits(4, bucket_size=64)
    x = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    payload, _ = devicecodec.encode(x.reshape(-1), cfg, rng.stream_key(1), x.dtype, x.shape)
    assert torch.equal(payload, qsgd.encode(x, cfg, seed=1))
    assert bool(devicecodec.decode(payload, 300, cfg, shape=(6, 50))[1])
    assert not bool(devicecodec.decode(payload, 300, cfg, shape=(5, 60))[1])  # header differs
    with pytest.raises(PayloadError, match=r"is \d+ uint8 bytes, got \d+ torch.uint8"):  # a 2-D header is longer
        devicecodec.decode(payload, 300, cfg, shape=(300,))


def test_non_finite_input_is_flagged_and_its_payload_rejected_by_every_decoder():
    cfg = QSGDConfig.from_bits(4)
    x = torch.ones(1000)
    x[17] = float("nan")
    payload, finite = devicecodec.encode(x, cfg, rng.stream_key(0))
    assert not bool(finite)
    assert not bool(devicecodec.decode(payload, 1000, cfg)[1])
    with pytest.raises(PayloadError, match="bucket 0 has an invalid scale nan"):
        qsgd.decode(payload)


def _fixed_crc(p: torch.Tensor) -> torch.Tensor:
    p = p.clone()
    p[-4:] = torch.tensor(list(zlib.crc32(p[:-4].numpy().tobytes()).to_bytes(4, "little")),
                          dtype=torch.uint8)
    return p


@pytest.mark.parametrize("bits,d,n", [(3, 100, 1001),    # s = 3: codes 0..6 in 3 bits, 7 is bad
                                      (4, 128, 1001)])   # s = 7: codes 0..14 in 4 bits (fused kernels)
def test_every_damage_is_flagged_and_the_host_decoder_names_it(bits, d, n):
    cfg = QSGDConfig.from_bits(bits, bucket_size=d)
    assert n * bits % 8                               # padding bits in the last byte
    x = torch.randn(n, generator=torch.Generator().manual_seed(5))
    good = qsgd.encode(x, cfg, seed=2)
    hdr = wire.header_nbytes(1)
    nb = -(-n // cfg.bucket_size)
    top = (1 << bits) - 1                             # above 2 s in both configs
    cases = {}
    p = good.clone(); p[hdr + 4 * nb + 10] ^= 0x10; cases["crc"] = (p, "CRC-32 mismatch")
    p = good.clone(); p[8] ^= 1; cases["header"] = (p, "CRC-32 mismatch")     # levels field
    p = good.clone(); p[hdr + 3] = 0xFF; cases["scale"] = (_fixed_crc(p), "invalid scale")
    p = good.clone(); p[hdr + 4 * nb] |= top; cases["code"] = (_fixed_crc(p), "a code above")
    p = good.clone(); p[-5] |= 0x80; cases["padding"] = (_fixed_crc(p), "nonzero padding")
    zero = qsgd.encode(torch.cat([torch.zeros(d), x[d:]]), cfg, seed=2)
    p = zero.clone(); p[hdr + 4 * nb] = 0x01; cases["zero scale"] = (_fixed_crc(p), "scale 0 but nonzero")
    for what, (bad, message) in cases.items():
        _, ok = devicecodec.decode(bad, n, cfg)
        assert not bool(ok), what
        with pytest.raises(PayloadError, match=message):
            qsgd.decode(bad)
    assert bool(devicecodec.decode(good, n, cfg)[1])


def test_wrong_length_is_refused_at_once():
    cfg = QSGDConfig.from_bits(4)
    good = qsgd.encode(torch.ones(100), cfg)
    with pytest.raises(PayloadError, match=r"of 100 elements at 4 bits is \d+ uint8 bytes, got"):
        devicecodec.decode(good[:-1], 100, cfg)


def test_torch_backend_decodes_to_the_same_values_and_names_damage():
    # the torch decoder (the one non-CPU devices use) checks with the same device ops
    from qsgd import packed

    cfg = QSGDConfig.from_bits(3, bucket_size=100)
    x = torch.randn(1001, generator=torch.Generator().manual_seed(6))
    header, body = wire.parse(wire.as_bytes(qsgd.encode(x, cfg, seed=4)))
    assert torch.equal(packed.decode_torch(body, 1001, cfg, "cpu"), packed.decode_numba(body, 1001, cfg))
    bad = body.copy()
    bad[4 * 11] |= 0x7
    with pytest.raises(PayloadError, match=r"a code above 2\*levels \(= 6\) in bucket 0"):
        packed.decode_torch(bad, 1001, cfg, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_encode_and_decode_make_no_host_synchronisation():
    cfg = QSGDConfig.from_bits(4)
    x = torch.randn(1 << 20, device="cuda")
    key = rng.stream_key(1)
    devicecodec.decode(devicecodec.encode(x, cfg, key)[0], x.numel(), cfg)   # constants cached
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        payload, finite = devicecodec.encode(x, cfg, key)
        y, ok = devicecodec.decode(payload, x.numel(), cfg)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool(finite) and bool(ok)
    assert torch.equal(payload.cpu(), qsgd.encode(x.cpu(), cfg, seed=1))
    assert torch.equal(y.cpu(), qsgd.decode(payload.cpu()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_public_decode_checks_on_the_device_and_names_damage():
    cfg = QSGDConfig.from_bits(4)
    x = torch.randn(100_000, device="cuda")
    payload = qsgd.encode(x, cfg, seed=2)
    assert torch.equal(qsgd.decode(payload).cpu(), qsgd.decode(payload.cpu()))
    bad = payload.clone()
    bad[1000] ^= 0x01
    with pytest.raises(PayloadError, match="CRC-32 mismatch"):
        qsgd.decode(bad)
    with pytest.raises(PayloadError, match="payload truncated"):
        qsgd.decode(payload[:-1])


def test_fused_kernels_fall_back_with_a_warning_when_they_fail(monkeypatch):
    # a Triton whose kernels do not build (or give other bytes) costs speed, never a payload
    from qsgd import _triton

    def broken(*args, **kwargs):
        raise RuntimeError("no such intrinsic")

    monkeypatch.setattr(_triton, "_kernels", lambda: object())   # "installed"
    monkeypatch.setattr(_triton, "_WORKS", {})
    monkeypatch.setattr(_triton, "encode_into", broken)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = QSGDConfig.from_bits(4)
    with pytest.warns(RuntimeWarning, match="fused Triton codec kernels are off on cpu "
                                            r"\(RuntimeError: no such intrinsic\)"):
        assert not _triton.usable(torch.ones(10), cfg)
    assert not _triton.usable(torch.ones(10), cfg)              # decided once per device
    with pytest.warns(RuntimeWarning, match="fused Triton crc kernels are off on cpu"):
        payload, finite = devicecodec.encode(torch.ones(1000), cfg, rng.stream_key(0))
    assert torch.equal(payload, qsgd.encode(torch.ones(1000), cfg))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runs_the_fused_kernels_where_triton_is_installed():
    from qsgd import _triton

    if _triton._kernels() is None:
        pytest.skip("Triton is not installed: the torch path is the CUDA codec")
    assert _triton.usable(torch.ones(10, device="cuda"), QSGDConfig.from_bits(4))
    assert _triton.usable_for_crc(torch.ones(10, dtype=torch.uint8, device="cuda"))


def test_interpreter_runs_the_fused_kernels():
    # meaningful where TRITON_INTERPRET=1 was set before qsgd was imported: the run of this
    # file that test_fused_kernels_in_triton_interpreter starts
    from qsgd import _triton

    if os.environ.get("TRITON_INTERPRET") != "1" or _triton._kernels() is None:
        pytest.skip("runs in the TRITON_INTERPRET=1 run of this file")
    assert _triton.usable(torch.ones(10), QSGDConfig.from_bits(4))
    assert _triton.usable_for_crc(torch.ones(10, dtype=torch.uint8))
    assert not _triton.usable(torch.ones(10), QSGDConfig.from_bits(3))   # 3-bit: torch path


@pytest.mark.slow
def test_fused_kernels_in_triton_interpreter():
    """This file again with TRITON_INTERPRET=1: every payload test above then runs the fused
    kernels on CPU tensors, against the numba codec's bytes."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("already the interpreter run")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        __file__], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "runs in the TRITON_INTERPRET=1 run" not in r.stdout
