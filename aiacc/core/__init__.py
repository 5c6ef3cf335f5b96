"""The aiacc core: the IR and everything that works on it. Imports no deep-learning framework."""
from aiacc.core.ir import Graph, Node, TensorType, Value, topological_sort  # noqa: F401
from aiacc.core.text import parse, print_graph  # noqa: F401
from aiacc.core.runtime.executor import Interpreter, run  # noqa: F401
from aiacc.core import ops  # noqa: F401
from aiacc.core.memory import MemoryPlan, check_plan, format_memory_plan, plan_memory  # noqa: F401
