"""PayloadTrace: round trips, the replay helpers, and one test per kind of rejected file."""
from __future__ import annotations

import copy
import json

import pytest

import qsgd
from qsgd.trace import BucketTiming, TraceBucket, TraceIteration


def _doc() -> dict:
    """A valid trace with two buckets (one all-raw) and two iterations (Elias payloads, whose
    size varies with the data)."""
    buckets = [
        {"index": 0, "numel": 1_025_000, "params": ["fc.weight", "fc.bias"],
         "compressed_numel": 1_024_000, "raw_numel": 1000},
        {"index": 1, "numel": 20, "params": ["bn.weight", "bn.bias"],
         "compressed_numel": 0, "raw_numel": 20},
    ]

    def it(j, payload):
        return {"index": j, "forward_s": 0.1, "backward_s": 0.3, "optimizer_s": 0.01,
                "buckets": [
                    {"index": 0, "ready_s": 0.02, "payload_bytes": payload, "raw_bytes": 4000,
                     "encode_s": 0.001, "decode_s": 0.002},
                    {"index": 1, "ready_s": 0.25, "payload_bytes": 0, "raw_bytes": 80,
                     "encode_s": 0.0, "decode_s": 0},
                ]}

    return {
        "format": "qsgd-payload-trace", "version": 1, "model": "resnet50",
        "parameters": 1_025_020, "device": "cpu", "device_name": "Some CPU",
        "torch_version": "2.13.0", "batch_size": 8, "input_shape": [3, 224, 224],
        "config": {"levels": 7, "bucket_size": 512, "norm": "max", "codec": "elias", "bits": 4},
        "min_numel": 10000, "bucket_cap_bytes": 26214400, "first_bucket_bytes": 1048576, "seed": 0,
        "buckets": buckets, "iterations": [it(0, 512_100), it(1, 512_300)],
    }


def test_round_trip_through_dict_and_file(tmp_path):
    doc = _doc()
    doc["note"] = {"kept": [1, 2]}  # unknown fields survive
    doc["buckets"][0]["tag"] = "x"
    t = qsgd.PayloadTrace.from_dict(doc)
    assert qsgd.PayloadTrace.from_dict(t.to_dict()) == t
    path = tmp_path / "trace.json"
    t.save(path)
    back = qsgd.PayloadTrace.load(path)
    assert back == t
    out = back.to_dict()
    assert out["note"] == {"kept": [1, 2]}
    assert out["buckets"][0]["tag"] == "x"
    assert out["config"] == doc["config"]
    assert back.bucket_assignment == "reverse"
    assert isinstance(back.config, qsgd.QSGDConfig) and back.config.bits == 4
    assert not list(tmp_path.glob("*.tmp*"))
    assert back.forward_flops is None
    doc["forward_flops"] = 8_178_368_512
    doc["bucket_assignment"] = "ready"
    t = qsgd.PayloadTrace.from_dict(doc)
    assert t.forward_flops == 8_178_368_512 and t.bucket_assignment == "ready"


def test_replay_helpers():
    t = qsgd.PayloadTrace.from_dict(_doc())
    assert t.num_buckets == 2 and t.num_iterations == 2
    assert t.fp32_bytes(0) == 4 * 1_025_000
    assert t.mean_payload_bytes(0) == pytest.approx(512_200)
    assert t.mean_wire_bytes(0) == pytest.approx(512_200 + 4000)
    assert t.mean_wire_bytes(1) == 80 and t.mean_payload_bytes(1) == 0
    assert t.mean_ready_s(1) == pytest.approx(0.25)
    assert t.mean_encode_s(0) == pytest.approx(0.001)
    assert t.mean_decode_s(0) == pytest.approx(0.002)
    assert t.mean_iteration("compute_s") == pytest.approx(0.41)
    with pytest.raises(qsgd.TraceError, match="bucket must be an int in \\[0, 2\\)"):
        t.mean_payload_bytes(2)
    with pytest.raises(qsgd.TraceError, match="name must be"):
        t.mean_iteration("bogus")


