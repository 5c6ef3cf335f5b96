"""Graph passes: the pass manager, the rewrite-rule engine and one module per pass.

    from aiacc.core.passes import run_passes
    report = run_passes(graph, level=2)          # in place; report.table() / report.as_dict()

Importing this package registers every built-in pass with the manager.
"""
from aiacc.core.passes.manager import (PIPELINE, FunctionPass, Pass, PassContext, PassManager,  # noqa: F401
                                       PassRecord, PassReport, all_passes, get_pass, passes_by_level, pipeline,
                                       random_feeds, register_pass, run_passes)
from aiacc.core.passes import (affine_folding, attention, batchnorm_folding, constant_folding, conv_fusion,  # noqa: F401,E402
                               cse, dce, elementwise_fusion, gelu, gemm_fusion, identity_removal, layernorm, pad_folding,
                               transpose_reshape)  # (importing registers the passes)
from aiacc.core.passes.dce import eliminate_dead_code  # noqa: F401,E402
from aiacc.core.passes import canonicalize as _canonicalize_module  # noqa: F401,E402  (registers "canonicalize")
from aiacc.core.passes.canonicalize import canonicalize  # noqa: F401,E402

__all__ = ["run_passes", "Pass", "FunctionPass", "PassContext", "PassManager", "PassReport", "PassRecord",
           "register_pass", "get_pass", "all_passes", "pipeline", "passes_by_level", "random_feeds",
           "eliminate_dead_code", "PIPELINE", "canonicalize"]
