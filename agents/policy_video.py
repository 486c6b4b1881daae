"""Episodes of an evolved policy recorded as a video (`agents.policies.EvolvedPolicy.record_video`): the env made
to render ``rgb_array`` frames once one frame was rendered here, a wrapper keeping every frame, imageio writing them
(``.gif`` always, ``.mp4`` with imageio-ffmpeg). Where the env cannot render, one line says why
(`VideoUnavailable`, which the policy raises as its `PolicyError`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from genesis_fp16.base.storage import PathLike

from .tasks import EpisodeSpec, ResolvedTask, run_episodes


class VideoUnavailable(ValueError):
    """The env cannot render frames here, or the frames cannot be written: one line saying why."""


def record_episode(
    spec: EpisodeSpec, params: np.ndarray, states: np.ndarray, resolved: ResolvedTask, path: PathLike
) -> tuple[int, float]:
    """One episode of ``spec`` with ``params`` from the first of ``states``, rendered to ``path``; (frames, the
    episode's return)."""
    from genesis_fp16.base.extras import require

    imageio = require("imageio", "genesis-fp16 eval --video")
    make, fps = _rendering_env(resolved)
    recorder: list[Any] = []

    def factory() -> Any:
        recorder.append(_frame_recorder(make()))
        return recorder[-1]

    result = run_episodes(replace(spec, env_factory=factory), params, states)
    frames = recorder[-1].frames
    try:
        if str(path).lower().endswith(".gif"):
            imageio.v2.mimsave(str(path), frames, duration=1000.0 / fps, loop=0)
        else:
            imageio.v2.mimsave(str(path), frames, fps=fps)
    except Exception as exc:
        detail = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise VideoUnavailable(
            f"the frames could not be written to {path} ({type(exc).__name__}: {detail}); a .gif needs only "
            "Pillow, a .mp4 needs imageio-ffmpeg"
        ) from None
    return len(frames), float(result["returns"][0])


def _rendering_env(resolved: ResolvedTask) -> tuple[Callable[[], Any], float]:
    """A maker of ``resolved``'s env rendering ``rgb_array`` frames, and its frame
    rate, once one frame was rendered here; `VideoUnavailable` saying why not."""
    import gymnasium as gym

    task = resolved.task

    def make() -> Any:
        if task.env_factory is not None:
            return task.env_factory()
        return gym.make(task.env_id, render_mode="rgb_array", **dict(task.env_kwargs))

    cannot = f"env {resolved.env_id!r} cannot render frames here (render_mode 'rgb_array')"
    try:
        env = make()
    except Exception as exc:
        raise VideoUnavailable(f"{cannot}: {_one_line(exc)}") from None
    try:
        if env.render_mode != "rgb_array":  # a gymnasium.Env always has render_mode and metadata
            made = "its env_factory makes it" if task.env_factory is not None else "it is made"
            raise VideoUnavailable(f"{cannot}: {made} with render_mode {env.render_mode!r}")
        env.reset(seed=0)
        frame = env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3:
            raise VideoUnavailable(f"{cannot}: render() gave {type(frame).__name__}, expected an (H, W, 3) array")
        fps = float((env.metadata or {}).get("render_fps") or 30)
    except VideoUnavailable:
        raise
    except Exception as exc:
        raise VideoUnavailable(f"{cannot}: {_one_line(exc)}") from None
    finally:
        try:
            env.close()
        except Exception:
            pass
    return make, fps


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    hint = ""
    if "OpenGL" in text or "GLFW" in text or "mjr_makeContext" in text:
        hint = "; MuJoCo needs an OpenGL context: MUJOCO_GL=egl (a GPU) or MUJOCO_GL=osmesa (software) where installed"
    return f"{type(exc).__name__}: {text[:300]}{hint}"


def _frame_recorder(env: Any) -> Any:
    """``env`` wrapped to keep every frame of its episodes (``.frames``): the start
    state's (after a task's ``set_state``) at the first step, then one after each step."""
    import gymnasium as gym

    class FrameRecorder(gym.Wrapper):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self.frames: list[np.ndarray] = []
            self.fresh = True

        def reset(self, **kwargs: Any) -> Any:
            self.fresh = True
            return self.env.reset(**kwargs)

        def step(self, action: Any) -> Any:
            if self.fresh:
                self.frames.append(np.asarray(self.env.render()))
                self.fresh = False
            out = self.env.step(action)
            self.frames.append(np.asarray(self.env.render()))
            return out

    return FrameRecorder(env)