def test_direct_construction_is_validated():
    t = qsgd.PayloadTrace.from_dict(_doc())
    b = t.buckets[0]
    bad = TraceBucket(b.index, b.numel, b.params, b.compressed_numel, b.raw_numel + 1)
    with pytest.raises(qsgd.TraceError, match="buckets\\[0\\].compressed_numel \\+ raw_numel"):
        qsgd.PayloadTrace(**{**t.__dict__, "buckets": (bad, t.buckets[1])})
    with pytest.raises(qsgd.TraceError, match="buckets must be a tuple of TraceBucket"):
        qsgd.PayloadTrace(**{**t.__dict__, "buckets": [b, t.buckets[1]]})
    assert isinstance(t.iterations[0], TraceIteration)
    assert isinstance(t.iterations[0].buckets[0], BucketTiming)


def _set(doc, path, value):
    """Set ``doc[path]`` where path is a tuple of keys and indices; ``_DELETE`` removes it."""
    *head, last = path
    for k in head:
        doc = doc[k]
    if value is _DELETE:
        del doc[last]
    else:
        doc[last] = value


_DELETE = object()

# (path, bad value, text the error must contain: the JSON path and the value)
REJECTIONS = [
    (("format",), "other", "format must be 'qsgd-payload-trace', got 'other'"),
    (("version",), 4, "version must be one of [1, 2, 3], got 4"),
    (("version",), True, "version must be one of [1, 2, 3], got True"),
    (("model",), _DELETE, "model is missing"),
    (("model",), "", "model must be a non-empty string"),
    (("device_name",), 3, "device_name must be a string, got 3"),
    (("batch_size",), 0, "batch_size must be an int >= 1, got 0"),
    (("batch_size",), 2.0, "batch_size must be an int >= 1, got 2.0"),
    (("seed",), -1, "seed must be an int >= 0, got -1"),
    (("input_shape", 1), 0, "input_shape[1] must be an int >= 1, got 0"),
    (("input_shape",), "3x224", "input_shape must be a non-empty list, got '3x224'"),
    (("config", "levels"), 0, "config.levels must be in [1, 32767], got 0"),
    (("config", "norm"), "l1", "config.norm must be one of"),
    (("config", "bits"), 8, "config.bits must be 4 for levels=7, got 8"),
    (("config", "codec"), _DELETE, "config.codec is missing"),
    (("bucket_assignment",), "random", "bucket_assignment must be one of"),
    (("forward_flops",), 0, "forward_flops must be an int >= 1, got 0"),
    (("parameters",), 5, "parameters must equal the sum of buckets[*].numel = 1025020, got 5"),
    (("buckets",), [], "buckets must be a non-empty list"),
    (("buckets", 1, "index"), 7, "buckets[1].index must be 1, got 7"),
    (("buckets", 0, "numel"), -3, "buckets[0].numel must be an int >= 1, got -3"),
    (("buckets", 0, "raw_numel"), 999, "buckets[0].compressed_numel + raw_numel must equal numel"),
    (("buckets", 1, "params", 0), "fc.bias", "buckets[1].params[0] 'fc.bias' is also in bucket 0"),
    (("buckets", 0, "params", 1), 5, "buckets[0].params[1] must be a non-empty string, got 5"),
    (("iterations",), {}, "iterations must be a non-empty list"),
    (("iterations", 1, "index"), 0, "iterations[1].index must be 1, got 0"),
    (("iterations", 0, "forward_s"), -0.5, "iterations[0].forward_s must be a finite number of seconds >= 0"),
    (("iterations", 0, "backward_s"), float("nan"), "iterations[0].backward_s must be a finite number"),
    (("iterations", 1, "optimizer_s"), "1ms", "iterations[1].optimizer_s must be a finite number"),
    (("iterations", 0, "buckets", 0, "payload_bytes"), -5,
     "iterations[0].buckets[0].payload_bytes must be an int >= 0, got -5"),
    (("iterations", 0, "buckets", 0, "payload_bytes"), 7000,
     "iterations[0].buckets[0].payload_bytes must be at least 8032 (header and one 4-byte norm"),
    (("iterations", 0, "buckets", 0, "payload_bytes"), 0,
     "iterations[0].buckets[0].payload_bytes must be 0 exactly when"),
    (("iterations", 1, "buckets", 1, "payload_bytes"), 12,
     "iterations[1].buckets[1].payload_bytes must be 0 exactly when"),
    (("iterations", 0, "buckets", 0, "raw_bytes"), 4,
     "iterations[0].buckets[0].raw_bytes must be 4 * buckets[0].raw_numel = 4000, got 4"),
    (("iterations", 0, "buckets", 1, "ready_s"), 0.5,
     "iterations[0].buckets[1].ready_s must not exceed iterations[0].backward_s"),
    (("iterations", 0, "buckets", 1, "index"), 0, "iterations[0].buckets[1].index must be 1, got 0"),
    (("iterations", 1, "buckets", 0, "encode_s"), _DELETE, "iterations[1].buckets[0].encode_s is missing"),
    (("iterations", 1, "buckets", 0), [1], "iterations[1].buckets[0] must be an object"),
]


