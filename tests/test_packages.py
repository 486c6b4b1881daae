"""A host project with its own top-level `agents` or `infrastructure` package:
the shadow is named with both paths instead of a bare ModuleNotFoundError,
and the plugin and the seed's `infrastructure.training` keep working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from genesis_fp16.base.packages import shadowed

REPO = Path(__file__).resolve().parents[1]


def _host(tmp_path: Path, *names: str) -> Path:
    host = tmp_path / "host"
    for name in names:
        (host / name).mkdir(parents=True)
        (host / name / "__init__.py").write_text(f'"""the host project\'s own {name}"""\n')
    return host


def _python(host: Path, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(host))
    return subprocess.run([sys.executable, "-c", code], cwd=host, env=env, capture_output=True, text=True, timeout=120)


def test_our_packages_are_not_shadowed_here():
    assert shadowed() == []


def test_a_host_agents_package_is_named_with_both_paths_and_the_plugin_still_works(tmp_path):
    host = _host(tmp_path, "agents")
    done = _python(
        host,
        (
            "import warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import genesis_fp16\n"
            "    from infrastructure.training import FP16Trainer, FP16TrainingConfig\n"
            "shadow = [w for w in caught if issubclass(w.category, genesis_fp16.PackageShadowedWarning)]\n"
            "print(len(shadow)); print(shadow[0].message)\n"
            "import agents; print(agents.__doc__)\n"
        ),
    )
    assert done.returncode == 0, done.stderr
    count, message, doc = done.stdout.splitlines()[:3]
    assert count == "1"
    assert str(host / "agents") in message and str(REPO / "agents") in message and "docs/EMBEDDING.md" in message
    assert doc == "the host project's own agents"  # the host keeps its package


def test_our_agents_with_a_host_infrastructure_is_one_clear_error(tmp_path):
    host = _host(tmp_path, "infrastructure")
    # put our repo first for `agents` only: the host's infrastructure still comes before ours
    code = (
        "import sys, importlib.util, warnings\n"
        "warnings.simplefilter('ignore')\n"
        f"spec = importlib.util.spec_from_file_location('agents', {str(REPO / 'agents' / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(REPO / 'agents')!r}])\n"
        "module = importlib.util.module_from_spec(spec); sys.modules['agents'] = module\n"
        "try:\n"
        "    spec.loader.exec_module(module)\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__); print(exc)\n"
    )
    done = _python(host, code)
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.splitlines()[:2]
    assert kind == "PackageShadowedError"
    assert str(host / "infrastructure") in message and str(REPO / "infrastructure") in message


def test_cli_names_the_shadow(tmp_path):
    host = _host(tmp_path, "agents")
    env = dict(os.environ, PYTHONPATH=str(host))
    done = subprocess.run(
        [sys.executable, "-m", "genesis_fp16.cli", "--help"],
        cwd=host,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert str(host / "agents") in done.stderr and str(REPO / "agents") in done.stderr
