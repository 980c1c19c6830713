"""Every benchmark script imports: they import helpers from each other (e.g. prefill_attention.py times with
paged_attention.py's `measure`), and a rename in one must not break another that only runs on the GPU."""
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                 for p in (ROOT / "benchmarks").rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("module", MODULES)
def test_benchmark_imports(module):
    importlib.import_module(module)
