"""One seed-stream function (issue 46): every seed the project derives is
`genesis_fp16.base.seeds.stream_seed` of (the run's seed, a stream's name, its
indices), and nothing outside the tests seeds torch's global generator; a
module is initialised from a generator of its own instead. Issue 53: an
allow-list (every generator seeded by `stream_seed`) replaces a list of old salts."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from genesis_fp16.base.seeds import SEED_BITS, init_parameters, numpy_rng, stream_seed, torch_generator

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
    others = [
        stream_seed(1, "learners.learn", 1),
        stream_seed(0, "learners.refine", 1),
        stream_seed(0, "learners.learn", 2),
        stream_seed(0, "learners.learn", 1, 0),
        stream_seed(0, "learners.learn"),
    ]
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
    # PyTorch's default bounds: Kaiming-uniform(a=sqrt 5) is within 1/sqrt(fan_in), so is the bias; the LSTM's
    # 1/sqrt(hidden)
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
        critic = Critic(
            3, 1, action_low=[-2.0], action_high=[2.0], seed=seed, device="cpu", checkpoint_dir=tmp_path / "c"
        )
        return [p.detach().clone() for p in (*wm.model.parameters(), *critic.model.parameters())]

    state = torch.random.get_rng_state()
    torch.manual_seed(123)
    first = weights(5)
    torch.manual_seed(456)  # another state of the global generator: the weights must not depend on it
    second = weights(5)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, weights(6)))
    torch.random.set_rng_state(state)


SEEDED_TREES = ("genesis_fp16", "agents", "infrastructure", "benchmarks", "scripts")
STREAM_CALLS = frozenset({"stream_seed", "numpy_rng", "torch_generator"})
"""`genesis_fp16.base.seeds`'s stream functions: a generator's seed is one of them, and their own seed (the first
argument) is the run's seed or a stream's, no arithmetic on it (what tells streams apart: the name and indices)."""
SEEDING_CALLS = frozenset(
    {
        "manual_seed",
        "default_rng",
        "Random",
        "RandomState",
        "SeedSequence",
        "PCG64",
        "PCG64DXSM",
        "MT19937",
        "Philox",
        "SFC64",
    }
)
"""Calls that seed a generator (torch's ``manual_seed``, NumPy's generators and bit generators, Python's ``Random``):
the seed, their first argument, must be a call to `stream_seed`."""
GLOBAL_SEEDING = frozenset(
    {
        "torch.manual_seed",
        "torch.random.manual_seed",
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "torch.seed",
        "torch.random.seed",
        "torch.cuda.seed",
        "torch.cuda.seed_all",
        "np.random.seed",
        "numpy.random.seed",
        "random.seed",
    }
)
"""Seeding a global generator changes the draws of whatever else runs in the process: never, whatever the seed."""


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _seed_argument(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in ("seed", "x", "entropy")), None)


def _salted(seed: ast.expr) -> bool:
    """Arithmetic, or a list of numbers, anywhere in a stream's seed: a salt made by hand."""
    return any(isinstance(n, (ast.BinOp, ast.UnaryOp, ast.List, ast.Tuple)) for n in ast.walk(seed))


def seeding_faults(source: str, filename: str = "<source>") -> list[str]:
    """Every call in ``source`` that seeds a generator other than from a named stream (`stream_seed`, `numpy_rng`,
    `torch_generator`), seeds a global one, or salts a stream's seed by hand: ``"line: call"`` each."""
    faults = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        called, seed = _called(node.func), _seed_argument(node)
        if called in STREAM_CALLS:
            if seed is not None and _salted(seed):
                faults.append(f"{node.lineno}: {ast.unparse(node)} (hand-made arithmetic on a stream's seed)")
        elif ast.unparse(node.func) in GLOBAL_SEEDING:
            faults.append(f"{node.lineno}: {ast.unparse(node)} (seeds a global generator)")
        elif called in SEEDING_CALLS and not (isinstance(seed, ast.Call) and _called(seed.func) == "stream_seed"):
            faults.append(f"{node.lineno}: {ast.unparse(node)} (not seeded from a named stream)")
    return faults


def test_the_seeding_check_catches_hand_made_seeds() -> None:
    bad = {
        "torch.Generator().manual_seed(seed + 1)": "not seeded from a named stream",
        "torch.Generator(device=d).manual_seed(0)": "not seeded from a named stream",
        "g = torch.Generator()\ng.manual_seed(seed)": "not seeded from a named stream",
        "np.random.default_rng([cfg.seed, 0xA125])": "not seeded from a named stream",
        "np.random.default_rng(seed=10_000 + seed)": "not seeded from a named stream",
        "np.random.default_rng()": "not seeded from a named stream",
        "default_rng(seed)": "not seeded from a named stream",
        "np.random.Generator(np.random.PCG64(seed))": "not seeded from a named stream",
        "random.Random(args.seed)": "not seeded from a named stream",
        "np.random.RandomState(3)": "not seeded from a named stream",
        "torch.Generator().manual_seed(int(stream_seed(0, 'x')) + 1)": "not seeded from a named stream",
        "torch.manual_seed(stream_seed(0, 'x'))": "seeds a global generator",
        "torch.cuda.manual_seed_all(0)": "seeds a global generator",
        "np.random.seed(1)": "seeds a global generator",
        "random.seed(1)": "seeds a global generator",
        "numpy_rng(seed * 1000 + seq_len, 'forensics.probe')": "hand-made arithmetic",
        "torch_generator(10_000 + seed, 'x')": "hand-made arithmetic",
        "stream_seed([seed, 11], 'x')": "hand-made arithmetic",
        "torch_generator(int(seed) ^ 0xA125, 'x')": "hand-made arithmetic",
        "torch.Generator().manual_seed(stream_seed(seed * 7, 'x'))": "hand-made arithmetic",
        "torch.seed()": "seeds a global generator",
    }
    for source, why in bad.items():
        faults = seeding_faults(source)
        assert len(faults) == 1 and why in faults[0], (source, faults)
    good = [
        "torch_generator(seed, 'learners.rows', generation)",
        "torch_generator(int(seed), 'model_env')",
        "torch.Generator().manual_seed(stream_seed(cfg.seed, 'x', g))",
        "torch.Generator(device=device).manual_seed(stream_seed(0, 'bench.limits.matmul'))",
        "np.random.default_rng(stream_seed(seed, 'x'))",
        "random.Random(stream_seed(args.seed, 'delays'))",
        "numpy_rng(self.seed, 'x', (step * accum + micro) * world + rank)",  # arithmetic on an index, not the seed
        "env.action_space.seed(seed)",  # an environment's start state: not a generator of the project's
        "env.reset(seed=seed + 1)",
    ]
    assert [f for source in good for f in seeding_faults(source)] == []


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in ROOT.joinpath(folder).rglob("*.py"))


def test_every_generator_is_seeded_from_a_named_stream() -> None:
    """An allow-list: outside the tests, every generator is seeded by `stream_seed` (directly, or by `numpy_rng` and
    `torch_generator`), none by a hand-made salt; none seeds torch's, NumPy's or Python's global generator (a module is
    initialised from a generator of its own: `init_parameters`, or the layer's ``generator=``).
    `genesis_fp16/base/seeds.py`
    is the one place that seeds a generator itself."""
    folders = [
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and p.name not in ("tests", ".venv", "build", "site") and not p.name.startswith(".")
    ]
    assert set(SEEDED_TREES) <= set(folders)
    allowed = ROOT / "genesis_fp16" / "seeds.py"
    found = [
        f"{path.relative_to(ROOT)}:{fault}"
        for path in _sources(*folders)
        if path != allowed
        for fault in seeding_faults(path.read_text(), str(path))
    ]
    assert found == [], f"seed a generator from a named stream (genesis_fp16.base.seeds) instead: {found}"
