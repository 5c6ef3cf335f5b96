"""aiacc TensorFlow plugin: Keras models, tf.Modules and tf.functions to the IR and back.

    graph = trace(model, example_inputs)      # frozen, NCHW IR graph
    fast = optimize(model, example_inputs)    # a tf.Module whose __call__ is a tf.function
    module = export(graph)                    # IR -> tf.Module (NHWC TF graph again)

Import-light: TensorFlow is imported by the submodules when they are first used. `plugin` is the plugin
protocol object (aiacc.plugins.base.Plugin, in translator.py); files.py holds `aiacc inspect/dump/optimize`
on SavedModel directories and .keras files.
"""
from aiacc.plugins.tf.translator import PLUGIN as plugin

trace, optimize, export = plugin.trace, plugin.optimize, plugin.export
translator = plugin  # the name the TF tests and earlier code use (it shadows the submodule's name)

__all__ = ["plugin", "trace", "optimize", "export"]
