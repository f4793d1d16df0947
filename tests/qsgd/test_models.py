"""Model definitions: published parameter counts, shapes, FLOPs, build_model."""
from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

import qsgd
from qsgd.models import MODELS, count_parameters, forward_flops, model_name


def _meta(name):
    # Shapes only: building VGG-19 for real would allocate 575 MB and take seconds.
    with torch.device("meta"):
        return MODELS[name]()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_matches_the_cited_figure(name):
    model = _meta(name)
    published = model.published_parameters
    assert published > 0
    n = count_parameters(model)
    assert abs(n - published) <= model.parameter_tolerance * published, (name, n, published)
    # The figure the test holds the model to is the one its docstring cites.
    assert f"{published:,}" in inspect.getdoc(type(model)), name


@pytest.mark.parametrize("name,exact", [("alexnet", 61_100_840), ("vgg19", 143_667_240),
                                        ("resnet50", 25_557_032), ("resnet152", 60_192_808),
                                        ("resnet110", 1_727_962), ("bn_inception", 11_295_240),
                                        ("lstm_an4", 12_992_644), ("mlp", 235_146)])
def test_exact_counts_stated_in_docstrings(name, exact):
    model = _meta(name)
    assert count_parameters(model) == exact
    assert f"{exact:,}" in inspect.getdoc(type(model))


@pytest.mark.parametrize("name,classes", [("alexnet", 1000), ("vgg19", 1000), ("resnet50", 1000),
                                          ("resnet152", 1000), ("bn_inception", 1000)])
def test_imagenet_models_map_a_batch_to_logits(name, classes):
    model = _meta(name)
    x = torch.empty((2, *model.input_shape), device="meta")
    assert model(x).shape == (2, classes)


def test_small_models_run_forward_and_backward_for_real():
    g = torch.Generator().manual_seed(0)
    for model in (qsgd.build_model("resnet20"), qsgd.build_model("mlp"),
                  qsgd.build_model("lstm_an4", hidden_size=32, seq_len=5)):
        x = model.example_input(3, generator=g)
        y = model.example_target(3, generator=g)
        loss = model.loss(model(x), y)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None for p in model.parameters())
    lstm = qsgd.build_model("lstm_an4", hidden_size=32, seq_len=5)
    assert lstm.example_target(3).shape == (3, 5) and lstm.input_shape == (5, 363)


def test_example_batches_are_seeded():
    m = qsgd.build_model("mlp")
    a = m.example_input(4, generator=torch.Generator().manual_seed(7))
    b = m.example_input(4, generator=torch.Generator().manual_seed(7))
    c = m.example_input(4, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("name,gmacs", [("alexnet", 0.714), ("vgg19", 19.63), ("resnet50", 4.09),
                                        ("vit-b16", 17.56)])
def test_forward_flops_match_published_multiply_adds(name, gmacs):
    # torchvision's model tables list 0.71, 19.63, 4.09 and 17.56 GFLOPS, counted as multiply-adds
    # (ViT-B/16's include attention's two products per layer).
    model = _meta(name)
    flops = forward_flops(model, model.input_shape)
    assert flops == pytest.approx(2 * gmacs * 1e9, rel=0.01)
    assert forward_flops(model, model.input_shape, batch_size=3) == pytest.approx(3 * flops, rel=1e-9)


def test_forward_flops_counts_the_lstm_and_leaves_the_model_alone():
    model = qsgd.build_model("lstm_an4", seq_len=10)
    per_frame = 2 * (4 * 976 * (363 + 976) + 4 * 976 * (976 + 976) + 976 * 132)
    assert forward_flops(model, model.input_shape) == pytest.approx(10 * per_frame, rel=0.01)
    net = qsgd.build_model("resnet20")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    forward_flops(net, net.input_shape)
    assert net.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_build_model_by_name_and_import_path(monkeypatch):
    assert type(qsgd.build_model("mlp")).__name__ == "MLP"
    m = qsgd.build_model("qsgd.models.mlp:MLP", in_features=8, hidden=(4,), num_classes=2)
    assert count_parameters(m) == 8 * 4 + 4 + 4 * 2 + 2
    user = types.ModuleType("user_models_for_test")
    user.instance = torch.nn.Linear(3, 2)
    user.make = lambda width=4: torch.nn.Linear(width, 1)
    user.not_a_model = lambda: 42
    user.value = 3
    monkeypatch.setitem(sys.modules, "user_models_for_test", user)
    assert qsgd.build_model("user_models_for_test:instance") is user.instance
    assert qsgd.build_model("user_models_for_test:make", width=6).in_features == 6
    assert model_name(qsgd.build_model("resnet20")) == "resnet20"
    assert model_name(user.instance) == "torch.nn.modules.linear:Linear"
    for spec, message in [("nonsense", "is not one of"), ("no_such_module_xyz:A", "cannot import"),
                          ("user_models_for_test:missing", "has no attribute 'missing'"),
                          ("user_models_for_test:not_a_model", "returned int, not a torch.nn.Module"),
                          ("user_models_for_test:value", "neither an nn.Module nor callable"),
                          ("", "must be a name")]:
        with pytest.raises(qsgd.ModelError, match=message):
            qsgd.build_model(spec)
    with pytest.raises(qsgd.ModelError, match="takes no arguments"):
        qsgd.build_model("user_models_for_test:instance", width=3)


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="depth must be 6 n \\+ 2"):
        qsgd.build_model("qsgd.models:CifarResNet", depth=21)
    with pytest.raises(ValueError, match="depth must be one of"):
        qsgd.build_model("qsgd.models:ResNet", depth=34)
    with pytest.raises(ValueError, match="widths must be positive ints"):
        qsgd.build_model("mlp", hidden=(0,))
