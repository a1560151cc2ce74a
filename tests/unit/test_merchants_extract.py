"""Extracting merchants, streamed: a file comes in chunks with its content hash; a database extract hashes its rows
in id order (the same rows give the same hash whatever order they were inserted in)."""
import hashlib
import sqlite3

from reference_data.extract import DatabaseSource, FileSource

HEADER = "merchant_id,name,mcc,country,risk_level\n"


def test_a_file_comes_in_chunks_of_typed_rows_with_the_hash_of_its_bytes(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(HEADER + "".join(f"m{i},Shop {i},{5411 + i},US,low\n" for i in range(5)))
    source = FileSource(str(path), max_bytes=10_000)
    batches = list(source.batches(chunk_rows=2))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert batches[0].to_pylist()[1] == {"merchant_id": "m1", "name": "Shop 1", "mcc": "5412", "country": "US",
                                         "risk_level": "low", "source_line": 3}
    assert source.content_hash == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_database_extract_hashes_its_rows_in_id_order(tmp_path):
    hashes = []
    for order in ([1, 2, 3], [3, 1, 2]):
        db = tmp_path / f"ref-{order[0]}.db"
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE merchants (merchant_id TEXT, name TEXT, mcc INT, country TEXT, risk_level TEXT)")
            con.executemany("INSERT INTO merchants VALUES (?, ?, ?, ?, ?)",
                            [(f"m{i}", f"S{i}", 5411, "US", "low") for i in order])
        source = DatabaseSource.from_url(f"sqlite:///{db}", max_bytes=10_000)
        rows = [r for b in source.batches(chunk_rows=2) for r in b.to_pylist()]
        assert [r["merchant_id"] for r in rows] == ["m1", "m2", "m3"] and rows[0]["mcc"] == "5411"
        hashes.append(source.content_hash)
    assert hashes[0] == hashes[1]


def test_an_airflow_connection_becomes_a_sqlalchemy_url():
    import pytest

    from reference_data.extract import database_url
    from reference_data.merchants import MerchantInputError

    assert database_url("m", "sqlite", host="/data/ref.db") == "sqlite:////data/ref.db"
    assert database_url("m", "sqlite", schema="/data/ref.db") == "sqlite:////data/ref.db"
    assert database_url("m", "postgres", "db.example", "ref", "etl", "p@ss", 5432) == (
        "postgresql://etl:p%40ss@db.example:5432/ref")
    with pytest.raises(MerchantInputError, match="'m': type 'mysql' is not supported"):
        database_url("m", "mysql", "h")
