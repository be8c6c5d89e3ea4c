"""bench/_out.py: every bench writes its result file the same way — strict JSON, parent folders
made, the command that produced it inside."""

from __future__ import annotations

import json

from bench._out import command, write_result


def test_the_result_records_its_command_and_is_strict_json(tmp_path):
    path = tmp_path / "deep" / "er" / "out.json"
    write_result(path, {"rows": [{"p95_ms": float("inf"), "ok": 1.5}]}, "python -m bench.x", ["--n", "3"])
    text = path.read_text()
    assert "Infinity" not in text and text.endswith("\n")
    assert json.loads(text) == {"command": "python -m bench.x --n 3", "rows": [{"p95_ms": "inf", "ok": 1.5}]}


def test_a_list_is_written_as_it_is_and_no_path_writes_nothing(tmp_path):
    write_result(tmp_path / "rows.json", [1, 2])
    assert json.loads((tmp_path / "rows.json").read_text()) == [1, 2]
    write_result(None, {"a": 1}, "python -m bench.x")
    write_result("", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.json"]


def test_the_command_defaults_to_this_process_arguments(monkeypatch):
    monkeypatch.setattr("sys.argv", ["bench/x.py", "--rates", "1,2"])
    assert command("python -m bench.x") == "python -m bench.x --rates 1,2"
