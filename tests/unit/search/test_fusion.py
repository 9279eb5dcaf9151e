"""Fusion by the shape of each list's scores: a full-text list whose first place stands out
moves the ranking, a flat one does not; a class is credited with its matching members."""

from __future__ import annotations

from refloop.search.fusion import fuse_shapes, is_test_file


def _rows(scores: dict[str, float], symbols: dict[str, str] | None = None) -> list[dict]:
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    return [{"path": "m.py", "start_line": int(name[1:]), "end_line": int(name[1:]) + 1,
             "symbol": (symbols or {}).get(name, name), "part": "whole", "_score": score}
            for name, score in ranked]


def _order(rows: list[dict]) -> list[int]:
    return [row["start_line"] for row in rows]


VECTORS = {f"d{n}": 0.60 - n * 0.005 for n in range(1, 21)}  # close cosines: a flat list


def test_a_full_text_first_place_that_stands_out_wins_over_close_cosines():
    texts = {"d5": 30.0, **{f"d{n}": 5.0 + n * 0.01 for n in range(6, 16)}}
    fused = fuse_shapes(_rows(VECTORS), _rows(texts), 0.5)
    assert _order(fused)[0] == 5


def test_a_flat_full_text_list_leaves_a_clear_vector_winner_first():
    vectors = {**VECTORS, "d1": 0.90}  # the vectors are sure
    texts = {f"d{n}": 10.0 + n * 0.01 for n in range(2, 16)}  # no word list stands out
    fused = fuse_shapes(_rows(vectors), _rows(texts), 0.5)
    assert _order(fused)[0] == 1


def test_a_class_rises_with_its_matching_method_which_stays_first():
    symbols = {"d1": "Cache.evict", "d9": "Cache"}
    fused = fuse_shapes(_rows(VECTORS, symbols), [], 0.5)
    assert _order(fused)[:2] == [1, 2]
    without = fuse_shapes(_rows(VECTORS, symbols), [], 0.5, member_share=0.0)
    assert _order(fused).index(9) < _order(without).index(9)


def test_a_definition_only_one_list_found_is_kept_with_that_list_s_row():
    fused = fuse_shapes(_rows({"d1": 0.5, "d2": 0.4}), _rows({"d7": 12.0, "d2": 3.0}), 1.0)
    assert set(_order(fused)) == {1, 2, 7}


def test_test_files_count_by_their_vectors_only():
    """Tests repeat the words of the code they test: on the word side they shadowed the
    definition asked for (networkx's TestDagLongestPath before dag_longest_path)."""
    vectors = _rows({"d1": 0.61, "d2": 0.60, **{f"d{n}": 0.5 - n * 0.001 for n in range(3, 20)}})
    vectors[1]["path"] = "algorithms/tests/test_dag.py"
    texts = [dict(vectors[1], _score=40.0), dict(vectors[0], _score=30.0),
             *[dict(row, _score=5.0) for row in vectors[2:]]]
    fused = fuse_shapes(vectors, texts, 0.5)
    assert (fused[0]["path"], fused[0]["start_line"]) == ("m.py", 1)
    assert any(row["path"].endswith("test_dag.py") for row in fused)  # still ranked
    for path in ("tests/test_x.py", "pkg/tests/util.py", "pkg/testing/a.py", "a_test.py",
                 "conftest.py"):
        assert is_test_file(path), path
    for path in ("testclient.py", "pkg/contest.py", "attestation.py"):
        assert not is_test_file(path), path
