"""`import openai` through refloop leaves the API's unused type models unimported, and every
name the SDK exports still resolves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from refloop.llm.lazy_types import LazyReexportFinder, reexports

PROBE = r"""
import json, sys
import refloop.llm.gateway  # noqa: F401 (imports openai the way a worker does)
import openai
from openai.types import Batch
from openai.types.chat import ChatCompletionChunk
from openai.types.chat import completion_create_params

out = {
    "responses_loaded": "openai.types.responses.response" in sys.modules,
    "beta_loaded": "openai.types.beta" in sys.modules,
    "batch": Batch.__module__,
    "chunk": ChatCompletionChunk.__module__,
    "params": completion_create_params.__name__,
    "listed": "ChatCompletionChunk" in dir(sys.modules["openai.types.chat"]),
    "image": openai.types.Image.__name__,
}
try:
    openai.types.NoSuchModel
except AttributeError as err:
    out["missing"] = str(err)
print(json.dumps(out))
"""


def test_openai_imports_only_the_types_it_uses_and_resolves_the_rest_on_use():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["responses_loaded"] and not out["beta_loaded"], out
    assert out["batch"] == "openai.types.batch", out
    assert out["chunk"] == "openai.types.chat.chat_completion_chunk", out
    assert out["params"] == "openai.types.chat.completion_create_params", out
    assert out["listed"] and out["image"] == "Image", out
    assert "NoSuchModel" in out["missing"], out


def test_only_a_pure_reexport_init_is_made_lazy():
    assert reexports('"""doc"""\nfrom __future__ import annotations\n'
                     "from .chat import A as A\nfrom .x import (\n    B,\n    C as D,\n)\n") == {
        "A": ("chat", "A"), "B": ("x", "B"), "D": ("x", "C")}
    for body in ("from .x import *\n", "from . import x\n", "import os\n",
                 "from .x import A\nVALUE = 1\n", "from openai.x import A\n",
                 "from .x import A\nif True:\n    pass\n"):
        assert reexports(body) is None, body


def test_a_package_that_does_more_than_reexport_is_imported_as_written(tmp_path: Path):
    for name, init in (("lazy_pkg", "from .inner import Thing as Thing\n"),
                       ("eager_pkg", "from .inner import Thing as Thing\nLOADED = True\n")):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text(init)
        (package / "inner.py").write_text("Thing = 'thing'\n")
    finder = LazyReexportFinder(["lazy_pkg", "eager_pkg"])
    sys.path.insert(0, str(tmp_path))
    sys.meta_path.insert(0, finder)
    try:
        import eager_pkg  # type: ignore[import-not-found]
        import lazy_pkg  # type: ignore[import-not-found]

        assert "lazy_pkg.inner" not in sys.modules and lazy_pkg.Thing == "thing"
        assert "lazy_pkg.inner" in sys.modules
        assert eager_pkg.LOADED and "eager_pkg.inner" in sys.modules
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(tmp_path))
        for name in ("lazy_pkg", "lazy_pkg.inner", "eager_pkg", "eager_pkg.inner"):
            sys.modules.pop(name, None)
