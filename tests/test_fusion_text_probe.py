"""benchmarks/probes/fusion_text.py: trace names to HLO names, and the fusion's instruction and body from a module's
text (an excerpt of a real CPU dump's after-optimizations text)."""
from benchmarks.probes.fusion_text import computations, describe, hlo_name

MODULE = """HloModule jit_f, entry_computation_layout={(f32[8,16]{1,0})->f32[8]{0}}

%region_0.2 (reduce_max.1: f32[], reduce_max.2: f32[]) -> f32[] {
  %reduce_max.1 = f32[] parameter(0)
  %reduce_max.2 = f32[] parameter(1)
  ROOT %reduce_max.3 = f32[] maximum(%reduce_max.1, %reduce_max.2)
}

%fused_computation.2 (param_0.3: f32[8,16]) -> f32[8] {
  %param_0.3 = f32[8,16]{1,0} parameter(0)
  %abs.0 = f32[8,16]{1,0} abs(%param_0.3)
  %constant.4 = f32[] constant(-inf)
  ROOT %reduce_max.0 = f32[8]{0} reduce(%abs.0, %constant.4), dimensions={1}, to_apply=%region_0.2
}

ENTRY %main.9 (x.1: f32[8,16]) -> f32[8] {
  %x.1 = f32[8,16]{1,0} parameter(0)
  ROOT %reduce_fusion.7 = f32[8]{0} fusion(%x.1), kind=kInput, calls=%fused_computation.2
}
"""


def test_trace_names_map_to_hlo_names():
    assert hlo_name("fusion_1373") == "fusion.1373"
    assert hlo_name("loop_add_fusion_1") == "loop_add_fusion.1"
    assert hlo_name("loop_select_fusion") == "loop_select_fusion"


def test_describe_prints_the_instruction_and_its_body():
    assert set(computations(MODULE)) == {"region_0.2", "fused_computation.2", "main.9"}
    text = describe(MODULE, hlo_name("reduce_fusion_7"))
    assert text.splitlines()[0].startswith("ROOT %reduce_fusion.7 = f32[8]{0} fusion(%x.1), kind=kInput")
    assert "%abs.0 = f32[8,16]{1,0} abs(%param_0.3)" in text
    assert "ENTRY" not in text and "maximum" not in text     # only the called computation, not its neighbours
    assert describe(MODULE, "fusion.9") is None
