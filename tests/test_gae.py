import torch
from tensordict import TensorDict
from torch import nn
from torchrl.modules import ValueOperator
from torchrl.objectives.value import GAE


def test_gae_matches_hand_computed_values_across_truncation_and_termination():
    # V(s) = 2 s; gamma 0.9, lambda 0.8. Steps 0-1: an episode cut by a time limit (truncated, bootstrapped
    # from V(3)); steps 2-3: an episode that terminates (no bootstrap).
    linear = nn.Linear(1, 1)
    with torch.no_grad():
        linear.weight.fill_(2.0)
        linear.bias.zero_()
    critic = ValueOperator(linear, in_keys=["observation"])

    def column(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype).reshape(1, 4, 1)

    terminated = column([False, False, False, True], torch.bool)
    truncated = column([False, True, False, False], torch.bool)
    batch = TensorDict(
        {
            "observation": column([1.0, 2.0, 5.0, 6.0]),
            "next": {
                "observation": column([2.0, 3.0, 6.0, 7.0]),
                "reward": column([1.0, 1.0, 0.0, 2.0]),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[1, 4],
    )
    GAE(gamma=0.9, lmbda=0.8, value_network=critic, average_gae=False)(batch)
    # deltas: 1 + .9*4 - 2 = 2.6 | 1 + .9*6 - 4 = 2.4 | 0 + .9*12 - 10 = 0.8 | 2 - 12 = -10
    expected_advantage = torch.tensor([2.6 + 0.72 * 2.4, 2.4, 0.8 + 0.72 * -10.0, -10.0])
    torch.testing.assert_close(batch["advantage"].flatten(), expected_advantage)
    torch.testing.assert_close(
        batch["value_target"].flatten(), expected_advantage + torch.tensor([2.0, 4.0, 10.0, 12.0])
    )
