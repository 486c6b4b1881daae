"""What the repository's own files promise, checked against the code: the
example profile names only agents the code trains, and every relative link in
the README and docs/ points at a file that exists, and every link to another
page's anchor names an explicit anchor that page defines."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from agents.se_darwin_agent import EvolveConfig
from genesis_fp16.training import registry
from genesis_fp16.rollout.profiles import load_profiles
from agents.ppo.config import load_config
from agents.ppo.ppo import PPO
from infrastructure.world_model import WorldModel

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PROFILES = REPO / "configs" / "profiles.example.toml"


def _tiny_ppo(**fields: Any) -> PPO:
    cfg = load_config(
        None, num_envs=1, num_steps=8, minibatch_size=8, total_steps=8, vec_env="sync", device="cpu", **fields
    )
    ppo = PPO(cfg)
    ppo.envs.close()
    return ppo


def _ppo_agent_name(monkeypatch: pytest.MonkeyPatch) -> str:
    """The agent name PPO resolves its precision policy (and so its profile) under."""
    seen: list[str] = []
    real = registry.resolve_trainer

    def recording(agent: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(agent)
        return real(agent, *args, **kwargs)

    monkeypatch.setattr(registry, "resolve_trainer", recording)
    _tiny_ppo()
    assert len(seen) == 1
    return seen[0]


def test_example_profile_names_only_agents_the_code_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    used = {
        EvolveConfig().wm_agent,  # the world model inside `genesis-fp16 evolve`
        inspect.signature(WorldModel).parameters["agent"].default,
        _ppo_agent_name(monkeypatch),  # `genesis-fp16 ppo`
    }
    named = set(load_profiles(EXAMPLE_PROFILES).agents)
    assert named, "the example should show at least one agent"
    assert named <= used, (
        f"{EXAMPLE_PROFILES.name} has [agents.X] tables no code trains: {sorted(named - used)}; used: {sorted(used)}"
    )


def test_example_ppo_profile_reaches_the_ppo_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENESIS_FP16_PROFILES_FILE", str(EXAMPLE_PROFILES))
    (ppo_table,) = [v for name, v in load_profiles(EXAMPLE_PROFILES).agents.items() if name != "world_model"]
    config = _tiny_ppo(precision="fp16").trainer.config
    assert config.init_scale == ppo_table.values["init_scale"]
    assert config.growth_interval == ppo_table.values["growth_interval"]
    assert config.nonfinite_streak_threshold == ppo_table.values["nonfinite_streak_threshold"]


# -- links ------------------------------------------------------------------------------

# [text](target) and [text]: target; the target's #fragment and "title" dropped
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_PATH_SPAN = re.compile(r"`(\.\.?/[^`\s]+)`")  # `../x.md`: a path relative to the doc, read like a link


def _relative_targets(markdown: str) -> list[str]:
    """Link targets that are paths relative to the document, fragments kept."""
    unfenced = _FENCE.sub("", markdown)
    text = _CODE_SPAN.sub("", unfenced)  # other links inside code are examples, not links
    targets = _INLINE.findall(text) + _REFERENCE.findall(text) + _PATH_SPAN.findall(unfenced)
    return [t for t in targets if not (re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) or t.startswith(("#", "//")))]


def relative_links(markdown: str) -> list[str]:
    relative = [target.split("#", 1)[0] for target in _relative_targets(markdown)]
    return [t for t in relative if t]


def anchored_links(markdown: str) -> list[tuple[str, str]]:
    """``(path, anchor)`` of every link to another Markdown file's anchor."""
    pairs = [tuple(t.split("#", 1)) for t in _relative_targets(markdown) if "#" in t]
    return [(path, anchor) for path, anchor in pairs if path.endswith(".md")]


# An explicit anchor: GitHub and mkdocs both honour it, and no heading edit changes it,
# whereas heading slugs differ between the two renderers (`--` is kept by GitHub only).
_EXPLICIT_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def explicit_anchors(markdown: str) -> set[str]:
    return set(_EXPLICIT_ANCHOR.findall(_FENCE.sub("", markdown)))


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_link_extraction() -> None:
    text = (
        'see [a](docs/A.md#part) and ![img](plots/x.png "title"), [web](https://x.org/y.md), [top](#here)\n'
        "`[not](code.md)`, `genesis_fp16/x.py` but `../up/C.md`\n```\n[nor](fenced.md) `../nor.md`\n```\n"
        "[ref]: ../other/B.md\n"
    )
    assert relative_links(text) == ["docs/A.md", "plots/x.png", "../other/B.md", "../up/C.md"]
    assert anchored_links(text) == [("docs/A.md", "part")]
    assert explicit_anchors('<a id="part"></a>\n## Part\n```\n<a id="fenced"></a>\n```\n') == {"part"}


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_existing_files(doc: Path) -> None:
    missing = [t for t in relative_links(doc.read_text(encoding="utf-8")) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_pages_name_explicit_anchors(doc: Path) -> None:
    """README.md is not part of the mkdocs site, so only this test checks its anchors."""
    wrong = []
    for path, anchor in anchored_links(doc.read_text(encoding="utf-8")):
        target = doc.parent / path
        if not target.is_file() or anchor not in explicit_anchors(target.read_text(encoding="utf-8")):
            wrong.append(f"{path}#{anchor}")
    assert not wrong, (
        f'{doc.relative_to(REPO)} links to anchors its target does not define as `<a id="..."></a>`: {wrong}; '
        "put such a line before the heading and link to its id"
    )
