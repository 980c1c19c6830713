"""The package graph of jaxinfer/, serving/ and pallas_kernels/ has no import circle and no upward import.

LAYERS is the intended picture (../shared/ARCHITECTURE.md, docs/architecture.md), bottom first. Each entry is
a group of modules (a dotted prefix, or an exact name when it ends with "$"); a module belongs to the group of
its longest matching entry. A module may
import its own group and groups of LOWER layers only: not a higher layer, and not another group of its own layer
(engine/ and models/ stay unaware of each other). A new module must be placed in the table.
"""
from tests.import_graph import graph, strongly_connected

LAYERS = [
    # plain types and settings, no project imports; the kernels with their references
    ["jaxinfer.config", "jaxinfer.env_switch", "jaxinfer.outputs", "jaxinfer.sampling_params", "pallas_kernels"],
    # the host loop (no jax); the network and its architecture registry; mesh + sharding rules
    ["jaxinfer.engine", "jaxinfer.models", "jaxinfer.parallel"],
    ["jaxinfer.weights"],                        # checkpoint formats, quantize-on-load, the default model
    ["jaxinfer.runner", "jaxinfer.tokenizer"],   # the device side of a step; text <-> ids
    ["jaxinfer.draft_model", "jaxinfer.quality"],  # the draft's runner + its page allocator; perplexity
    ["jaxinfer.api"],                            # LLM / generate(): engine + runner (+ draft runner) assembled
    ["jaxinfer$"],                               # the package's public surface
    ["jaxinfer.cli_args"],                       # flags generated from the config, shared by every front end
    ["serving"],                                 # the HTTP server over the engine
    ["jaxinfer.cli"],                            # `jaxinfer ...`, including `jaxinfer serve`
]


def _matches(entry: str, module: str) -> bool:
    return module == entry[:-1] if entry.endswith("$") else module == entry or module.startswith(entry + ".")


def _group(module: str) -> str:
    best = max((p for layer in LAYERS for p in layer if _matches(p, module)), key=len, default=None)
    assert best is not None, f"module {module} is in no group of LAYERS (tests/test_import_graph.py): place it"
    return best


LAYER_OF = {p: i for i, layer in enumerate(LAYERS) for p in layer}
GRAPH = graph()


def test_no_import_circle():
    circles = strongly_connected(GRAPH)
    assert not circles, "import circles (counting imports inside functions): " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_no_upward_or_sideways_import():
    bad = []
    for m, deps in sorted(GRAPH.items()):
        gm = _group(m)
        for d, line in sorted(deps.items()):
            gd = _group(d)
            if gd != gm and LAYER_OF[gd] >= LAYER_OF[gm]:
                bad.append(f"{m} (line {line}) imports {d}: layer {LAYER_OF[gm]} {gm} -> layer {LAYER_OF[gd]} {gd}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_checks_can_fail():
    """The circle finder and the layering see what they must: a two-module circle, a relative import."""
    assert strongly_connected({"a": {"b": 1}, "b": {"a": 2}, "c": {"a": 3}}) == [["a", "b"]]
    assert "jaxinfer.outputs" in GRAPH["jaxinfer.engine.engine"]  # `from ..outputs import ...` resolved
    assert LAYER_OF[_group("jaxinfer.engine.engine")] < LAYER_OF[_group("jaxinfer.runner.model_runner")]
