"""LeanAdam and clip_gradients against torch's Adam and clip_grad_norm_: the same parameters, moments, step
counters and norms, and the shortcut really taken where it applies."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from training import LeanAdam, clip_and_step, clip_gradients, fused_adam


def _network(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3), nn.Tanh(), nn.Linear(3, 1))


def _backward(network: nn.Module, seed: int, skip_last: bool = False) -> None:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(32, 5, generator=generator)
    loss = (network(inputs) - torch.randn(32, 1, generator=generator)).pow(2).mean() * 50.0
    loss.backward()
    if skip_last:  # a parameter without a gradient on this step
        network[4].bias.grad = None


def _assert_same(
    left: torch.optim.Optimizer, right: torch.optim.Optimizer, a: nn.Module, b: nn.Module
) -> None:
    for parameter_a, parameter_b in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(parameter_a, parameter_b, rtol=0, atol=0)
    state_a, state_b = left.state_dict()["state"], right.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for name in state_a[key]:
            torch.testing.assert_close(state_a[key][name], state_b[key][name], rtol=0, atol=0)


@pytest.mark.parametrize(
    "options",
    [
        {"lr": 1e-2},
        {"lr": 3e-3, "eps": 1e-5, "betas": (0.8, 0.95), "weight_decay": 1e-2},
        {"lr": 3e-3, "amsgrad": True, "maximize": True},
        {"lr": 3e-3, "weight_decay": 1e-2, "decoupled_weight_decay": True},
    ],
)
def test_lean_adam_steps_as_fused_adam(options: dict) -> None:
    reference_network, lean_network = _network(), _network()
    reference = torch.optim.Adam(
        [
            {"params": reference_network[0].parameters()},
            {"params": reference_network[2:].parameters(), "lr": 1e-3},
        ],
        fused=True,
        **options,
    )
    lean = LeanAdam(
        [{"params": lean_network[0].parameters()}, {"params": lean_network[2:].parameters(), "lr": 1e-3}],
        fused=True,
        **options,
    )
    for step in range(6):
        for network, optimizer in ((reference_network, reference), (lean_network, lean)):
            optimizer.zero_grad(set_to_none=True)
            _backward(network, step, skip_last=step == 3)
            optimizer.step()
        if step == 2:  # a learning-rate change between steps, as schedules make
            for optimizer in (reference, lean):
                optimizer.param_groups[0]["lr"] *= 0.5
        _assert_same(reference, lean, reference_network, lean_network)


def test_lean_adam_takes_the_shortcut_after_the_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    network = _network()
    optimizer = fused_adam(network.parameters(), lr=1e-3)
    assert type(optimizer) is LeanAdam
    _backward(network, 0)
    optimizer.step()  # Adam's own step creates the state
    calls = []
    monkeypatch.setattr(torch.optim.Adam, "step", lambda *args, **kwargs: calls.append(args))
    optimizer.zero_grad()
    assert all(parameter.grad is None for parameter in network.parameters())
    _backward(network, 1)
    optimizer.step()
    assert not calls, "the shortcut fell back to Adam's step"
    assert all(int(state["step"]) == 2 for state in optimizer.state.values())


def test_lean_adam_falls_back_where_the_shortcut_does_not_apply() -> None:
    reference_network, lean_network = _network(), _network()
    reference = torch.optim.Adam(reference_network.parameters(), lr=torch.tensor(1e-2), fused=True)
    lean = LeanAdam(lean_network.parameters(), lr=torch.tensor(1e-2), fused=True)  # a tensor learning rate
    for step in range(3):
        for network, optimizer in ((reference_network, reference), (lean_network, lean)):
            optimizer.zero_grad(set_to_none=False)  # zeroed, not dropped: Adam's own zero_grad
            _backward(network, step)
            optimizer.step()
        _assert_same(reference, lean, reference_network, lean_network)
    with pytest.raises(ValueError, match="fused=True"):
        LeanAdam(lean_network.parameters(), lr=1e-3)


def test_lean_adam_resumes_from_adams_state_dict() -> None:
    reference_network, lean_network = _network(), _network()
    reference = torch.optim.Adam(reference_network.parameters(), lr=1e-2, fused=True)
    _backward(reference_network, 0)
    reference.step()
    lean_network.load_state_dict(reference_network.state_dict())
    lean = LeanAdam(lean_network.parameters(), lr=1e-2, fused=True)
    lean.load_state_dict(copy.deepcopy(reference.state_dict()))
    for step in range(1, 4):
        for network, optimizer in ((reference_network, reference), (lean_network, lean)):
            optimizer.zero_grad()
            _backward(network, step)
            optimizer.step()
        _assert_same(reference, lean, reference_network, lean_network)


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e6])
def test_lean_adam_clip_and_step_is_clip_grad_norm_then_adam(max_norm: float) -> None:
    reference_network, lean_network = _network(), _network()
    groups = [{"params": lean_network[0].parameters()}, {"params": lean_network[2:].parameters(), "lr": 1e-3}]
    reference = torch.optim.Adam(
        [
            {"params": reference_network[0].parameters()},
            {"params": reference_network[2:].parameters(), "lr": 1e-3},
        ],
        lr=1e-2,
        fused=True,
    )
    lean = LeanAdam(groups, lr=1e-2, fused=True)
    for step in range(6):
        reference.zero_grad()
        _backward(reference_network, step, skip_last=step == 3)
        expected = torch.nn.utils.clip_grad_norm_(reference_network.parameters(), max_norm)
        reference.step()
        lean.zero_grad()
        _backward(lean_network, step, skip_last=step == 3)
        total = lean.clip_and_step(max_norm)
        # the norm before clipping: the same operations (the parameters differ by rounding after a first step)
        torch.testing.assert_close(total, expected, rtol=0 if step == 0 else 1e-5, atol=0)
        for parameter_a, parameter_b in zip(
            reference_network.parameters(), lean_network.parameters(), strict=True
        ):
            # the kernel divides by the clipping factor's inverse where clip_grad_norm_ multiplies: rounding apart
            torch.testing.assert_close(parameter_b, parameter_a, rtol=1e-5, atol=1e-7)
            if parameter_a.grad is not None:  # the gradients left clipped, as clip_grad_norm_ leaves them
                torch.testing.assert_close(parameter_b.grad, parameter_a.grad, rtol=1e-5, atol=1e-7)
    state_a, state_b = reference.state_dict()["state"], lean.state_dict()["state"]
    for key in state_a:
        assert state_a[key]["step"] == state_b[key]["step"]


def test_lean_adam_bumps_a_groups_counters_at_once_and_saves_them_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    network = _network()
    optimizer = fused_adam(network.parameters(), lr=1e-3)
    for step in range(2):  # Adam's own first step, then the shortcut's first
        optimizer.zero_grad()
        _backward(network, step)
        optimizer.step()
    per_tensor = []
    original = torch._foreach_add_
    monkeypatch.setattr(
        torch, "_foreach_add_", lambda *args, **kwargs: per_tensor.append(1) or original(*args, **kwargs)
    )
    optimizer.zero_grad()
    _backward(network, 2)
    optimizer.step()
    assert not per_tensor, "the counters were bumped one by one"
    assert all(int(state["step"]) == 3 for state in optimizer.state.values())
    saved = optimizer.state_dict()["state"]
    for entry in saved.values():
        assert not entry["step"]._is_view() and int(entry["step"]) == 3
        entry["step"] += 10  # the saved counters are copies: the optimizer's stay
    assert all(int(state["step"]) == 3 for state in optimizer.state.values())
    optimizer.zero_grad()
    _backward(network, 3, skip_last=True)  # one parameter without a gradient: the others' counters only
    optimizer.step()
    steps = [int(optimizer.state[parameter]["step"]) for parameter in network.parameters()]
    assert steps == [4, 4, 4, 4, 4, 3]
    optimizer.state.clear()  # a state dropped: Adam's step starts it again
    optimizer.zero_grad()
    _backward(network, 4)
    optimizer.step()
    assert all(int(state["step"]) == 1 for state in optimizer.state.values())


def test_lean_adam_keeps_its_plan_for_a_group_that_holds_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors that need no gradient in a group (the action bounds or observation statistics TorchRL's losses
    hand over with a network's parameters) are skipped as Adam skips them, and do not cost the plan."""
    reference_network, lean_network = _network(), _network()
    buffers = {name: torch.arange(3.0) for name in ("reference", "lean")}
    reference = torch.optim.Adam([*reference_network.parameters(), buffers["reference"]], lr=1e-2, fused=True)
    lean = LeanAdam([*lean_network.parameters(), buffers["lean"]], lr=1e-2, fused=True)
    per_tensor = []
    original = torch._foreach_add_
    monkeypatch.setattr(
        torch, "_foreach_add_", lambda *args, **kwargs: per_tensor.append(1) or original(*args, **kwargs)
    )
    for step in range(7):
        if step == 4:  # a skipped tensor that starts to learn: the plan no longer holds
            for buffer in buffers.values():
                buffer.requires_grad_(True)
        for network, optimizer, name in (
            (reference_network, reference, "reference"),
            (lean_network, lean, "lean"),
        ):
            optimizer.zero_grad()
            _backward(network, step)
            if step >= 4:
                buffers[name].grad = torch.full((3,), float(step))
            per_tensor.clear()
            optimizer.step()
        # Adam's own step (the first, and once the plan no longer holds) bumps its counters one by one
        assert bool(per_tensor) == (step in (0, 4)), f"step {step}: the plan was not used where it holds"
        _assert_same(reference, lean, reference_network, lean_network)
        torch.testing.assert_close(buffers["reference"], buffers["lean"], rtol=0, atol=0)
        if step == 3:
            assert not any(buffer in lean.state for buffer in buffers.values())
    assert int(lean.state[buffers["lean"]]["step"]) == 3


