"""The one bounded cache of per-shape step values: its bound and what it forgets."""

from __future__ import annotations

from trtio._cache import CACHE_LIMIT, BoundedCache


def test_a_cache_holds_at_most_its_limit_and_forgets_the_oldest_first() -> None:
    cache: BoundedCache[int, str] = BoundedCache()
    for i in range(CACHE_LIMIT):
        assert cache.put(i, f"v{i}") == f"v{i}"
    assert len(cache) == CACHE_LIMIT and cache.get(0) == "v0"
    cache.put(0, "again")  # a key it holds takes no room
    assert len(cache) == CACHE_LIMIT
    cache.put(CACHE_LIMIT, "new")
    assert len(cache) == CACHE_LIMIT
    assert cache.get(0) is None and 0 not in cache, "the oldest entry went first"
    assert cache.get(1) == "v1" and cache.get(CACHE_LIMIT) == "new"
    for i in range(10 * CACHE_LIMIT):  # a shape that keeps changing never grows it
        cache.put(("shape", i), "x")  # type: ignore[arg-type]
    assert len(cache) == CACHE_LIMIT
    cache.clear()
    assert len(cache) == 0


def test_setups_keep_no_unbounded_dict_of_step_values() -> None:
    """Every per-shape cache of the setups and their step writers is a BoundedCache: a dict attribute that
    grows with the shapes a runtime passes would grow without bound."""
    import ast
    from pathlib import Path

    import trtio

    root = Path(trtio.__file__).parent
    found = []
    for path in [*sorted((root / "_setups").glob("*.py")), *sorted((root / "_contracts").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        dicts = set()  # attributes made as plain dicts: ``self._x = {}`` / ``self._x: dict[...] = {}``
        for node in ast.walk(tree):
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Attribute) and isinstance(value, (ast.Dict, ast.DictComp)):
                dicts.add(target.attr)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:  # a dict keyed by anything a step computes: ``self._x[key] = value``
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr in dicts:
                    found.append((f"{path.name}:{node.lineno}", t.value.attr))
    allowed = {"_rope_sources", "_targets", "_level_sources", "_tables", "tables",
               "_attached"}  # one per engine, level, table or component
    unexpected = [where for where, attr in found if attr not in allowed]
    assert not unexpected, f"per-step dict writes outside a BoundedCache: {unexpected}"
    assert found, "the check sees the allowed ones (it reads the code it means to)"
