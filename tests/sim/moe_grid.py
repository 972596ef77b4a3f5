"""The synthetic Qwen3-30B-A3B decode grid shared by the MoE profile tests: the model, GPU, routing
skew and graph sizes it is measured at, and the law its fake device follows (the weights read at
the copy bandwidth, WeightReadFloor, plus a launch and a cost per row)."""

from __future__ import annotations

from engine.core.graph_sizes import GraphSizes, decode_graph_sizes
from sim.moe import ExpertRouting, WeightReadFloor
from tests.sim.helpers import hardware, model

SPEC = model("qwen3-30b-a3b")
H100 = hardware("h100")
SKEW = 0.4
GRAPHS = GraphSizes(decode=decode_graph_sizes(256, 256))
ROUTING = ExpertRouting(SPEC.num_experts, SPEC.num_experts_per_tok, SKEW)
PHYSICS = WeightReadFloor(SPEC, H100)
LAUNCH_S, ROW_S = 1.5e-3, 2e-5
SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 128, 256)  # as the 30B-A3B grid on an H100 measured them
