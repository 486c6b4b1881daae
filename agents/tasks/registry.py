"""Task names -> tasks: the built-ins, plugins from the entry-point group
``genesis_fp16.tasks`` (each entry a ``Task`` or a callable returning one),
and any other gymnasium id with the defaults."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable, Union

from .builtin import BUILTIN
from .task import Task, TaskError

GROUP = "genesis_fp16.tasks"


def plugin_tasks() -> dict[str, Callable[[], Task]]:
    """Name -> task factory for every entry point of the group (the built-ins are listed there too)."""
    out: dict[str, Callable[[], Task]] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in BUILTIN:
            continue
        out[ep.name] = _loader(ep.name, ep.load)
    return out


def _loader(name: str, load: Callable[[], object]) -> Callable[[], Task]:
    def make() -> Task:
        try:
            obj: Union[Task, Callable[[], Task], object] = load()
        except Exception as exc:
            raise TaskError(
                f"task plugin {name!r} (entry point group {GROUP}) failed to load: {type(exc).__name__}: {exc}"
            ) from None
        task = obj() if callable(obj) and not isinstance(obj, Task) else obj
        if not isinstance(task, Task):
            raise TaskError(
                f"task plugin {name!r} gave {type(task).__name__}; expected an agents.tasks.Task or a callable "
                "returning one"
            )
        return task

    return make


def task_names() -> dict[str, str]:
    """Every registered name -> its description (built-ins first)."""
    names = {name: make().description for name, make in BUILTIN.items()}
    for name, make in plugin_tasks().items():
        try:
            names[name] = make().description or "(plugin)"
        except TaskError as exc:
            names[name] = f"(unavailable: {exc})"
    return names


def get_task(name: str) -> Task:
    """The registered task ``name``; else a gymnasium id with the defaults
    (checked when resolved: an unknown id is a TaskError then)."""
    if name in BUILTIN:
        return BUILTIN[name]()
    plugins = plugin_tasks()
    if name in plugins:
        return plugins[name]()
    return Task(env_id=name)
