"""The Airflow Assets (infra/airflow_assets.py), without Airflow: one Asset per warehouse table named and addressed
as the table, every DAG writing what the registry says, and every DAG file declaring outlets that cover the
tables it writes (read from its source: the DAG-level check is tests/integration/test_dags.py's DagBag)."""
import ast
import json

import pytest

import read_models
from infra import airflow_assets as assets
from infra.airflow import DAGS_FOLDER
from lakehouse.settings import Settings
from read_models.catalog import DIM_MERCHANT_TABLE
from read_models.spec import WINDOWED_SUM

DAG_FILES = sorted(DAGS_FOLDER.glob("*.py"))


def test_every_read_model_and_dim_merchant_has_an_asset_named_and_addressed_as_its_table():
    for table in [*read_models.REGISTRY, DIM_MERCHANT_TABLE]:
        assert assets.URIS[table] == f"eventlake://warehouse/{table}"
    assert assets.URIS["dim_merchant"] == "eventlake://warehouse/dim_merchant"  # as load_merchants named it first
    assert len(set(assets.URIS.values())) == len(assets.URIS)
    assert set(assets.GROUPS) == set(assets.URIS)
    assert set(assets.READ_MODELS) == set(read_models.REGISTRY)


def test_each_dag_writes_what_the_registry_says():
    assert set(assets.WRITES["rebuild_read_model"]) == set(read_models.REGISTRY)
    assert set(assets.WRITES["maintenance"]) == set(read_models.REGISTRY)
    windowed = {n for n, m in read_models.REGISTRY.items() if m.merge_strategy == WINDOWED_SUM}
    assert set(assets.WRITES["reprocess_windows"]) == windowed and windowed
    assert assets.WRITES["load_merchants"] == (DIM_MERCHANT_TABLE,)
    for dag_id, tables in assets.WRITES.items():
        assert tables and set(tables) <= set(assets.URIS), dag_id
    assert set(assets.ALIASES) <= set(assets.WRITES) and len(set(assets.ALIASES.values())) == len(assets.ALIASES)


def test_a_table_a_dag_does_not_write_is_refused():
    with pytest.raises(KeyError, match="reprocess_windows does not write 'account_summary'"):
        assets.record_written({"outlet_events": {}}, "reprocess_windows", "account_summary", {})
    with pytest.raises(KeyError, match="no warehouse table"):
        assets.table_asset(assets.READ_MODEL_CHECKS)


def test_the_watchers_kafka_connection_is_the_settings_cluster_with_its_own_group(tmp_path):
    settings = Settings(home=tmp_path, kafka_bootstrap_servers="broker-1:9092", topic_prefix="t1.")
    env = assets.kafka_connection_env(settings)
    connection = json.loads(env["AIRFLOW_CONN_EVENTLAKE_KAFKA"])
    assert connection["conn_type"] == "kafka"
    assert connection["extra"]["bootstrap.servers"] == "broker-1:9092"
    assert connection["extra"]["group.id"] == "t1.airflow-dead-letters-watch"
    assert connection["extra"]["auto.offset.reset"] == "latest"


def test_airflow_gets_the_watchers_connection_and_the_reader_role_may_use_its_group(tmp_path):
    from confluent_kafka.admin import AclOperation, ResourceType

    from event_store.kafka_access import acl_bindings
    from infra.airflow import environment
    from lakehouse.kafka_credentials import ROLE_USERS

    settings = Settings(home=tmp_path, kafka_bootstrap_servers="broker-1:9092", topic_prefix="t1.")
    assert "AIRFLOW_CONN_EVENTLAKE_KAFKA" in environment(settings, base={})
    assert environment(settings, base={"AIRFLOW_CONN_EVENTLAKE_KAFKA": "x"})["AIRFLOW_CONN_EVENTLAKE_KAFKA"] == "x"
    reader = f"User:{ROLE_USERS['reader']}"
    assert any(b.restype == ResourceType.GROUP and b.name == "t1.airflow-dead-letters-watch"
               and b.principal == reader and b.operation == AclOperation.READ for b in acl_bindings(settings))


def test_an_events_extra_names_the_generation_and_its_tables_delta_version(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    settings = Settings(home=tmp_path)
    assert assets.table_version(settings, "payments") == {"generation": 1, "delta_version": None}  # no table yet
    rows = pa.table({"payment_id": ["p1"]})
    write_deltalake(str(settings.table_path("payments")), rows)
    write_deltalake(str(settings.table_path("payments")), rows, mode="append")
    assert assets.table_version(settings, "payments") == {"generation": 1, "delta_version": 1}
    assert assets.table_version(settings, "payments", 1) == {"generation": 1, "delta_version": 1}


# -- Every DAG file's outlets, read from its source ---------------------------------------------------------------

def _dag_id(tree: ast.Module) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dag":
            for kw in node.keywords:
                if kw.arg == "dag_id":
                    return kw.value.value
    raise AssertionError("no @dag(dag_id=...)")


def _resolve(node: ast.expr, names: dict[str, ast.expr]) -> str:
    """The Asset or alias name an outlet expression stands for: ``assets.alias(assets.X)``,
    ``assets.asset(assets.X)``, ``assets.table_asset(CONSTANT)`` or a module-level name bound to one of them."""
    if isinstance(node, ast.Name):
        if node.id in names:
            return _resolve(names[node.id], names)
        from read_models import catalog
        return getattr(catalog, node.id)
    if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "assets":
        return getattr(assets, node.attr)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("alias", "asset", "table_asset")):
        return _resolve(node.args[0], names)
    raise AssertionError(f"an outlet this test cannot read: {ast.unparse(node)}")


def declared(path) -> tuple[str, set[str], set[str]]:
    """(dag_id, the outlets its tasks declare, the dag ids its record_written calls name)."""
    tree = ast.parse(path.read_text())
    names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}
    outlets, recorded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "outlets":
            outlets.update(_resolve(e, names) for e in node.value.elts)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "record_written"):
            recorded.add(node.args[1].value)
    return _dag_id(tree), outlets, recorded


def test_every_dag_file_is_known_with_what_it_writes():
    assert DAG_FILES and {declared(path)[0] for path in DAG_FILES} == set(assets.WRITES)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.stem)
def test_every_dag_declares_outlets_covering_the_tables_it_writes(path):
    dag_id, outlets, recorded = declared(path)
    if dag_id in assets.ALIASES:  # tables chosen at run time: the alias, and each task records its table
        assert outlets == {assets.ALIASES[dag_id]}, f"{path.name}: outlets {outlets}"
        assert recorded == {dag_id}, f"{path.name} never announces what it wrote (assets.record_written)"
    else:
        assert outlets == set(assets.WRITES[dag_id]), f"{path.name}: outlets {outlets}"


def test_removing_an_outlet_is_seen(tmp_path):
    source = (DAGS_FOLDER / "load_merchants.py").read_text()
    assert "@task(outlets=[DIM_MERCHANT])" in source
    stripped = tmp_path / "load_merchants.py"
    stripped.write_text(source.replace("@task(outlets=[DIM_MERCHANT])", "@task"))
    assert declared(stripped)[1] == set()
    with pytest.raises(AssertionError, match="outlets set()"):
        test_every_dag_declares_outlets_covering_the_tables_it_writes(stripped)
