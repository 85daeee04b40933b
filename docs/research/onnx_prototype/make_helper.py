#!/usr/bin/python3
"""Builds a tiny ONNX model with python3-onnx's helper API only (no torch): Gemm -> BatchNormalization
(training_mode=1, opset 15) -> Relu -> Dropout(ratio, training_mode=true), symbolic batch "N".
Run: PYTHONPATH=root/usr/lib/python3/dist-packages LD_LIBRARY_PATH=root/usr/lib/x86_64-linux-gnu /usr/bin/python3 make_helper.py"""
import os
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = os.path.dirname(os.path.abspath(__file__)) + "/models/helper_bn_train.onnx"
init = [numpy_helper.from_array(np.zeros(a, np.float32), n) for n, a in
        (("fc.weight", (8, 4)), ("fc.bias", (8,)), ("bn.weight", (8,)), ("bn.bias", (8,)),
         ("bn.running_mean", (8,)), ("bn.running_var", (8,)))]
init += [numpy_helper.from_array(np.array(0.25, np.float32), "p"), numpy_helper.from_array(np.array(True), "train")]
nodes = [
    helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["h"], name="/fc/Gemm", transB=1),
    helper.make_node("BatchNormalization", ["h", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                     ["hn", "bn.running_mean_new", "bn.running_var_new"], name="/bn/BatchNormalization",
                     training_mode=1, momentum=0.9, epsilon=1e-5),
    helper.make_node("Relu", ["hn"], ["r"], name="/act/Relu"),
    helper.make_node("Dropout", ["r", "p", "train"], ["y", "mask"], name="/drop/Dropout"),
]
g = helper.make_graph(nodes, "helper_bn_train", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], init)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)], producer_name="make_helper.py")
onnx.checker.check_model(m)
m = onnx.shape_inference.infer_shapes(m)
print([(v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in m.graph.value_info])
onnx.save(m, out)
print(out)