def test_lean_adam_runs_step_hooks_and_the_profiler_label() -> None:
    network = _network()
    optimizer = fused_adam(network.parameters(), lr=1e-3)
    for step in range(2):
        optimizer.zero_grad()
        _backward(network, step)
        optimizer.step()
    calls = []
    pre = optimizer.register_step_pre_hook(lambda *args: calls.append("pre"))
    post = register_optimizer_step_post_hook(lambda *args: calls.append("global post"))
    optimizer.zero_grad()
    _backward(network, 2)
    optimizer.step()
    assert calls == ["pre", "global post"]
    pre.remove()
    post.remove()
    optimizer.step()
    assert calls == ["pre", "global post"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        optimizer.step()
    assert any(event.name == "Optimizer.step#LeanAdam.step" for event in profile.events())
    assert all(int(state["step"]) == 5 for state in optimizer.state.values())


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e6])
def test_clip_gradients_is_clip_grad_norm(max_norm: float) -> None:
    reference_network, lean_network = _network(), _network()
    for network in (reference_network, lean_network):
        _backward(network, 0, skip_last=True)
    expected = torch.nn.utils.clip_grad_norm_(reference_network.parameters(), max_norm)
    total = clip_gradients(lean_network.parameters(), max_norm)
    torch.testing.assert_close(total, expected, rtol=0, atol=0)
    for reference, lean in zip(reference_network.parameters(), lean_network.parameters(), strict=True):
        assert (reference.grad is None) == (lean.grad is None)
        if lean.grad is not None:
            torch.testing.assert_close(lean.grad, reference.grad, rtol=0, atol=0)
    if max_norm < 1.0:
        clipped = torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in lean_network.parameters() if p.grad is not None])
        )
        assert clipped == pytest.approx(max_norm, rel=1e-4)


