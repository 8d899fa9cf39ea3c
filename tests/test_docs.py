"""Every public class, function and method of `bullmq_compat` and `bullmq_compat.sync` has a docstring.

Public: named in the module's ``__all__``, and for a class every attribute not starting with ``_``
that it has (its own or inherited from a class of ours), properties included, plus ``__init__``
where the class itself defines one in bullmq_compat (an inherited ``__init__`` is documented by the
class it comes from, a dataclass's generated one by its fields). The API reference of the
documentation site (docs/reference/, mkdocstrings) is made from these docstrings.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Iterator

import bullmq_compat
import bullmq_compat.sync


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("bullmq_compat")


def _function_of(member: Any) -> Any:
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    if isinstance(member, property):
        return member.fget
    return member


def _has_doc(obj: Any) -> bool:
    return bool((getattr(obj, "__doc__", None) or "").strip())


def _public(module: ModuleType) -> Iterator[tuple[str, Any]]:
    prefix = "sync." if module is bullmq_compat.sync else ""
    for name in module.__all__:
        obj = getattr(module, name)
        if _ours(obj) and (inspect.isclass(obj) or inspect.isfunction(obj)):
            yield prefix + name, obj


def _generated_init(cls: type) -> bool:
    init = vars(cls).get("__init__")
    code = getattr(init, "__code__", None)
    return dataclasses.is_dataclass(cls) and code is not None and code.co_filename.startswith("<")


def undocumented(items: Iterable[tuple[str, Any]] | None = None) -> list[str]:
    """The public names without a docstring, as ``"Class.method"`` (``"sync.Class.method"``)."""
    missing: list[str] = []
    if items is None:
        items = [*_public(bullmq_compat), *_public(bullmq_compat.sync)]
    for label, obj in items:
        if not _has_doc(obj):
            missing.append(label)
        if not inspect.isclass(obj):
            continue
        names = {name for klass in obj.__mro__ if _ours(klass) for name in vars(klass) if not name.startswith("_")}
        if "__init__" in vars(obj) and not _generated_init(obj):
            names.add("__init__")
        for name in sorted(names):
            member = inspect.getattr_static(obj, name)
            func = _function_of(member)
            if not (inspect.isfunction(func) and _ours(func)):
                continue  # a constant, an enum member, or something inherited from outside the package
            if not _has_doc(func):
                missing.append(f"{label}.{name}")
    return missing


def test_every_public_class_function_and_method_has_a_docstring() -> None:
    missing = undocumented()
    assert missing == [], f"public names without a docstring: {missing}"


def test_the_walk_sees_methods_properties_and_inherited_ones() -> None:
    # the check would pass vacuously if the walk found nothing
    class Probe(bullmq_compat.Job):
        """A job subclass of the test's."""

        def __init__(self) -> None:
            pass

        def bare(self) -> None:
            pass

        @property
        def bare_property(self) -> int:
            return 1

        def documented(self) -> None:
            """Has one."""

    for obj in (Probe, Probe.__init__, Probe.bare, vars(Probe)["bare_property"].fget, Probe.documented):
        obj.__module__ = "bullmq_compat.probe"  # as if defined in the package
    missing = undocumented([("Probe", Probe)])
    assert missing == ["Probe.__init__", "Probe.bare", "Probe.bare_property"]
    # what it inherits from Job is documented there; Job's own methods are walked (it has many)
    assert undocumented([("Job", bullmq_compat.Job)]) == []


# -- the documentation site ----------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_the_api_reference_has_every_public_name() -> None:
    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        documented |= set(re.findall(r"^::: (\S+)$", page.read_text(encoding="utf-8"), flags=re.M))
    for module in (bullmq_compat, bullmq_compat.sync):
        for name in module.__all__:
            obj = getattr(module, name)
            # by its public path, or by the module that defines it (GroupKeeper's import is lazy)
            where = {f"{module.__name__}.{name}", f"{getattr(obj, '__module__', None)}.{name}"}
            assert where & documented, f"{module.__name__}.{name} is in no docs/reference/*.md"


def test_the_site_navigation_lists_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", nav, flags=re.M))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert pages == listed
