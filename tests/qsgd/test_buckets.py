"""ddp_buckets against a real DistributedDataParallel on a one-rank gloo group."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import qsgd
from qsgd.buckets import BucketSpec, ddp_parameters
from qsgd.models import MLP, CifarResNet


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """A one-rank gloo process group (file rendezvous: no port to collide on)."""
    if dist.is_initialized():  # another test module left one: reuse it
        yield dist.group.WORLD
        return
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _ddp_buckets_per_iteration(model, iterations=2, **ddp_kwargs):
    """Run real DDP steps; return, per iteration, [(bucket index, [param names])] from a comm hook,
    and the gradient-ready order of the first iteration."""
    names = {p.data_ptr(): n for n, p in ddp_parameters(model)}
    ddp = DDP(model, **ddp_kwargs)
    seen: list[list] = []

    def hook(state, bucket):
        seen[-1].append((bucket.index(), [names[p.data_ptr()] for p in bucket.parameters()]))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, hook)
    ready: list[str] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, n=n: ready.append(n))
               for n, p in ddp_parameters(model)]
    g = torch.Generator().manual_seed(0)
    for _ in range(iterations):
        seen.append([])
        x = model.example_input(4, generator=g)
        model.loss(ddp(x), model.example_target(4, generator=g)).backward()
        handles and [h.remove() for h in handles]
        handles = []
    return [sorted(it) for it in seen], ready


def _ours(specs):
    return [(b.index, list(b.names)) for b in specs]


@pytest.mark.slow
def test_rebuilt_buckets_match_ddp_with_default_caps(gloo):
    # ResNet-20: 1.08 MB of fp32 gradients, so DDP's default caps (1 MiB first, 25 MiB) split it.
    torch.manual_seed(0)
    model = CifarResNet(20)
    per_it, ready = _ddp_buckets_per_iteration(model)
    # Iteration 0: DDP (find_unused_parameters=False) runs with one bucket of everything.
    assert len(per_it[0]) == 1
    # Iteration 1: rebuilt in gradient-ready order with the 1 MiB first cap.
    ours = qsgd.ddp_buckets(model, ready_order=ready)
    assert _ours(ours) == per_it[1]
    assert len(ours) == 2 and ours[0].nbytes >= 2**20 > ours[0].nbytes - 4 * ours[0].numels[-1]
    # Without the measured order (reverse registration order) the buckets hold the same
    # parameters; only the order inside differs (autograd readies a BN weight before its bias).
    default = qsgd.ddp_buckets(model)
    assert [(i, sorted(n)) for i, n in _ours(default)] == [(i, sorted(n)) for i, n in per_it[1]]
    assert _ours(default) != per_it[1]


def test_rebuilt_buckets_match_ddp_with_small_caps(gloo):
    # An explicit bucket_cap_mb makes DDP use that cap for the first bucket too.
    torch.manual_seed(0)
    model = MLP(64, (128, 128, 128, 128), 10)  # 32-64 KB weights: several 50 KiB buckets
    cap = int(0.05 * 2**20)
    per_it, ready = _ddp_buckets_per_iteration(model, bucket_cap_mb=0.05)
    ours = qsgd.ddp_buckets(model, bucket_cap_bytes=cap, first_bucket_bytes=cap, ready_order=ready)
    assert len(ours) >= 3
    assert _ours(ours) == per_it[1]


def test_rebuilt_buckets_match_ddp_with_a_tied_parameter(gloo):
    # GPT-2's output projection is its token embedding: DDP reduces the shared tensor once,
    # in the bucket where its (accumulated, last-ready) gradient falls.
    torch.manual_seed(0)
    model = qsgd.build_model("gpt2", seq_len=8, n_layer=2, n_embd=32, n_head=4, vocab_size=300)
    cap = 16_000
    per_it, ready = _ddp_buckets_per_iteration(model, bucket_cap_mb=cap / 2**20)
    ours = qsgd.ddp_buckets(model, bucket_cap_bytes=cap, first_bucket_bytes=cap, ready_order=ready)
    assert len(ours) >= 3
    assert _ours(ours) == per_it[1]
    names = [n for b in ours for n in b.names]
    assert names.count("tok_embed.weight") == 1 and "head.weight" not in names
    assert "tok_embed.weight" in ready[-2:]  # ready once its first use (the lookup) is reached


def test_construction_time_buckets_match_ddp_with_find_unused_parameters(gloo):
    torch.manual_seed(0)
    model = MLP(64, (128, 128, 128, 128), 10)
    cap = int(0.05 * 2**20)
    per_it, _ = _ddp_buckets_per_iteration(model, bucket_cap_mb=0.05, find_unused_parameters=True)
    ours = qsgd.ddp_buckets(model, bucket_cap_bytes=cap, first_bucket_bytes=cap, find_unused_parameters=True)
    assert len(ours) >= 3
    assert _ours(ours) == per_it[0] == per_it[1]  # never rebuilt
    # Bucket 0 holds the last layers; within it, registration order.
    assert ours[0].names[-1] == "layers.8.bias"


def test_greedy_walk_closes_when_cap_is_reached():
    # Reverse order walk: c (300 B), b (400 B) -> 700 >= 512 closes bucket 0; a (800 B) alone.
    model = nn.Module()
    model.a = nn.Parameter(torch.zeros(200))
    model.b = nn.Parameter(torch.zeros(100))
    model.c = nn.Parameter(torch.zeros(75))
    model.frozen = nn.Parameter(torch.zeros(10), requires_grad=False)
    specs = qsgd.ddp_buckets(model, bucket_cap_bytes=512, first_bucket_bytes=512)
    assert _ours(specs) == [(0, ["c", "b"]), (1, ["a"])]
    assert [b.nbytes for b in specs] == [700, 800]
    # A smaller first cap closes bucket 0 after c alone.
    specs = qsgd.ddp_buckets(model, bucket_cap_bytes=2000, first_bucket_bytes=256)
    assert _ours(specs) == [(0, ["c"]), (1, ["b", "a"])]
    # The defaults put this tiny model in one bucket.
    assert len(qsgd.ddp_buckets(model)) == 1


def test_dtypes_never_share_a_bucket():
    model = nn.Module()
    model.a = nn.Parameter(torch.zeros(10))
    model.h = nn.Parameter(torch.zeros(10, dtype=torch.float16))
    model.b = nn.Parameter(torch.zeros(10))
    specs = qsgd.ddp_buckets(model)
    assert sorted(b.names for b in specs) == [("b", "a"), ("h",)]
    assert {b.dtype for b in specs} == {"torch.float32", "torch.float16"}


def test_split_follows_the_papers_rule():
    spec = BucketSpec(0, ("w", "b", "v"), (20_000, 100, 10_000))
    assert spec.split(10_000) == (30_000, 100)
    assert spec.compressed_names(10_000) == ("w", "v") and spec.raw_names(10_000) == ("b",)
    assert spec.split(0) == (30_100, 0) and spec.split(10**9) == (0, 30_100)
    assert spec.nbytes == 4 * 30_100


def test_bad_arguments_are_named():
    model = MLP()
    with pytest.raises(qsgd.ConfigError, match="bucket_cap_bytes must be an int number of bytes >= 1, got 0"):
        qsgd.ddp_buckets(model, bucket_cap_bytes=0)
    with pytest.raises(qsgd.ConfigError, match="first_bucket_bytes .* got 1.5"):
        qsgd.ddp_buckets(model, first_bucket_bytes=1.5)
    with pytest.raises(qsgd.ConfigError, match="does not train: \\['nope'\\]"):
        qsgd.ddp_buckets(model, ready_order=["nope"])
    with pytest.raises(qsgd.ConfigError, match="twice"):
        qsgd.ddp_buckets(model, ready_order=["layers.0.bias", "layers.0.bias"])
    with pytest.raises(qsgd.ConfigError, match="ready_order is not used"):
        qsgd.ddp_buckets(model, ready_order=[], find_unused_parameters=True)
    with pytest.raises(qsgd.ConfigError, match="no trainable parameters"):
        qsgd.ddp_buckets(nn.ReLU())
    with pytest.raises(qsgd.ConfigError, match="equal length"):
        BucketSpec(0, ("a",), (1, 2))


def test_partial_ready_order_puts_the_rest_last():
    model = MLP(8, (4,), 2)
    names = [n for n, _ in model.named_parameters()]
    specs = qsgd.ddp_buckets(model, ready_order=[names[1]])
    assert specs[0].names[0] == names[1] and set(specs[0].names) == set(names)
