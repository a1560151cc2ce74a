"""lakehouse.files.write_whole: the file is replaced whole, with the permissions asked, and a failed write
leaves the previous content and no partial file."""
from __future__ import annotations

import stat

import pytest

from lakehouse.files import write_whole


def test_replaces_the_content_whole_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "deep" / "er" / "result.json"
    write_whole(path, '{"a": 1}')
    write_whole(path, b"\x00bytes\xff", durable=True)
    assert path.read_bytes() == b"\x00bytes\xff"
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_a_secret_is_never_readable_by_others(tmp_path):
    path = tmp_path / "users"
    write_whole(path, "alice:hash\n", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_write_that_fails_keeps_the_old_content_and_removes_its_partial(tmp_path):
    path = tmp_path / "position.json"
    write_whole(path, "old")
    with pytest.raises(TypeError):
        write_whole(path, object())  # neither text nor bytes: fails while writing
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["position.json"]
