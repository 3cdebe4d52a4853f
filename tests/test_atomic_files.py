"""Files the harness writes whole or not at all (stored references, report.json and report.md, the left-out list)."""

import pytest

from harness.atomic_files import write_text_atomically


def test_a_write_replaces_the_whole_file_and_leaves_no_scratch(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    assert write_text_atomically(path, "new ✓") == path
    assert path.read_text(encoding="utf-8") == "new ✓"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_failed_write_leaves_the_old_file_and_no_scratch(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomically(path, "half written \ud800")  # a lone surrogate fails in the middle of encoding
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
