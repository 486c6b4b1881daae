"""PPO: each optimization flag does what it says, GAE, checkpoints, smoke runs
of CartPole-v1, Pendulum-v1 and HalfCheetah-v5, and the `ppo` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agents.ppo.config import load_config
from agents.ppo.ppo import PPO, run
from agents.ppo.results import CompiledFallback
from genesis_fp16.base.telemetry import read_events


def tiny(env_id="CartPole-v1", **kw):
    base = dict(
        env_id=env_id,
        num_envs=2,
        num_steps=16,
        minibatch_size=16,
        update_epochs=2,
        total_steps=64,
        eval_episodes=1,
        vec_env="sync",
        device="cpu",
    )
    base.update(kw)
    return load_config(None, **base)


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_batched_inference_picks_the_same_actions_as_per_env(env_id):
    obs = torch.randn(8, 4 if env_id == "CartPole-v1" else 3, generator=torch.Generator().manual_seed(0))
    results = {}
    for name, kw in {
        "batched": dict(batch_inference=True),
        "chunk3": dict(batch_inference=True, inference_batch_size=3),
        "per_env": dict(batch_inference=False),
    }.items():
        torch.manual_seed(0)
        ppo = PPO(tiny(env_id, num_envs=8, num_steps=16, minibatch_size=16, seed=3, **kw))
        calls = []
        original = ppo.forward
        ppo.forward = lambda x, _f=original: (calls.append(x.shape[0]), _f(x))[1]
        with torch.inference_mode():
            perturbation = ppo.net.perturbation(ppo._draw_noise())
        acts = [ppo.act(obs, perturbation[t]) for t in range(5)]
        results[name] = (torch.stack(acts), calls)
        ppo.close()
    assert results["batched"][1] == [8] * 5
    assert results["chunk3"][1] == [3, 3, 2] * 5
    assert results["per_env"][1] == [1] * 40
    for name in ("chunk3", "per_env"):
        if env_id == "CartPole-v1":
            assert torch.equal(results[name][0], results["batched"][0])
        else:
            torch.testing.assert_close(results[name][0], results["batched"][0])
    assert len(set(results["batched"][0].flatten().tolist())) > 1  # really sampled, not constant


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_rollout_log_probs_are_the_losss_log_probs(env_id):
    """The rollout and the update use one policy: the actor the rollout steps
    with is the network's actor, and the log-probability and value stored with
    each action (one forward over the rollout, before the update) are the ones
    the network gives it."""
    ppo = PPO(tiny(env_id, num_envs=8, seed=4))
    seen = []

    def update(advantages, returns):
        b = ppo.buffer
        with torch.inference_mode():
            out, value = ppo.net(b.obs.view(-1, ppo.obs_dim))
            logp, _ = ppo.net.log_prob_entropy(out, b.act.view(-1, *ppo.act_shape))
        seen.append((logp, b.logp.view(-1).clone(), value, b.val.view(-1).clone()))
        return {"update_steps": 0, "skipped_steps": 0}

    ppo._update = update
    ppo.train()
    assert len(seen) == ppo.cfg.num_iterations
    for logp, stored_logp, value, stored_value in seen:
        torch.testing.assert_close(stored_logp, logp)
        torch.testing.assert_close(stored_value, value)
        assert stored_logp.abs().sum() > 0 and stored_value.abs().sum() > 0  # filled in, not the buffer's zeros
    ppo.close()


def test_loss_returns_its_diagnostics():
    ppo = PPO(tiny(ent_coef=0.01, seed=4))
    ppo.train()
    from agents.ppo.ppo import gae

    rows = ppo.buffer.rows
    adv = torch.from_numpy(
        gae(
            rows["rew"],
            rows["val"],
            rows["done"],
            np.zeros(ppo.cfg.num_envs, np.float32),
            ppo.cfg.gamma,
            ppo.cfg.gae_lambda,
        )
    )
    mb = ppo.buffer.flat(adv, adv + ppo.buffer.val)
    loss, diagnostics = ppo._loss(ppo.net, mb)
    assert set(mb) == {"obs", "act", "logp", "adv", "ret", "val"}
    assert set(diagnostics) == {"pg_loss", "v_loss", "entropy", "approx_kl"}
    assert all(not d.requires_grad and d.dim() == 0 for d in diagnostics.values())
    expected = diagnostics["pg_loss"] + 0.5 * diagnostics["v_loss"] - 0.01 * diagnostics["entropy"]
    torch.testing.assert_close(loss.detach(), expected)
    # the value term is SB3's: vf_coef times the plain MSE of the value head against the returns
    with torch.no_grad():
        _, value = ppo.net(mb["obs"])
    torch.testing.assert_close(diagnostics["v_loss"], torch.nn.functional.mse_loss(value.float(), mb["ret"]))
    assert loss.requires_grad
    ppo.close()


def test_amp_fp16_update_goes_through_the_scaler():
    ppo = PPO(tiny(precision="fp16"))
    scaled, stepped = [], []
    scaler = ppo.trainer.scaler
    orig_scale, orig_step = scaler.scale, scaler.step
    scaler.scale = lambda loss: (scaled.append(loss.dtype), orig_scale(loss))[1]
    scaler.step = lambda opt, *a, **k: (stepped.append(1), orig_step(opt, *a, **k))[1]
    seen_dtypes = []
    fwd = ppo.forward
    ppo.forward = lambda x: (lambda out: (seen_dtypes.append(out[0].dtype), out)[1])(fwd(x))
    ppo.train()
    ppo.close()
    assert ppo.trainer.precision.name == "fp16" and scaler.is_enabled()
    updates = ppo.cfg.num_iterations * ppo.cfg.update_epochs * (ppo.cfg.batch_size // ppo.cfg.minibatch_size)
    assert len(scaled) == updates and len(stepped) == updates
    assert torch.float16 in seen_dtypes  # the forward really ran under FP16 autocast
    assert ppo.trainer.get_stats()["training_steps"] == updates


def test_amp_off_is_fp32_without_scaler_and_bf16_has_no_scaler():
    fp32 = PPO(tiny())
    bf16 = PPO(tiny(precision="bf16"))
    assert fp32.trainer.precision.name == "fp32" and not fp32.trainer.scaler.is_enabled()
    assert bf16.trainer.precision.name == "bf16" and not bf16.trainer.scaler.is_enabled()
    assert dict(fp32.optimization_summary())["AMP"] == "off"
    assert "bf16" in dict(bf16.optimization_summary())["AMP"]
    fp32.close(), bf16.close()


def test_kill_switch_keeps_amp_off(monkeypatch):
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    ppo = PPO(tiny(precision="fp16"))
    assert ppo.trainer.precision.name == "fp32"
    assert "kill switch" in dict(ppo.optimization_summary())["AMP"]
    ppo.close()


def test_compile_failure_falls_back_to_eager_with_a_logged_reason(monkeypatch, state_dir):
    def broken_compile(fn, **kw):
        def compiled(*a):
            raise RuntimeError("inductor: no C++ compiler found")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    ppo = PPO(tiny(use_torch_compile=True, compile_mode="reduce-overhead"))
    ppo.train()
    ppo.close()
    events = [e for e in read_events(state_dir / "events.jsonl") if e["event"] == "ppo.compile_fallback"]
    assert [e["function"] for e in events] == ["ActorCritic.forward"]  # one event, on the first failure
    assert all("no C++ compiler" in e["reason"] and e["mode"] == "reduce-overhead" for e in events)
    assert not ppo.forward.active and ppo.fast is None  # compiled code takes no fast path
    assert "fallback" in dict(ppo.optimization_summary())["torch.compile"]
    assert ppo.global_step == 64


def test_compile_wraps_the_forward_when_it_works(monkeypatch):
    calls = []

    def fake_compile(fn, mode=None):
        calls.append(mode)
        return lambda *a: ("compiled", fn(*a))[1]

    monkeypatch.setattr(torch, "compile", fake_compile)
    ppo = PPO(tiny(use_torch_compile=True, compile_mode="max-autotune"))
    assert calls == ["max-autotune"] and isinstance(ppo.forward, CompiledFallback) and ppo.forward.active
    assert dict(ppo.optimization_summary())["torch.compile"] == "on (mode max-autotune)"
    ppo.close()


def test_pinned_memory_only_applies_on_cuda():
    ppo = PPO(tiny(use_pinned_memory=True))
    assert not ppo.pin and not ppo.buffer.obs.is_pinned()
    assert "CPU device" in dict(ppo.optimization_summary())["pinned memory"]
    ppo.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_memory_on_cuda_trains():
    ppo = PPO(tiny(use_pinned_memory=True, device="cuda", precision="fp16"))
    assert ppo.pin and ppo.buffer.obs.is_pinned() and ppo.trainer.precision.name == "fp16"
    ppo.train()
    ppo.close()


def test_num_workers_sets_torch_threads():
    PPO(tiny(num_workers=1)).close()
    assert torch.get_num_threads() == 1


def test_action_repeat_counts_every_env_step():
    ppo = PPO(tiny(action_repeat=2, total_steps=128))
    ppo.train()
    ppo.close()
    assert ppo.cfg.num_iterations == 2 and ppo.global_step == 128
    assert all(r >= 2 for r in ppo.episode_returns)  # summed rewards: >= 2 per agent step survived


def test_gae_matches_a_hand_computation():
    from agents.ppo.ppo import gae

    rew, val = np.ones((3, 1), np.float32), np.array([[0.0], [0.5], [0.0]], np.float32)
    done = np.array([[0.0], [1.0], [0.0]], np.float32)
    adv = gae(rew, val, done, np.array([2.0], np.float32), 0.5, 0.5)
    # t=2: 1 + 0.5*2 - 0 = 2; t=1: done -> 1 - 0.5 = 0.5; t=0: delta 1 + 0.5*0.5 = 1.25, + 0.25*0.5 = 1.375
    np.testing.assert_allclose(adv[:, 0], [1.375, 0.5, 2.0])


def test_checkpoint_round_trip(tmp_path):
    ppo = PPO(tiny(seed=5))
    ppo.train()
    path = ppo.save_checkpoint(tmp_path / "ppo.pt")
    other = PPO(tiny(seed=6))
    extra = other.load_checkpoint(path)
    assert extra["global_step"] == 64 and other.global_step == 64
    for a, b in zip(ppo.net.state_dict().values(), other.net.state_dict().values()):
        assert torch.equal(a, b)
    ppo.close(), other.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "HalfCheetah-v5"])
def test_smoke_each_env(env_id, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its deprecation warnings to ./MUJOCO_LOG.TXT
    kw = dict(normalize_obs=True, normalize_reward=True) if env_id != "CartPole-v1" else {}
    result = run(tiny(env_id, total_steps=128, **kw))
    assert result.env_steps == 128 and result.iterations == 4
    assert np.isfinite(result.eval_return) and len(result.eval_returns) == 1
    assert result.trainer_stats["training_steps"] == 4 * 2 * 2
    assert set(result.time_split_s) == {"env", "inference", "update", "other"}
    assert all(v > 0 for k, v in result.time_split_s.items() if k != "other")


def test_the_running_statistics_are_numpys_mean_and_var_to_the_bit():
    """RunningMeanStd.update skips NumPy's wrappers (it runs every env step) and must give their bits: the first
    batch's statistics against a hand-written combination of x.mean(0) and x.var(0), float32 and float64."""
    from agents.ppo.rollout import RunningMeanStd

    rng = np.random.default_rng(0)
    for dtype, shape in ((np.float64, (8,)), (np.float32, (8, 17)), (np.float64, (256, 3))):
        x = (rng.normal(size=shape) * 30).astype(dtype)
        rms = RunningMeanStd(shape[1:])
        rms.update(x)
        n, count = shape[0], 1e-4
        total = count + n
        delta = x.mean(0) - np.zeros(shape[1:])
        assert np.array_equal(rms.mean, delta * n / total)
        assert np.array_equal(
            rms.var, (np.ones(shape[1:]) * count + x.var(0) * n + delta**2 * count * n / total) / total
        )