def test_clip_gradients_mixed_dtypes_and_no_gradients() -> None:
    first, second = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2, dtype=torch.float64))
    first.grad, second.grad = torch.full((3,), 2.0), torch.full((2,), 2.0, dtype=torch.float64)
    total = clip_gradients([first, second], 1.0)  # torch's own function for several dtypes
    assert total.item() == pytest.approx(20**0.5)
    assert torch.linalg.vector_norm(first.grad).item() ** 2 + torch.linalg.vector_norm(
        second.grad
    ).item() ** 2 == pytest.approx(1.0, rel=1e-5)
    assert clip_gradients([nn.Parameter(torch.ones(2))], 1.0).item() == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lean_adam_and_clip_gradients_on_cuda() -> None:
    """The shortcut's fused kernel and the clipping on a GPU give what Adam's fused step and torch's clipping give."""
    reference_network, lean_network = _network().cuda(), _network().cuda()
    reference = torch.optim.Adam(reference_network.parameters(), lr=3e-3, weight_decay=1e-2, fused=True)
    lean = fused_adam(lean_network.parameters(), lr=3e-3, weight_decay=1e-2)
    assert type(lean) is LeanAdam
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        inputs, targets = (
            torch.randn(32, 5, generator=generator).cuda(),
            torch.randn(32, 1, generator=generator),
        )
        for network, optimizer, clip in (
            (reference_network, reference, torch.nn.utils.clip_grad_norm_),
            (lean_network, lean, clip_gradients),
        ):
            optimizer.zero_grad(set_to_none=True)
            ((network(inputs) - targets.cuda()).pow(2).mean() * 50.0).backward()
            norm = clip(network.parameters(), 0.5)
            assert norm.device.type == "cuda"
            optimizer.step()
        _assert_same(reference, lean, reference_network, lean_network)


