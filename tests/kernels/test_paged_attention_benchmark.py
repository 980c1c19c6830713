"""benchmarks/kernels/paged_attention.py runs before the GPU call does: its plan, the CUDA lowering of every Pallas
variant (ours and JAX's bundled peer) at real grid shapes, and a CPU smoke run whose reported errors are checked.

The smoke run compares the kernel (interpret mode) and the peer (its own interpret mode, on our pools converted to
its layout) with the jnp reference on the same K/V: a wrong layout, head order, length or softmax scale in the peer
adapter gives a relative error of order 1, not < 1e-2.
"""
import json

from benchmarks.kernels import paged_attention as bench


def test_plan_orders_target_first_and_skips_oversized():
    cfgs = bench.plan([1, 64, 256], [512, 4096, 32768], kv_limit_gb=20.0)
    order = [(c["batch"], c["context"]) for c in cfgs]
    target = [bc for bc in order if bench.in_target(*bc)]
    assert order[:len(target)] == target == [(64, 4096), (256, 4096), (64, 32768), (256, 32768)]
    rest = cfgs[len(target):]
    assert [c["kv_bytes"] for c in rest] == sorted(c["kv_bytes"] for c in rest)
    big = next(c for c in cfgs if (c["batch"], c["context"]) == (256, 32768))
    assert big["kv_bytes"] == 256 * 32769 * 8 * 128 * 2 * 2 and "34.4 GB" in big["skipped"]
    assert sum("skipped" in c for c in cfgs) == 1
    # the variant rule: the engine's choice first (8 splits for batches of the 16-sequence bucket, whose 16 x 8
    # programs fit 132 SMs; none beyond), (4, 1) always, at most 4 variants; the split rule's K below 2 programs per
    # SM, 2 splits up to 8 programs per SM (132 SMs, 8 KV heads), none beyond
    for b, ctx in order:
        v = bench.kernel_variants(b, ctx, 132)
        assert v[0] == (4, 8 if b <= 16 else 1) and (4, 1) in v and len(v) <= 4 and len(set(v)) == len(v)
        want = bench.split_rule(b, ctx, 132) if b * 8 < 2 * 132 else 2 if b * 8 < 8 * 132 else 1
        assert max(k for _, k in v[1:]) == want, (b, ctx, v)
    assert bench.split_rule(1, 4096, 132) == 16 and bench.split_rule(16, 4096, 132) == 3
    assert bench.split_rule(1, 40, 132) == 1  # 3 pages: no split below 4 pages per split


def test_every_pallas_variant_lowers_for_cuda(capsys):
    """The smallest and the largest configs of the default grid (34 GB of KV: 64-bit offsets, the peer's widest
    block tables) pass the Pallas Triton lowering for the GPU, ours and the peer's."""
    assert bench.main(["--lower-only", "--batch", "1", "256", "--context", "512", "32768"]) == 0
    out = capsys.readouterr().out
    assert out.count("lowered") >= 4 * 4 and "peer_p8_s16" in out and "peer_p8_s1 " in out


def test_cpu_smoke_run_reports_small_errors(tmp_path):
    path = tmp_path / "pa.json"
    rc = bench.main(["--interpret", "--batch", "2", "--context", "40", "--inner", "2", "--reps", "1", "--warmup", "0",
                     "--hbm-gib", "0.001", "--out", str(path)])
    assert rc == 0
    d = json.loads(path.read_text())
    (cfg,) = d["configs"]
    assert cfg["checked_against"] == "ref_while"
    rows = {r["impl"]: r for r in d["rows"]}
    assert {"ref_while", "ref_static", "kernel_p4_s1", "kernel_p4_s8", "peer_p8_s16"} <= set(rows), rows.keys()
    assert cfg["engine_variant"] == "kernel_p4_s8" and cfg["engine_us"] == rows["kernel_p4_s8"]["us"]
    for name, r in rows.items():
        assert "error" not in r, (name, r.get("error"))
        assert r["us"] > 0 and r["gbps"] > 0 and r["inner"] == 2
        assert r["rel_err"] < (1e-2 if r["kind"] != "peer" else 2e-2), (name, r["rel_err"])
    assert cfg["kernel_us"] == min(r["us"] for r in rows.values() if r["kind"] == "kernel")
    assert "kernel_speedup_vs_ref" in cfg and "kernel_speedup_vs_peer" in cfg
