"""Gradient communication planning: specs, the alpha-beta cost model, strategies and the simulator.

    model = models.resnet50()                       # or gradient_specs_from_graph(graph)
    cluster = ClusterSpec.from_workers(32, 8, network_gbps=25)
    plan = make_plan("aiacc", model, cluster)
    result = simulate(model, cluster, plan)         # result.iteration_s, result.exposed_s
    write_chrome_trace(result, "plan.json")
"""
from aiacc.core.comm.cost import CostModel
from aiacc.core.comm.errors import CommError, RankFailureError, RankMismatchError
from aiacc.core.comm.plan import Bucket, Piece, Plan
from aiacc.core.comm.simulate import SimResult, lower_bound, simulate
from aiacc.core.comm.spec import (ClusterSpec, DeviceModel, GradientSpec, Layer, ModelSpec,
                                  gradient_specs_from_graph, gradient_specs_from_params)
from aiacc.core.comm.strategies import STRATEGIES, aiacc_search, compare, make_plan
from aiacc.core.comm.trace import chrome_trace, write_chrome_trace

__all__ = ["Bucket", "ClusterSpec", "CommError", "CostModel", "DeviceModel", "GradientSpec", "Layer",
           "ModelSpec", "Piece", "Plan", "RankFailureError", "RankMismatchError", "STRATEGIES", "SimResult",
           "aiacc_search", "chrome_trace", "compare", "gradient_specs_from_graph", "gradient_specs_from_params",
           "lower_bound", "make_plan", "simulate", "write_chrome_trace"]