def test_clip_and_step_clips_any_optimizer_as_clip_grad_norm_then_step() -> None:
    reference_network, other_network = _network(), _network()
    reference = torch.optim.SGD(reference_network.parameters(), lr=0.1)
    other = torch.optim.SGD(other_network.parameters(), lr=0.1)
    for network in (reference_network, other_network):
        _backward(network, 0)
    expected = torch.nn.utils.clip_grad_norm_(reference_network.parameters(), 0.5)
    reference.step()
    torch.testing.assert_close(clip_and_step(other, 0.5), expected, rtol=0, atol=0)
    for parameter_a, parameter_b in zip(
        reference_network.parameters(), other_network.parameters(), strict=True
    ):
        torch.testing.assert_close(parameter_b, parameter_a, rtol=0, atol=0)
    lean_network = _network()
    lean = fused_adam(lean_network.parameters(), lr=1e-3)
    calls = []
    lean.clip_and_step = lambda max_norm: calls.append(max_norm)  # a LeanAdam clips in its kernel
    clip_and_step(lean, 0.5)
    assert calls == [0.5]


def test_lean_adam_clip_and_step_across_groups_of_other_dtypes_is_clip_then_step() -> None:
    def parameters(network: nn.Module) -> list[dict]:
        return [{"params": network[0].parameters()}, {"params": network[2:].parameters()}]

    reference_network, lean_network = _network(), _network()
    for network in (reference_network, lean_network):
        network[2:].double()  # the second group in float64: the kernel's one clipping factor does not apply
    reference = torch.optim.Adam(parameters(reference_network), lr=1e-2, fused=True)
    lean = LeanAdam(parameters(lean_network), lr=1e-2, fused=True)
    for step in range(3):
        for network in (reference_network, lean_network):
            inputs = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
            network[2:](network[1](network[0](inputs)).double()).pow(2).mean().backward()
        expected = torch.nn.utils.clip_grad_norm_(reference_network.parameters(), 0.05)
        reference.step()
        reference.zero_grad()
        torch.testing.assert_close(lean.clip_and_step(0.05), expected, rtol=0, atol=0)
        lean.zero_grad()
        _assert_same(reference, lean, reference_network, lean_network)
