"""aiacc TensorFlow plugin: Keras models, tf.Modules and tf.functions to the IR and back.

    graph = trace(model, example_inputs)      # frozen, NCHW IR graph
    fast = optimize(model, example_inputs)    # a tf.Module whose __call__ is a tf.function
    module = export(graph)                    # IR -> tf.Module (NHWC TF graph again)

TensorFlow itself is imported by the submodules when they are first used.
"""
from aiacc.plugins.base import plugin_api
from aiacc.plugins.tf.translator import TFTranslator

translator = TFTranslator()
trace, optimize, export = plugin_api(translator)

__all__ = ["trace", "optimize", "export", "translator"]
