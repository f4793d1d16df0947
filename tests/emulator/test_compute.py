"""ComputeModel: device table, scaling ratios, user-given seconds, errors."""
import pytest

import emulator
import qsgd
from emulator.compute import ComputeModel


def _trace(device="cuda", device_name="NVIDIA A100-SXM4-80GB"):
    it = {"index": 0, "forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.01,
          "buckets": [{"index": 0, "ready_s": 0.05, "payload_bytes": 1052, "raw_bytes": 40,
                       "encode_s": 0.001, "decode_s": 0.002}]}
    return qsgd.PayloadTrace.from_dict({
        "format": "qsgd-payload-trace", "version": 1, "model": "m", "parameters": 2010,
        "device": device, "device_name": device_name, "torch_version": "2.13.0", "batch_size": 2,
        "input_shape": [4], "config": {"levels": 7, "bucket_size": 512, "norm": "max", "codec": "packed"},
        "min_numel": 100, "bucket_cap_bytes": 26214400, "first_bucket_bytes": 1048576, "seed": 0,
        "buckets": [{"index": 0, "numel": 2010, "params": ["w", "b"], "compressed_numel": 2000,
                     "raw_numel": 10}],
        "iterations": [it]})


def test_device_table_figures_from_references():
    d = emulator.DEVICES
    assert {"K80", "V100", "A100", "H100", "H200", "measured"} <= set(d)
    assert d["A100"].peak_flops_fp32 == 19.5e12 and d["A100"].peak_flops_bf16 == 312e12
    assert d["H200"].mem_bandwidth == 4.8e12 and d["V100"].mem_bandwidth == 900e9
    assert all(dev.source for dev in d.values())


def test_scaling_from_a_known_gpu():
    cm = ComputeModel.for_device("H100", _trace())
    assert cm.compute_scale == pytest.approx(19.5 / 67)
    assert cm.codec_scale == pytest.approx(2.0 / 3.35)
    fwd, bwd, opt, rs = cm.phases(_trace())
    assert (fwd, bwd, opt) == pytest.approx((0.1 * 19.5 / 67, 0.2 * 19.5 / 67, 0.01 * 19.5 / 67))
    assert rs == pytest.approx(19.5 / 67)


def test_scaling_from_cpu_uses_host_figures():
    cm = ComputeModel.for_device("A100", _trace("cpu", "Xeon"), host_flops=19.5e10, host_bandwidth=2e10)
    assert cm.compute_scale == pytest.approx(0.01) and cm.codec_scale == pytest.approx(0.01)
    assert "host" in cm.source


def test_given_seconds_stretch_ready_offsets():
    cm = ComputeModel.given(0.5, 0.4, 0.1)
    assert cm.phases(_trace()) == pytest.approx((0.5, 0.4, 0.1, 2.0))


def test_measured_is_identity():
    assert ComputeModel.for_device("measured", _trace()).phases(_trace()) == pytest.approx((0.1, 0.2, 0.01, 1.0))


def test_measure_host_positive():
    rates = qsgd.measure_host(0.05)
    assert rates["matmul_flops"] > 1e8 and rates["copy_bandwidth"] > 1e8 and rates["method"]


def test_a_cpu_trace_scales_by_the_rates_stored_with_it():
    """The host rates measured with the trace, not this machine's, set the scale: the same on
    any machine and in every run."""
    doc = _trace(device="cpu", device_name="Some CPU").to_dict()
    doc["host"] = {"matmul_flops": 100e9, "copy_bandwidth": 10e9, "method": "m", "threads": 2}
    trace = qsgd.PayloadTrace.from_dict(doc)
    a = ComputeModel.for_device("A100", trace)
    b = ComputeModel.for_device("A100", trace)
    assert a == b and a.compute_scale == pytest.approx(100e9 / 19.5e12)
    assert a.codec_scale == pytest.approx(10e9 / 2.0e12)
    assert "host measured with the trace at 100.0 GFLOP/s, 10.0 GB/s" in a.source
    doc["host"]["matmul_flops"] = -1
    with pytest.raises(qsgd.TraceError, match=r"host\.matmul_flops must be a finite number > 0"):
        qsgd.PayloadTrace.from_dict(doc)


@pytest.mark.parametrize("kw, field", [({"compute_scale": -1.0}, "compute_scale"),
                                       ({"codec_scale": float("nan")}, "codec_scale"),
                                       ({"backward_s": -0.1}, "backward_s")])
def test_bad_fields_named(kw, field):
    with pytest.raises(emulator.ConfigError, match=field):
        ComputeModel(**kw)


def test_bad_device_named():
    with pytest.raises(emulator.ConfigError, match="B200"):
        ComputeModel.for_device("B200", _trace())
