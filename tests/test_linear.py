"""agents.linear: large float32 CPU products through oneDNN, the same values and gradients as F.linear up to the
order of sums; everything it does not cover goes to F.linear itself."""

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn
from torchrl.modules import ValueOperator

import agents.linear as linear_kernels
from agents.actor_critic import StackedNetwork
from agents.fast_paths import unrolled
from agents.linear import (
    MIN_MULTIPLY_ADDS,
    ZEN4_MIN_MULTIPLY_ADDS,
    linear,
    onednn_min_multiply_adds,
    set_linear_kernels,
    uses_onednn,
)
from agents.networks import NatureCNN
from errors import InputError
from training import RunConfig, prepare_process

pytestmark = pytest.mark.skipif(not linear_kernels.onednn_available(), reason="this torch has no oneDNN")


@pytest.fixture
def onednn():
    """oneDNN on for the test (conftest puts the process's choice back after it)."""
    set_linear_kernels("onednn")


@pytest.fixture
def products(monkeypatch):
    """The oneDNN products run, as (rows, weight) shapes."""
    calls = []
    original = linear_kernels._product

    def counted(rows, weight, bias):
        calls.append((tuple(rows.shape), tuple(weight.shape)))
        return original(rows, weight, bias)

    monkeypatch.setattr(linear_kernels, "_product", counted)
    return calls


def _operands(rows=256, inputs=400, outputs=300, bias=True, batch=()):
    torch.manual_seed(0)
    x = torch.randn(*batch, rows, inputs, requires_grad=True)
    weight = (torch.randn(outputs, inputs) / inputs**0.5).requires_grad_()
    return x, weight, (torch.randn(outputs, requires_grad=True) if bias else None)


def _gradients(function, x, weight, bias):
    output = function(x, weight, bias)
    output.backward(torch.linspace(-1, 1, output.numel()).reshape(output.shape))
    grads = [tensor.grad.clone() for tensor in (x, weight, bias) if tensor is not None]
    for tensor in (x, weight, bias):
        if tensor is not None:
            tensor.grad = None
    return output.detach(), grads


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [(), (2, 3)])
def test_large_products_equal_f_linear_with_their_gradients(onednn, products, bias, batch):
    x, weight, b = _operands(rows=128, inputs=256, outputs=256, bias=bias, batch=batch)
    output, grads = _gradients(linear, x, weight, b)
    expected, expected_grads = _gradients(F.linear, x, weight, b)
    assert products  # it went through oneDNN: forward, and the input's and the weight's gradients
    assert len(products) == 3
    assert output.shape == expected.shape
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-4)


def test_strided_operands_and_gradients_of_the_weight_alone(onednn, products):
    x, weight, bias = _operands()
    x_t = x.detach().t().contiguous().t()  # the same values, column-major
    assert not x_t.is_contiguous()
    output = linear(x_t, weight, bias)
    torch.testing.assert_close(output, F.linear(x_t, weight, bias), rtol=1e-5, atol=1e-5)
    output.sum().backward()
    assert len(products) == 2  # forward and the weight's gradient: the input needs none
    expected = torch.autograd.grad(F.linear(x_t, weight, bias).sum(), weight)[0]
    torch.testing.assert_close(weight.grad, expected, rtol=1e-5, atol=1e-4)


def test_inference_runs_without_autograd(onednn, products):
    x, weight, bias = _operands()
    with torch.no_grad():
        output = linear(x, weight, bias)
    assert products and output.grad_fn is None
    torch.testing.assert_close(output, F.linear(x, weight, bias).detach(), rtol=1e-5, atol=1e-5)


def test_what_onednn_does_not_cover_is_f_linear_to_the_bit(onednn, products):
    side = round((MIN_MULTIPLY_ADDS / 2) ** (1 / 3))
    small = _operands(rows=side, inputs=side, outputs=side)
    cases = {
        "below the size": small,
        "float64": [t.detach().double() for t in _operands()],
        "one observation": _operands(rows=1),
    }
    for name, (x, weight, bias) in cases.items():
        assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias)), name
    x, weight, bias = _operands()
    torch.set_float32_matmul_precision("medium")
    try:
        assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
    finally:
        torch.set_float32_matmul_precision("highest")
    set_linear_kernels("torch")
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
    assert products == []


def test_auto_on_a_zen_4_takes_onednn_for_large_products_only(products, monkeypatch):
    monkeypatch.setattr(linear_kernels, "_cpu_identity", lambda: ("AuthenticAMD", 25))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    linear_kernels.onednn_by_default.cache_clear()
    try:
        assert set_linear_kernels("auto")
    finally:
        linear_kernels.onednn_by_default.cache_clear()
    x, weight, bias = _operands(rows=256, inputs=256, outputs=256)  # a 256-unit layer: 16.8 million
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))
    assert products == []
    x, weight, bias = _operands(
        rows=32, inputs=3136, outputs=512
    )  # the Nature CNN's layer at 32 rows: 51 million
    output, grads = _gradients(linear, x, weight, bias)
    expected, expected_grads = _gradients(F.linear, x, weight, bias)
    assert len(products) == 3
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-4)


def test_vmap_and_tracing_take_f_linear(onednn, products):
    x, weight, bias = _operands()
    stacked = torch.stack([weight.detach(), 2 * weight.detach()])
    batched = torch.vmap(lambda w: linear(x.detach(), w, bias.detach()))(stacked)
    torch.testing.assert_close(batched[1], F.linear(x, 2 * weight, bias).detach())
    weight, bias = weight.detach(), bias.detach()
    traced = torch.jit.trace(lambda inputs: linear(inputs, weight, bias), (x.detach(),), check_trace=False)
    assert products == []  # neither went through oneDNN
    assert "linear" in str(traced.graph)


