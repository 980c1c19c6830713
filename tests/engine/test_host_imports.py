"""The host side (scheduler, page pool, detokenizer, engine loop) never imports jax."""
import subprocess
import sys


def test_engine_package_does_not_import_jax():
    code = ("import sys, jaxinfer.engine.engine, jaxinfer.engine.scheduler, jaxinfer.engine.kv_cache, "
            "jaxinfer.engine.detokenizer, jaxinfer.engine.request, jaxinfer.engine.ngram_proposer, "
            "jaxinfer.engine.spec_control; "
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
