"""lakehouse.storage: a URI answers the path operations the platform uses on its bookkeeping, through delta-rs'
object store (here on ``file:`` URIs, the same code that reaches hdfs:// and s3a://), and the settings take the
warehouse and checkpoints as URIs with their storage options."""
from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from lakehouse.settings import Settings, SettingsError
from lakehouse.storage import RemoteLocation, StorageError, delta_table, is_remote, location, remove_tree, \
    tree_bytes


def test_a_plain_path_stays_a_local_path_and_a_uri_becomes_a_remote_location(tmp_path):
    assert location(str(tmp_path)) == tmp_path and isinstance(location(str(tmp_path)), Path)
    assert isinstance(location("hdfs://namenode:8020/eventlake"), RemoteLocation)
    # Hadoop's spelling of a local URI, the one Spark compares table locations with.
    assert str(location(f"file://{tmp_path}/w")) == f"file:{tmp_path}/w"
    assert [is_remote(x) for x in ("/a/b", "a/b", Path("/a"), "file:/a", "s3a://bucket/a")] == \
        [False, False, False, True, True]


def test_names_parents_and_relative_paths_of_a_uri():
    w = location("hdfs://namenode:8020/eventlake/warehouse/")
    table = w / "_generations" / "payments" / "g0002" / "table"
    assert str(table) == "hdfs://namenode:8020/eventlake/warehouse/_generations/payments/g0002/table"
    assert table.name == "table" and table.parent.name == "g0002"
    assert w in table.parents and table.parents[-1] == location("hdfs://namenode:8020")
    assert table.relative_to(w) == PurePosixPath("_generations/payments/g0002/table")
    with pytest.raises(ValueError, match="not under"):
        w.relative_to(table)
    with pytest.raises(StorageError, match="expected scheme://authority/path"):
        RemoteLocation("hdfs:/no-authority")


def test_files_and_folders_at_a_uri(tmp_path):
    root = location(f"file://{tmp_path}/store")
    offsets = root / "checkpoint" / "offsets"
    assert not offsets.exists()
    offsets.mkdir()
    assert offsets.is_dir()
    for batch in ("0", "1"):
        (offsets / batch).write_text(f"v1\n{{\"batch\": {batch}}}")
    (offsets / ".2.tmp").write_text("partial")
    (offsets / ".2.tmp").replace(offsets / "2")
    assert sorted(p.name for p in offsets.iterdir()) == ["0", "1", "2"]
    assert sorted(p.name for p in offsets.glob("[0-9]")) == ["0", "1", "2"]
    assert (offsets / "1").read_text() == 'v1\n{"batch": 1}' and (offsets / "1").stat().st_size == 15
    (offsets / "0").unlink()
    (offsets / "0").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match=f"no such file: file:{tmp_path}/store/checkpoint/offsets/0"):
        (offsets / "0").read_text()
    with pytest.raises(StorageError, match="one level only"):
        list(root.glob("*/offsets"))
    # What a folder holds, every level down (what maintenance counts as freed), at a URI as at a path.
    assert tree_bytes(root / "checkpoint") == tree_bytes(tmp_path / "store" / "checkpoint") == 15 + len("partial") == \
        sum((offsets / b).stat().st_size for b in ("1", "2"))
    assert tree_bytes(root / "nothing") == tree_bytes(tmp_path / "nothing") == 0
    remove_tree(root / "checkpoint")
    assert not (tmp_path / "store" / "checkpoint").exists()
    (root / "empty").mkdir()
    (root / "empty").rmdir()
    assert not (tmp_path / "store" / "empty").exists()
    with pytest.raises(TypeError, match="is a URI, not a local path"):
        open(root / "x")  # noqa: SIM115 -- the point: never silently a local file named like the URI


def test_delta_rs_reads_a_table_at_a_uri(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    where = location(f"file://{tmp_path}/t")
    write_deltalake(str(where), pa.table({"a": [1, 2]}))
    assert delta_table(where).version() == 0


def test_the_settings_take_the_warehouse_and_checkpoints_as_uris_with_storage_options(tmp_path):
    s = Settings.load({"EVENTLAKE_WAREHOUSE_URI": "s3a://lake/eventlake/warehouse",
                       "EVENTLAKE_CHECKPOINTS_URI": "s3a://lake/eventlake/checkpoints",
                       "EVENTLAKE_STORAGE_OPTIONS": '{"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "s3cret"}'})
    assert str(s.table_path("event_archive")) == "s3a://lake/eventlake/warehouse/event_archive"
    assert str(s.checkpoints) == "s3a://lake/eventlake/checkpoints"
    assert s.warehouse.options == {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "s3cret"}
    assert "s3cret" not in repr(s)
    config = tmp_path / "eventlake.toml"
    config.write_text('warehouse_uri = "hdfs://nn:8020/w"\n[storage_options]\nHDFS_USER = "etl"\n')
    s = Settings.load({"EVENTLAKE_CONFIG": str(config)})
    assert str(s.warehouse) == "hdfs://nn:8020/w" and s.storage_options == {"HDFS_USER": "etl"}
    local = Settings.load({}).replace(home=tmp_path)
    assert local.warehouse == tmp_path / "warehouse" and local.checkpoints == tmp_path / "checkpoints"
    with pytest.raises(SettingsError, match="storage_options: not a JSON object"):
        Settings.load({"EVENTLAKE_STORAGE_OPTIONS": "AWS_REGION=eu"})


def test_a_uri_where_a_local_folder_is_needed_is_refused_naming_the_setting_to_use():
    with pytest.raises(SettingsError, match="home='hdfs://nn:8020/x': a local folder is needed here, not a URI; "
                                            "the tables and checkpoints take a URI: EVENTLAKE_WAREHOUSE_URI"):
        Settings.load({"EVENTLAKE_HOME": "hdfs://nn:8020/x"})