def test_a_second_derivative_is_refused(onednn):
    x, weight, bias = _operands()
    (gradient,) = torch.autograd.grad(linear(x, weight, bias).pow(2).sum(), weight, create_graph=True)
    with pytest.raises(RuntimeError, match="twice|once_differentiable|double"):
        gradient.sum().backward()


def test_stacked_members_through_onednn_equal_the_batched_product(products):
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(23, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    critic = StackedNetwork(ValueOperator(network, in_keys=["observation"]))
    assert critic._stacked is not None  # the batched product, where oneDNN is not taken
    stacked = TensorDict.from_module(ValueOperator(network, in_keys=["observation"])).expand(2).clone()
    stacked["module", "2", "weight"] *= 0.5
    leaves = list(stacked.values(True, True))
    for value in leaves:
        value.requires_grad_(True)
    x = torch.randn(256, 23)

    def run():
        output = critic(stacked, x)
        return output.detach(), torch.autograd.grad(output.sum(), leaves)

    before = onednn_min_multiply_adds()
    try:
        set_linear_kernels("torch")
        expected, expected_grads = run()
        assert not products
        set_linear_kernels("onednn")
        output, grads = run()
        assert len(products) == 2 * 3  # each member's 256x256 layer: forward and two gradients
        products.clear()
        critic(stacked, x[:8])  # too few rows for oneDNN: the batched product
        assert not products
        doubles = stacked.apply(lambda value: value.detach().double())
        assert critic._members_through_onednn(x) and not critic._members_through_onednn(x.double())
        torch.testing.assert_close(critic(doubles, x.double()).float(), expected, rtol=1e-5, atol=1e-5)
        assert not products  # float64 (as any input agents.linear leaves to F.linear): the batched product
        linear_kernels._onednn_from = ZEN4_MIN_MULTIPLY_ADDS  # "auto" on a Zen 4: 256x256 at 256 rows stays
        critic(stacked, x)
        assert not products and not critic._members_through_onednn(x)
    finally:
        linear_kernels._onednn_from = before
    assert output.shape == expected.shape == (2, 256, 1)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_unrolled_networks_and_the_nature_cnn_take_it(onednn, products):
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 4))
    x = torch.randn(256, 256)
    torch.testing.assert_close(unrolled(network)(x), network(x), rtol=1e-5, atol=1e-5)
    assert len(products) == 1
    cnn = NatureCNN((4, 84, 84), "chw")
    pixels = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    features = cnn(pixels)
    assert products[-1] == ((8, 3136), (512, 3136))
    expected = cnn.linear(cnn.convolutions(pixels.float() / 255.0))
    torch.testing.assert_close(features, expected, rtol=1e-4, atol=1e-5)


def test_the_run_option_sets_the_kernels_and_auto_follows_the_cpu(monkeypatch):
    before = onednn_min_multiply_adds()
    try:
        prepare_process(RunConfig(linear_kernels="onednn"))
        assert uses_onednn() and onednn_min_multiply_adds() == MIN_MULTIPLY_ADDS
        prepare_process(RunConfig(linear_kernels="torch"))
        assert not uses_onednn() and onednn_min_multiply_adds() == float("inf")
        for vendor, family, capability, expected in [
            ("AuthenticAMD", 26, "AVX512", MIN_MULTIPLY_ADDS),  # Zen 5
            ("AuthenticAMD", 25, "AVX512", ZEN4_MIN_MULTIPLY_ADDS),  # Zen 4: AVX-512 in 256-bit halves
            ("AuthenticAMD", 23, "AVX512", float("inf")),
            ("GenuineIntel", 6, "AVX512", float("inf")),
            ("AuthenticAMD", 26, "AVX2", float("inf")),
            ("AuthenticAMD", 25, "AVX2", float("inf")),  # Zen 3
            ("", -1, "AVX512", float("inf")),
        ]:
            monkeypatch.setattr(linear_kernels, "_cpu_identity", lambda identity=(vendor, family): identity)
            monkeypatch.setattr(
                torch.backends.cpu, "get_cpu_capability", lambda capability=capability: capability
            )
            linear_kernels.onednn_by_default.cache_clear()
            assert set_linear_kernels("auto") is (expected < float("inf")), (vendor, family, capability)
            assert onednn_min_multiply_adds() == expected, (vendor, family, capability)
    finally:
        linear_kernels.onednn_by_default.cache_clear()
        linear_kernels._onednn_from = before


def test_bad_choices_are_refused(monkeypatch):
    before = uses_onednn()
    with pytest.raises(InputError, match="'fast'"):
        set_linear_kernels("fast")
    monkeypatch.setattr(linear_kernels, "onednn_available", lambda: False)
    with pytest.raises(InputError, match="built with oneDNN"):
        set_linear_kernels("onednn")
    assert uses_onednn() == before


def test_the_cpu_identity_is_read_from_the_first_processor(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\n"
    )
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda path, *args, **kwargs: real_open(
            cpuinfo if path == "/proc/cpuinfo" else path, *args, **kwargs
        ),
    )
    assert linear_kernels._cpu_identity() == ("AuthenticAMD", 26)
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: ?\n")
    assert linear_kernels._cpu_identity() == ("AuthenticAMD", -1)
    cpuinfo.unlink()
    assert linear_kernels._cpu_identity() == ("", -1)
