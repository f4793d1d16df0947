"""measure: real steps, real codec, per DDP bucket; and the ``qsgd-emu measure`` command."""
from __future__ import annotations


import pytest
import torch
from torch import nn

import qsgd

CAPS = dict(bucket_cap_bytes=200_000, first_bucket_bytes=100_000)  # the MLP in 2 buckets


@pytest.fixture(scope="module")
def packed_trace():
    return qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=2, batch_size=4, device="cpu", **CAPS)


def test_trace_follows_ddp_buckets_and_the_papers_rule(packed_trace):
    t = packed_trace
    model = qsgd.build_model("mlp")
    assert t.model == "mlp" and t.parameters == 235_146 and t.device == "cpu"
    assert t.bucket_assignment == "ready" and t.num_iterations == 2 and t.num_buckets == 2
    assert t.torch_version == torch.__version__ and t.input_shape == (784,)
    # The MLP's gradients are ready in reverse layer order: bucket 0 holds the last layers.
    assert t.buckets[0].params[:2] == ("layers.4.bias", "layers.4.weight")
    assert [b.params for b in t.buckets] == [b.names for b in qsgd.ddp_buckets(model, ready_order=[
        n for b in t.buckets for n in b.params], **CAPS)]
    sizes = dict((n, p.numel()) for n, p in model.named_parameters())
    for b in t.buckets:
        assert b.raw_numel == sum(sizes[n] for n in b.params if sizes[n] < 10_000)
    for it in t.iterations:
        assert it.forward_s > 0 and it.backward_s > 0 and it.optimizer_s > 0
        for bt, b in zip(it.buckets, t.buckets):
            # packed payloads are exact: the real encoder ran on compressed_numel elements
            assert bt.payload_bytes == qsgd.payload_nbytes(b.compressed_numel, t.config)
            assert bt.raw_bytes == 4 * b.raw_numel
            assert 0 < bt.ready_s <= it.backward_s
            assert bt.encode_s > 0 and bt.decode_s > 0
            # 4-bit max-norm QSGD of a real gradient: a noisy but faithful copy
            assert 0.01 < bt.extra["rel_error"] < 0.6
        assert it.buckets[0].ready_s <= it.buckets[1].ready_s  # buckets become ready in order
    assert t.forward_flops == 2 * (784 * 256 + 256 * 128 + 128 * 10)


def test_trace_round_trips_through_a_file(packed_trace, tmp_path):
    path = tmp_path / "trace.json"
    packed_trace.save(path)
    back = qsgd.PayloadTrace.load(path)
    assert back == packed_trace
    assert back.iterations[0].buckets[0].extra["rel_error"] == packed_trace.iterations[0].buckets[0].extra["rel_error"]


def test_elias_payloads_are_data_dependent_and_seeded():
    cfg = qsgd.QSGDConfig.from_bits(2, bucket_size=128, codec="elias")
    kw = dict(iterations=2, batch_size=4, device="cpu", **CAPS)
    a = qsgd.measure("mlp", cfg, seed=1, **kw)
    b = qsgd.measure("mlp", cfg, seed=1, **kw)
    c = qsgd.measure("mlp", cfg, seed=2, **kw)
    sizes = lambda t: [[x.payload_bytes for x in it.buckets] for it in t.iterations]  # noqa: E731
    assert sizes(a) == sizes(b)  # same seed: same model, data, quantization streams
    assert sizes(a) != sizes(c)
    assert sizes(a)[0] != sizes(a)[1]  # the gradient changes between iterations, so does the code
    fp32 = [t.fp32_bytes for t in a.buckets]
    for row in sizes(a):
        assert all(0 < s < f / 8 for s, f in zip(row, fp32))  # 2-bit Elias: well under 4 bits/coord


def test_min_numel_moves_tensors_between_payload_and_raw():
    cfg = qsgd.QSGDConfig.from_bits(8)
    all_q = qsgd.measure("mlp", cfg, iterations=1, batch_size=2, device="cpu", min_numel=0, **CAPS)
    assert all(b.raw_numel == 0 for b in all_q.buckets)
    none_q = qsgd.measure("mlp", cfg, iterations=1, batch_size=2, device="cpu", min_numel=10**9, **CAPS)
    for bt, b in zip(none_q.iterations[0].buckets, none_q.buckets):
        assert b.compressed_numel == 0 and bt.payload_bytes == 0 and bt.encode_s == 0
        assert bt.raw_bytes == b.fp32_bytes


@pytest.mark.parametrize("order,kwargs", [("reverse", {}), ("find_unused", {"find_unused_parameters": True})])
def test_other_bucket_orders(order, kwargs):
    t = qsgd.measure("mlp", qsgd.QSGDConfig(), iterations=1, batch_size=2, device="cpu",
                     bucket_order=order, warmup=0, **CAPS)
    expected = qsgd.ddp_buckets(qsgd.build_model("mlp"), **CAPS, **kwargs)
    assert t.bucket_assignment == order
    assert [b.params for b in t.buckets] == [b.names for b in expected]


def test_user_module_needs_an_input_shape_and_gets_a_default_loss():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(50, 300), nn.ReLU(), nn.Linear(300, 7))
    with pytest.raises(qsgd.ConfigError, match="input_shape must be a tuple of ints"):
        qsgd.measure(net, qsgd.QSGDConfig(), iterations=1, device="cpu")
    t = qsgd.measure(net, qsgd.QSGDConfig(), iterations=1, batch_size=3, device="cpu", input_shape=(50,))
    assert t.model == "torch.nn.modules.container:Sequential" and t.parameters == 50 * 300 + 300 + 300 * 7 + 7
    assert t.iterations[0].buckets[0].payload_bytes > 0


@pytest.mark.parametrize("kwargs,message", [
    ({"iterations": 0}, "iterations must be an int >= 1, got 0"),
    ({"batch_size": 1.5}, "batch_size must be an int >= 1"),
    ({"device": "tpu"}, "device must be 'auto', 'cpu' or 'cuda"),
    ({"warmup": 0}, "warmup must be an int >= 1, got 0"),
    ({"bucket_order": "random"}, "bucket_order must be one of"),
    ({"bucket_cap_bytes": -1}, "bucket_cap_bytes must be an int number of bytes >= 1, got -1"),
    ({"min_numel": -5}, "min_numel must be an int >= 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(qsgd.ConfigError, match=message):
        qsgd.measure("mlp", qsgd.QSGDConfig(), **{"device": "cpu", **kwargs})
    with pytest.raises(qsgd.ConfigError, match="cfg must be a QSGDConfig"):
        qsgd.measure("mlp", {"levels": 7})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(qsgd.ConfigError, match="CUDA is not available"):
        qsgd.measure("mlp", qsgd.QSGDConfig(), device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_on_cuda_times_with_events():
    t = qsgd.measure("resnet20", qsgd.QSGDConfig.from_bits(4), iterations=2, batch_size=16, device="cuda")
    assert t.device.startswith("cuda") and t.device_name
    for it in t.iterations:
        assert all(0 < b.ready_s <= it.backward_s for b in it.buckets)
        assert all(b.encode_s > 0 for b in it.buckets if b.payload_bytes)


def test_public_name_is_the_function_even_after_importing_the_module():
    import qsgd.measurement  # noqa: F401

    assert callable(qsgd.measure) and qsgd.measure.__name__ == "measure"
    assert "measure" in qsgd.__all__ and "PayloadTrace" in qsgd.__all__
