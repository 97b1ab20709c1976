"""Local data files read with each row's place: a bad line is named FILE:LINE."""

from __future__ import annotations

import json

import pytest

from distill.common.datafiles import check_rows, read_rows, text_field
from distill.common.io import DataFileError


def test_json_lines_keep_line_numbers_and_only_newlines_split_them(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"q": "a\u2028b\x1cc\x85d"}) + "\n\n" + json.dumps({"q": "e"}) + "\n")
    rows = read_rows(path)
    assert rows == [(f"{path}:1", {"q": "a\u2028b\x1cc\x85d"}), (f"{path}:3", {"q": "e"})]
    path.write_text('{"q": "a"}\n{"q": \n')
    with pytest.raises(DataFileError, match=rf"^{path}:2: not JSON \(Expecting value at column 7\); fix or delete the line$"):
        read_rows(path)
    path.write_text('{"q": "a"}\n[1, 2]\n')
    with pytest.raises(DataFileError, match=rf"^{path}:2: a JSON list, not an object"):
        read_rows(path)


def test_a_json_array_places_each_item_at_its_line(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"q": "a"},\n  {"q": "b",\n   "r": 1}\n]\n')
    assert read_rows(path) == [(f"{path}:2", {"q": "a"}), (f"{path}:3", {"q": "b", "r": 1})]
    path.write_text('[\n  {"q": "a"},\n  {"q": }\n]\n')
    with pytest.raises(DataFileError, match=rf"^{path}:3: not JSON"):
        read_rows(path)
    path.write_text('[{"q": "a"}, 3]')
    with pytest.raises(DataFileError, match=rf"^{path}:1: a JSON int"):
        read_rows(path)
    (tmp_path / "lines.json").write_text('{"q": "a"}\n{"q": "b"}\n')  # JSON lines in a .json file, as datasets reads them
    assert [r for _, r in read_rows(tmp_path / "lines.json")] == [{"q": "a"}, {"q": "b"}]


def test_parquet_rows_empty_files_and_checks(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"q": "a"}, {"q": None}]).to_parquet(str(tmp_path / "rows.parquet"))
    rows = read_rows(tmp_path / "rows.parquet")
    assert rows[1] == (f"{tmp_path / 'rows.parquet'}: row 2", {"q": None})
    with pytest.raises(DataFileError, match=r"rows.parquet: row 2: no 'q' field; T rows need it"):
        check_rows(rows, lambda row: text_field(row, "q", "T"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataFileError, match="empty.jsonl: no rows"):
        read_rows(tmp_path / "empty.jsonl")
    assert read_rows(tmp_path / "empty.jsonl", allow_empty=True) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_rows(tmp_path / "missing.jsonl")
    assert text_field({"q": 3}, "q", "T") == "'q' is a int, not text" and text_field({"q": " "}, "q", "T") == "'q' is empty"
