"""Every benchmark script imports: they import helpers from each other (e.g. prefill_attention.py times with
paged_attention.py's `measure`), and a rename in one must not break another that only runs on the GPU. And the
result files they write are named as the recorded ones are."""
import datetime
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                 for p in (ROOT / "benchmarks").rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("module", MODULES)
def test_benchmark_imports(module):
    importlib.import_module(module)


def test_result_file_names_carry_the_commit(tmp_path, monkeypatch):
    """write_result names a file as the recorded ones are named (<name>-<tag>-<commit>[-cpu]-<date>.json; the
    "-cpu-" marker keeps CPU smoke runs out of git), and leaves an unknown commit out of the name."""
    from benchmarks import common
    monkeypatch.setattr(common, "RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setenv("JAXINFER_COMMIT", "abc1234")
    path = pathlib.Path(common.write_result("probe", {"x": 1}, tag="side-a"))
    assert path.parent == tmp_path
    assert path.name == f"probe-side-a-abc1234-cpu-{datetime.date.today().isoformat()}.json"
    assert common.json.loads(path.read_text())["commit"] == "abc1234"
    monkeypatch.setenv("JAXINFER_COMMIT", "unknown")
    assert pathlib.Path(common.write_result("probe", {})).name.startswith("probe-cpu-")
