"""One seed-stream function (issue 46): every seed the project derives is
`genesis_fp16.seeds.stream_seed` of (the run's seed, a stream's name, its
indices), and nothing outside the tests seeds torch's global generator; a
module is initialised from a generator of its own instead."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from genesis_fp16.seeds import SEED_BITS, init_parameters, numpy_rng, stream_seed, torch_generator

ROOT = Path(__file__).resolve().parents[1]


def test_stream_seed_is_deterministic_and_in_range() -> None:
    assert stream_seed(7, "learners.refine", 3, 1) == stream_seed(7, "learners.refine", 3, 1)
    assert stream_seed(np.int64(7), "x", np.int32(2)) == stream_seed(7, "x", 2)  # NumPy integers are the same numbers
    values = [stream_seed(seed, "x", i) for seed in range(20) for i in range(20)]
    assert all(0 <= v < 2**SEED_BITS for v in values)
    # a resumed run re-derives its streams in another process, perhaps on another machine: the value is fixed
    assert stream_seed(0, "cma_search") == stream_seed(0, "cma_search")
    assert stream_seed(0, "a") == 3957007210897769521


def test_distinct_streams_indices_and_seeds_differ() -> None:
    base = stream_seed(0, "learners.learn", 1)
    others = [stream_seed(1, "learners.learn", 1), stream_seed(0, "learners.refine", 1), stream_seed(0, "learners.learn", 2),
              stream_seed(0, "learners.learn", 1, 0), stream_seed(0, "learners.learn")]
    assert base not in others and len(set(others)) == len(others)
    # the old hand-made salts collided (seed 1 generation 0 is seed 0 generation 100_003); names and indices do not
    assert stream_seed(1, "s", 0) != stream_seed(0, "s", 100_003)
    assert stream_seed(0, "s", 12) != stream_seed(0, "s", 1, 2)  # the indices are kept apart, not concatenated
    assert len({stream_seed(s, "x", g) for s in range(50) for g in range(50)}) == 2500


def test_stream_seed_refuses_what_is_not_a_seed() -> None:
    with pytest.raises(ValueError, match="stream"):
        stream_seed(0, "")
    with pytest.raises(TypeError):
        stream_seed(0.5, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        stream_seed(0, "x", 1.0)  # type: ignore[arg-type]


def test_the_generators_draw_the_stream() -> None:
    assert np.array_equal(numpy_rng(3, "x", 1).random(5), numpy_rng(3, "x", 1).random(5))
    assert not np.array_equal(numpy_rng(3, "x", 1).random(5), numpy_rng(3, "x", 2).random(5))
    a, b = torch.randn(5, generator=torch_generator(3, "x")), torch.randn(5, generator=torch_generator(3, "x"))
    assert torch.equal(a, b) and not torch.equal(a, torch.randn(5, generator=torch_generator(3, "y")))


class _Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)
        self.conv = nn.Conv1d(2, 4, 3)
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.lstm = nn.LSTM(4, 6)
        self.norm = nn.LayerNorm(8)


def test_init_parameters_is_reproducible_and_leaves_the_global_generator() -> None:
    a = init_parameters(_Layers(), torch_generator(0, "test.init"))
    b = init_parameters(_Layers(), torch_generator(0, "test.init"))
    c = init_parameters(_Layers(), torch_generator(1, "test.init"))
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.startswith("norm"):
            assert not torch.equal(pa, pc), name
    # PyTorch's default bounds: Kaiming-uniform(a=sqrt 5) is within 1/sqrt(fan_in), so is the bias; the LSTM's 1/sqrt(hidden)
    assert a.lin.weight.abs().max() <= 1 / 16**0.5 and a.lin.bias.abs().max() <= 1 / 16**0.5
    assert a.conv.weight.abs().max() <= 1 / 6**0.5
    assert all(p.abs().max() <= 1 / 6**0.5 for p in a.lstm.parameters())
    assert torch.equal(a.emb.weight[0], torch.zeros(4)) and a.emb.weight[1:].std() > 0.5
    assert torch.equal(a.norm.weight, torch.ones(8)) and torch.equal(a.norm.bias, torch.zeros(8))


def test_init_parameters_refuses_a_parameter_it_does_not_know() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.empty(3).normal_())

    with pytest.raises(TypeError, match="Scale holds parameters"):
        init_parameters(nn.Sequential(nn.Linear(2, 3), Scale()), torch_generator(0, "x"))


def test_learned_parts_initialise_from_the_seed_without_the_global_generator(tmp_path: Path) -> None:
    from infrastructure.critic import Critic
    from infrastructure.world_model import WorldModel

    def weights(seed: int) -> list[torch.Tensor]:
        wm = WorldModel(3, 1, seed=seed, device="cpu", checkpoint_dir=tmp_path / "wm")
        critic = Critic(3, 1, action_low=[-2.0], action_high=[2.0], seed=seed, device="cpu", checkpoint_dir=tmp_path / "c")
        return [p.detach().clone() for p in (*wm.model.parameters(), *critic.model.parameters())]

    state = torch.random.get_rng_state()
    torch.manual_seed(123)
    first = weights(5)
    torch.manual_seed(456)  # another state of the global generator: the weights must not depend on it
    second = weights(5)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, weights(6)))
    torch.random.set_rng_state(state)


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in ROOT.joinpath(folder).rglob("*.py"))


def test_nothing_outside_the_tests_seeds_torchs_global_generator() -> None:
    """A library that calls ``torch.manual_seed`` changes the draws of everything else in the process;
    a module is initialised from its own generator (`init_parameters`, or the layer's ``generator=``)."""
    folders = [p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in ("tests", ".venv", "build", "site") and not p.name.startswith(".")]
    found = []
    for path in _sources(*folders):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("manual_seed", "seed") \
                    and isinstance(node.func.value, (ast.Name, ast.Attribute)) and ast.unparse(node.func.value) in ("torch", "torch.random", "torch.cuda", "np.random", "numpy.random"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node.func)}")
    assert found == [], f"seed a generator of your own (genesis_fp16.seeds) instead: {found}"


def test_no_hand_made_seed_salts_in_the_agents() -> None:
    """Every seed of the loop is a named stream (`stream_seed`), not the run's seed salted by hand."""
    salts = ("100_003", "default_rng([", "default_rng(10_000", "default_rng(20_000", "default_rng(30_000", "1_000_000 * (seed")
    found = [f"{p.relative_to(ROOT)}:{n} {salt}" for p in _sources("agents", "infrastructure") for n, line in enumerate(p.read_text().splitlines(), 1)
             for salt in salts if salt in line]
    assert found == []