def test_reward_normalisation_is_on_by_default_and_scales_the_value_targets():
    """The default keeps the critic's targets near 1 (a CartPole return of 500 is about 100 unscaled): docs/PPO.md."""
    stored = {}
    for normalize in (None, False):  # None: the default
        cfg = load_config(
            None,
            total_steps=1024,
            eval_episodes=0,
            vec_env="sync",
            seed=1,
            **({} if normalize is None else {"normalize_reward": normalize}),
        )
        ppo = PPO(cfg)
        try:
            ppo.train()
            stored[normalize] = ppo.buffer.rows["rew"].copy()
        finally:
            ppo.close()
    assert np.all(stored[False] == 1.0)  # CartPole pays 1 a step
    # by the rollout's last step the returns' spread is large: the scaled rewards are well under 1 (clipped at 10)
    assert np.all((stored[None][-1] > 0) & (stored[None][-1] < 0.5)) and stored[None].max() <= 10.0


def test_cartpole_learns_quickly():
    # 20k steps with the base config: the deterministic return well above random (about 10-30)
    cfg = load_config(None, total_steps=20_480, eval_episodes=3, vec_env="sync", seed=1)
    result = run(cfg)
    assert result.eval_return > 100, result.eval_return


def test_cli_ppo_json_and_bad_input(tmp_path):
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    out = tmp_path / "ppo.json"
    runner = CliRunner()
    args = [
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "128",
        "--seed",
        "2",
        "--json",
        str(out),
        "--set",
        "num_envs=2",
        "--set",
        "num_steps=32",
        "--set",
        "minibatch_size=32",
        "--set",
        "eval_episodes=2",
        "--set",
        "optimizations.vec_env=sync",
        "--set",
        "precision=fp32",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for line in ("vectorized envs", "AMP", "torch.compile", "pinned memory", "batched inference", "action repeat"):
        assert line in res.output
    assert "evaluation return (2 deterministic episodes)" in res.stdout  # the result on stdout, the progress on stderr
    assert "note:" not in res.stderr  # 128 steps are two whole rollouts of 2 x 32: nothing rounded
    data = json.loads(out.read_text())
    for key in (
        "env_steps_per_s",
        "eval_return",
        "wall_s",
        "optimizations",
        "env_stepping_s",
        "inference_s",
        "update_s",
    ):
        assert key in data
    assert data["optimizations"]["vec_env_resolved"] == "sync" and len(data["eval_returns"]) == 2
    assert data["optimizations"]["precision"] == data["optimizations"]["precision_requested"] == "fp32"
    bad = runner.invoke(app, ["ppo", "--set", "optimizations.precision=float8"])
    assert bad.exit_code == 2 and "precision" in bad.output and "fp32, fp16, bf16" in bad.output
    removed = runner.invoke(app, ["ppo", "--set", "use_amp=true"])
    assert removed.exit_code == 2 and "was removed" in removed.output and "optimizations.precision" in removed.output
    missing = runner.invoke(app, ["ppo", "--config", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_cli_ppo_says_up_front_what_it_trains_and_puts_the_result_on_stdout():
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    args = [
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "100",
        "--seed",
        "2",
        "--set",
        "num_envs=2",
        "--set",
        "num_steps=32",
        "--set",
        "minibatch_size=32",
        "--set",
        "eval_episodes=1",
        "--set",
        "optimizations.vec_env=sync",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    notes = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "asked for 100 env steps, runs 64 = 1 rollout(s) of 2 envs x 32 steps" in notes[0]
    assert res.stderr.index("note:") < res.stderr.index("optimization")  # said before training starts
    trained = [line for line in res.stdout.splitlines() if "env steps trained" in line]
    assert len(trained) == 1 and "64 (asked 100)" in trained[0]
    assert "evaluation return (1 deterministic episodes)" in res.stdout and "note:" not in res.stdout


def test_steps_note_rounds_to_whole_rollouts_with_action_repeat():
    cfg = load_config(None, total_steps=20_000, env_id="CartPole-v1")
    assert (cfg.steps_to_run, cfg.num_iterations) == (19_456, 19)
    assert "asked for 20,000 env steps, runs 19,456 = 19 rollout(s) of 8 envs x 128 steps" in cfg.steps_note()
    assert load_config(None, total_steps=20_480, env_id="CartPole-v1").steps_note() is None
    small = load_config(None, ["optimizations.action_repeat=2"], total_steps=100, env_id="CartPole-v1")
    assert (
        small.steps_to_run == 2048 and "x action_repeat 2" in small.steps_note() and "rounded up" in small.steps_note()
    )


def test_cli_ppo_plot_and_tensorboard(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    plot, tb = tmp_path / "ppo.png", tmp_path / "tb"
    args = [
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "256",
        "--seed",
        "2",
        "--plot",
        str(plot),
        "--tensorboard",
        str(tb),
        "--set",
        "num_envs=2",
        "--set",
        "num_steps=32",
        "--set",
        "minibatch_size=32",
        "--set",
        "eval_episodes=2",
        "--set",
        "optimizations.vec_env=sync",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    accumulator = EventAccumulator(str(tb))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"ppo/policy_loss", "ppo/value_loss", "ppo/loss_scale", "ppo/overflow_rate", "ppo/episode_return"} <= tags
    assert [e.step for e in accumulator.Scalars("ppo/policy_loss")] == [64, 128, 192, 256]  # x: env steps


def test_cli_ppo_tensorboard_dir_from_the_setting(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    monkeypatch.setenv("GENESIS_FP16_TENSORBOARD_DIR", str(tmp_path / "tb"))
    args = [
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "64",
        "--set",
        "num_envs=2",
        "--set",
        "num_steps=32",
        "--set",
        "minibatch_size=32",
        "--set",
        "eval_episodes=0",
        "--set",
        "optimizations.vec_env=sync",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert [p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir()] == [True]


def test_joint_towers_equal_two_separate_mlps():
    from agents.ppo.ppo import ActorCritic

    torch.manual_seed(0)
    net = ActorCritic(4, 3, discrete=True, hidden=16)
    h = 16

    def mlp(w1, b1, w2, b2, head):
        return lambda x: head(torch.tanh(torch.tanh(x @ w1.t() + b1) @ w2 + b2))

    actor = mlp(net.w1[:h], net.b1[:h], net.w2[0], net.b2[0, 0], net.actor_head)
    critic = mlp(net.w1[h:], net.b1[h:], net.w2[1], net.b2[1, 0], net.critic_head)
    x = torch.randn(5, 4)
    out, value = net(x)
    torch.testing.assert_close(out, actor(x))
    torch.testing.assert_close(value, critic(x).squeeze(-1))
    # no weight shared: the actor's loss leaves the critic's rows without gradient
    out.sum().backward()
    assert net.w1.grad[h:].abs().sum() == 0 and net.w2.grad[1].abs().sum() == 0 and net.w1.grad[:h].abs().sum() > 0


def test_checkpoint_restores_reward_normalisation_statistics(tmp_path):
    ppo = PPO(tiny("Pendulum-v1", normalize_obs=True, normalize_reward=True, seed=5))
    ppo.train()
    path = ppo.save_checkpoint(tmp_path / "ppo.pt")
    other = PPO(tiny("Pendulum-v1", normalize_obs=True, normalize_reward=True, seed=6))
    other.load_checkpoint(path)
    for a, b in ((ppo.obs_rms, other.obs_rms), (ppo.ret_rms, other.ret_rms)):
        np.testing.assert_array_equal(a.mean, b.mean)
        np.testing.assert_array_equal(a.var, b.var)
        assert a.count == b.count
    ppo.close(), other.close()


def test_unsupported_spaces_are_a_clear_error_in_the_cli():
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    res = CliRunner().invoke(app, ["ppo", "--env", "Blackjack-v1", "--set", "optimizations.vec_env=sync"])
    assert res.exit_code == 2 and "not supported" in res.output and "Tuple" in res.output, res.output
    res = CliRunner().invoke(app, ["ppo", "--set", "device=cuda:abc"])
    assert res.exit_code == 2 and "device" in res.output, res.output


def test_unsupported_action_space_is_a_value_error():
    import gymnasium as gym

    from agents.ppo.envs import make_vector_env

    class MultiDiscreteEnv(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.MultiDiscrete([2, 3])

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, False, False, {}

    envs = make_vector_env([MultiDiscreteEnv, MultiDiscreteEnv], "sync")
    with pytest.raises(ValueError, match="MultiDiscrete"):
        PPO(tiny(), envs=envs)


def test_chunked_inference_keeps_each_chunks_values_when_compiled_outputs_are_reused(monkeypatch):
    # torch.compile(mode="reduce-overhead") on CUDA replays CUDA graphs whose outputs live in
    # static buffers that the next replay overwrites; simulate that: one output buffer per shape
    def static_output_compile(fn, mode=None):
        buffers = {}

        def compiled(x):
            outs = fn(x)
            single = isinstance(outs, torch.Tensor)
            outs = (outs,) if single else outs
            if x.shape not in buffers:
                buffers[x.shape] = tuple(torch.empty_like(o) for o in outs)
            for b, o in zip(buffers[x.shape], outs):
                b.copy_(o)
            return buffers[x.shape][0] if single else buffers[x.shape]

        return compiled

    obs = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    actions = {}
    for name, kw in {
        "batched": {},
        "chunk3": dict(inference_batch_size=3),
        "per_env": dict(batch_inference=False),
    }.items():
        monkeypatch.setattr(torch, "compile", static_output_compile)
        ppo = PPO(tiny("Pendulum-v1", num_envs=8, seed=3, use_torch_compile=True, compile_mode="reduce-overhead", **kw))
        with torch.inference_mode():
            perturbation = ppo.net.perturbation(ppo._draw_noise())
        actions[name] = ppo.act(obs, perturbation[0])
        ppo.close()
    torch.testing.assert_close(actions["chunk3"], actions["batched"])
    torch.testing.assert_close(actions["per_env"], actions["batched"])


def test_a_given_vector_env_must_use_same_step_autoreset():
    # GAE and the truncation bootstrap assume SAME_STEP (final_obs in infos, reset obs returned at once);
    # gymnasium's default NEXT_STEP would put a reward-0 reset transition into the rollout
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    with pytest.raises(ValueError, match="SAME_STEP"):
        PPO(tiny(), envs=envs)
    same = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    PPO(tiny(), envs=same).close()


def test_cuda_device_index_beyond_the_visible_gpus_is_a_value_error(monkeypatch):
    from agents.ppo.ppo import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match="cuda:3"):
        resolve_device("cuda:3")


def test_checkpoint_with_bad_normalisation_statistics_changes_nothing(tmp_path):
    from genesis_fp16.training.checkpoint import CheckpointError, load_payload, save_payload

    ppo = PPO(tiny("Pendulum-v1", normalize_obs=True, normalize_reward=True, seed=5))
    ppo.train()
    payload = load_payload(ppo.save_checkpoint(tmp_path / "ppo.pt"))
    payload["extra"]["obs_rms"] = {"mean": [0.0], "var": [1.0], "count": 3.0}  # another observation size
    bad = save_payload(tmp_path / "bad.pt", payload)
    other = PPO(tiny("Pendulum-v1", normalize_obs=True, normalize_reward=True, seed=6))
    weights = {k: v.clone() for k, v in other.net.state_dict().items()}
    mean = other.obs_rms.mean.copy()
    with pytest.raises(CheckpointError, match="extra.obs_rms") as info:
        other.load_checkpoint(bad)
    assert str(bad) in str(info.value)
    assert all(torch.equal(v, other.net.state_dict()[k]) for k, v in weights.items())
    np.testing.assert_array_equal(mean, other.obs_rms.mean)
    ppo.close(), other.close()
