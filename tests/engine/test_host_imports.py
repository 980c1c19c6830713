"""The host side (scheduler, page pool, detokenizer, engine loop) never imports jax, and the wall between the
host (jaxinfer/engine/) and the device (jaxinfer/runner/) is crossed by neither: the types both need live in
jaxinfer/outputs.py and jaxinfer/api.py / draft_model.py wire them together."""
import subprocess
import sys

from tests.import_graph import graph, imported_names, modules


def test_engine_package_does_not_import_jax():
    code = ("import sys, jaxinfer.engine.engine, jaxinfer.engine.scheduler, jaxinfer.engine.kv_cache, "
            "jaxinfer.engine.detokenizer, jaxinfer.engine.request, jaxinfer.engine.ngram_proposer, "
            "jaxinfer.engine.spec_control; "
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def _crossings(src: str, dst: str) -> list[str]:
    """Imports (any statement, module level or inside a function, relative ones resolved) from a file of package
    `src` of anything in package `dst`."""
    mods = modules()
    return [f"{m} line {line}: {name}" for m, path in sorted(mods.items()) if m == src or m.startswith(src + ".")
            for name, line in imported_names(path, m) if name == dst or name.startswith(dst + ".")]


def test_engine_imports_nothing_from_runner():
    assert _crossings("jaxinfer.engine", "jaxinfer.runner") == []


def test_runner_imports_nothing_from_engine():
    assert _crossings("jaxinfer.runner", "jaxinfer.engine") == []


def test_no_engine_file_imports_jax_or_numpy_wall_types_module_does_neither():
    """No file of engine/ names jax anywhere (also inside functions); outputs.py imports neither jax nor numpy at
    run time (numpy only for annotations, under TYPE_CHECKING)."""
    mods = modules()
    leaks = [f"{m}: {name}" for m, path in mods.items() if m.startswith("jaxinfer.engine")
             for name, _ in imported_names(path, m) if name.split(".")[0] in ("jax", "jaxlib", "flax")]
    assert leaks == []
    code = "import sys, jaxinfer.outputs; print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'numpy'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    assert set(graph()["jaxinfer.outputs"]) == set()


def test_crossings_are_found():
    """The check sees a relative import: engine.py's `from ..outputs import ...` resolves to jaxinfer.outputs."""
    assert _crossings("jaxinfer.engine", "jaxinfer.outputs")
