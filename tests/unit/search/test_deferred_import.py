"""defer_package_init: a package's submodules import without its __init__, which runs on
the first read of one of its attributes (used to make `import lancedb` cheaper)."""

from __future__ import annotations

import sys
import threading

import pytest

from refloop.search.runtime import defer_package_init


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "deferred_pkg_probe"
    root.mkdir()
    (root / "__init__.py").write_text(
        "import deferred_pkg_probe.models as models\n"
        "RUNS = getattr(models, 'RUNS', 0) + 1\nmodels.RUNS = RUNS\nAPI = 'api'\n")
    (root / "models.py").write_text("MODEL = 'model'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "deferred_pkg_probe"
    for name in [n for n in sys.modules if n.startswith("deferred_pkg_probe")]:
        del sys.modules[name]


def test_submodules_import_without_the_init_which_runs_once_on_first_read(package):
    assert defer_package_init(package) is True
    from deferred_pkg_probe.models import MODEL

    assert MODEL == "model"
    module = sys.modules[package]
    assert "API" not in vars(module)  # __init__ has not run
    results = []
    threads = [threading.Thread(target=lambda: results.append(module.API)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["api"] * 4
    assert module.RUNS == 1  # once, though four threads read at the same time
    with pytest.raises(AttributeError):
        module.missing  # noqa: B018


def test_nothing_is_done_for_imported_modules_plain_modules_or_unknown_names(package):
    import json

    assert defer_package_init("json") is False  # already imported
    assert json.dumps([]) == "[]"
    assert defer_package_init("no_such_package_anywhere_xyz") is False
    assert "no_such_package_anywhere_xyz" not in sys.modules
    assert defer_package_init("deferred_pkg_probe.models") is False  # not a package