@pytest.mark.parametrize("path,value,message", REJECTIONS, ids=[".".join(map(str, r[0])) + f"={r[1]!r}"[:20]
                                                                 for r in REJECTIONS])
def test_rejects_bad_field_naming_it(path, value, message):
    doc = copy.deepcopy(_doc())
    _set(doc, path, value)
    with pytest.raises(qsgd.TraceError) as info:
        qsgd.PayloadTrace.from_dict(doc)
    assert message in str(info.value)


def test_rejects_iteration_missing_a_bucket():
    doc = _doc()
    del doc["iterations"][1]["buckets"][1]
    with pytest.raises(qsgd.TraceError, match=r"iterations\[1\].buckets must list all 2 buckets, got 1"):
        qsgd.PayloadTrace.from_dict(doc)


def test_load_names_the_file_and_rejects_bad_json(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(qsgd.TraceError, match="t.json: not valid JSON"):
        qsgd.PayloadTrace.load(path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(qsgd.TraceError, match="trace must be an object"):
        qsgd.PayloadTrace.load(path)
    doc = _doc()
    doc["iterations"][0]["buckets"][0]["decode_s"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(qsgd.TraceError, match=r"t.json: iterations\[0\].buckets\[0\].decode_s"):
        qsgd.PayloadTrace.load(path)
    assert isinstance(qsgd.TraceError("x"), ValueError)  # the CLI reports it in one line


def test_a_packed_payload_must_have_the_size_its_config_gives():
    """A tampered size (a packed payload edited from 520036 to 9040036) is refused, naming the
    field and the size the config and the element count determine."""
    doc = _doc()
    doc["config"]["codec"] = "packed"
    want = qsgd.payload_nbytes(1_024_000, qsgd.QSGDConfig.from_bits(4, bucket_size=512))
    assert want == 520_036
    for it in doc["iterations"]:
        it["buckets"][0]["payload_bytes"] = want
    assert qsgd.PayloadTrace.from_dict(doc).mean_payload_bytes(0) == want
    doc["iterations"][1]["buckets"][0]["payload_bytes"] = 9_040_036
    with pytest.raises(qsgd.TraceError, match=r"iterations\[1\]\.buckets\[0\]\.payload_bytes "
                                              r"must be 520036 \(a packed payload of buckets\[0\]"
                                              r"\.compressed_numel=1024000 elements at 4 bits"):
        qsgd.PayloadTrace.from_dict(doc)
