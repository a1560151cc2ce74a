"""The import layering (docs/DESIGN.md, "Layers" and "Module map"), read from the source with ``ast``.

Imports inside functions count too: the ``envelope`` <-> ``schemas`` cycle this guards against was one.
Domains live in subpackages of ``event_store`` (``event_store/account/``); the framework (every other module)
knows them only through the registry, ``event_store.domains`` (docs/DESIGN.md, "Adding a domain").

Across the repository: ``lakehouse`` (settings, table access, signals) is the bottom and imports nothing else from
the repository; ``eventlake`` (the CLI, the demo, the generator, SQL reads) is the top, and nothing below it
imports it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "event_store"
# The bottom layer: what every other layer may import, and what imports nothing else from the repository.
BOTTOM = "lakehouse"
# The top layer: it may import everything, and nothing in LOWER may import it.
TOP = "eventlake"
# The layers below the top. (``infra``, the local broker and Airflow that the CLI starts, is the top's helper and
# not in this list; ``bench`` and ``tests`` are outside the layers.)
LOWER = ("lakehouse", "event_store", "read_models", "projection_core", "expectations", "reference_data", "spark_apps",
         "python_engine", "dags")
# Top-level folders of the repository: importing any of them from event_store is a layering question.
REPO_PACKAGES = {BOTTOM, "eventlake", "read_models", "projection_core", "spark_apps", "python_engine", "dags",
                 "expectations", "reference_data", "infra", "bench", "tests"}
# The pure core: no Kafka, no Spark, no Delta, no Airflow.
PURE = {"errors", "fields", "domain", "domains", "schemas", "upcasting", "envelope", "decider", "snapshots",
        "batch_decision", "handler_stats",
        "account", "account.aggregate", "account.schemas", "account.upcasters", "account.fraud_rules",
        "iot", "iot.aggregate", "iot.schemas", "iot.telemetry_rules",
        "site", "site.aggregate", "site.schemas"}
# The one framework module that may import domain packages.
REGISTRY = f"{PACKAGE}.domains"
IO_PACKAGES = {"kafka", "confluent_kafka", "pyspark", "delta", "deltalake", "airflow"}


def _modules(package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package (or of a folder of modules, such as ``dags``), subpackages included, by dotted
    name."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _domain_packages() -> set[str]:
    """The domain subpackages: every package directly below event_store."""
    return {f"{PACKAGE}.{path.parent.name}" for path in (ROOT / PACKAGE).glob("*/__init__.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module ``path`` imports, anywhere in it; ``from pkg import mod`` names ``pkg.mod`` when that is a
    module of the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (use absolute imports)"
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
    return found


MODULES = _modules()
IMPORTS = {name: _imports(path, MODULES) for name, path in MODULES.items()}
DOMAIN_PACKAGES = _domain_packages()


def _in_domain(module: str) -> bool:
    return any(module == d or module.startswith(d + ".") for d in DOMAIN_PACKAGES)


FRAMEWORK = sorted(m for m in MODULES if not _in_domain(m) and m != REGISTRY)


def test_domains_are_found():
    assert f"{PACKAGE}.account" in DOMAIN_PACKAGES and f"{PACKAGE}.account.aggregate" in MODULES
    assert f"{PACKAGE}.decider" in FRAMEWORK and f"{PACKAGE}.account" not in FRAMEWORK


@pytest.mark.parametrize("module", FRAMEWORK)
def test_the_framework_imports_no_domain_package(module):
    domain = sorted(m for m in IMPORTS[module] if _in_domain(m))
    assert not domain, (f"{module} imports {domain}: the framework knows domains only through the registry "
                        f"({REGISTRY}); ask it (DOMAINS, COMMAND_TYPES, EVENT_TYPES) instead (docs/DESIGN.md, "
                        f"'Adding a domain')")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_event_store_imports_only_the_bottom_layer_of_the_rest(module):
    outside = {m for m in IMPORTS[module] if m.split(".")[0] in REPO_PACKAGES - {BOTTOM}}
    assert not outside, (f"{module} imports {sorted(outside)}: outside event_store the write side may use only the "
                         f"bottom layer, {BOTTOM} (docs/DESIGN.md, 'Layers')")


# Every module below the top and the top's own, by dotted name; ``from eventlake import cli`` names eventlake.cli.
LOWER_MODULES = {name: path for package in LOWER for name, path in _modules(package).items()}
ALL_MODULES = {**LOWER_MODULES, **_modules(TOP)}
LOWER_IMPORTS = {name: _imports(path, ALL_MODULES) for name, path in LOWER_MODULES.items()}


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_layers_below_the_top_are_found():
    for module in ("lakehouse.settings", "lakehouse.tables", "lakehouse.signals", "event_store.handler",
                   "read_models.catalog", "expectations.checks", "spark_apps.archive_fold", "dags.check_read_models"):
        assert module in LOWER_MODULES, f"{module} is not among the modules checked below the top"
    assert not any(_in_package(m, TOP) for m in LOWER_MODULES)


def test_an_import_of_the_top_is_seen_in_every_form(tmp_path):
    source = tmp_path / "lower.py"
    source.write_text("import eventlake.query\nfrom eventlake import cli\n\n\n"
                      "def late():\n    from eventlake.generator import GeneratorConfig\n")
    found = {m for m in _imports(source, ALL_MODULES) if _in_package(m, TOP)}
    assert {"eventlake.query", "eventlake.cli", "eventlake.generator"} <= found


@pytest.mark.parametrize("module", sorted(LOWER_MODULES))
def test_nothing_below_the_top_imports_eventlake(module):
    top = sorted(m for m in LOWER_IMPORTS[module] if _in_package(m, TOP))
    assert not top, (f"{module} imports {top}: {TOP} is the top layer (the CLI, the demo, the generator, SQL "
                     f"reads) and nothing in {', '.join(LOWER)} may import it; move what is needed down (to "
                     f"{BOTTOM} when it needs nothing else from the repository) (docs/DESIGN.md, 'Layers')")


@pytest.mark.parametrize("module", sorted(m for m in LOWER_MODULES if _in_package(m, BOTTOM)))
def test_the_bottom_layer_imports_nothing_else_from_the_repository(module):
    above = sorted(m for m in LOWER_IMPORTS[module] if m.split(".")[0] in REPO_PACKAGES - {BOTTOM})
    assert not above, (f"{module} imports {above}: {BOTTOM} is the bottom layer, which every other one imports; "
                       f"what needs a layer above it belongs in that layer (docs/DESIGN.md, 'Layers')")


def test_event_store_modules_form_no_import_cycle():
    # A package naming itself (``from event_store.account import schemas`` in its __init__) is no cycle.
    graph = {m: {d for d in IMPORTS[m] if d in MODULES and d not in (PACKAGE, m)} for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}; move what both need to a module below them "
                        f"(e.g. event_store.errors)")
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("module", sorted(f"{PACKAGE}.{m}" for m in PURE))
def test_the_pure_core_imports_no_kafka_spark_delta_or_airflow(module):
    io = {m for m in IMPORTS[module] if m.split(".")[0] in IO_PACKAGES}
    assert not io, f"{module} is pure (decide/evolve, schemas, envelopes) but imports {sorted(io)}"


def _calls_and_handlers(path: Path) -> tuple[set[str], bool]:
    """Names of the librdkafka clients ``path`` constructs, and whether it catches BufferError."""
    built, buffer_error = set(), False
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in {"Producer", "Consumer", "AdminClient"}:
                built.add(name)
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            buffer_error |= any(isinstance(n, ast.Name) and n.id == "BufferError" for n in names)
    return built, buffer_error


def test_librdkafka_clients_and_the_buffer_error_retry_live_in_kafka_clients_only():
    for module, path in MODULES.items():
        built, buffer_error = _calls_and_handlers(path)
        if module == f"{PACKAGE}.kafka_clients":
            assert built and buffer_error, "event_store.kafka_clients no longer builds the clients it should"
            continue
        assert not built, f"{module} builds confluent-kafka {sorted(built)} itself; ask event_store.kafka_clients"
        assert not buffer_error, f"{module} retries on BufferError itself; use kafka_clients.produce"


# The read side's framework: what the projection, the checks, the rebuild, status, query and the DAGs run, for
# every domain. Only the registries (``read_models``, ``expectations``) and each domain's own code import a domain:
# its folders in event_store/, read_models/ and expectations/, and its detector app.
READ_SIDE = ("lakehouse", "read_models", "projection_core", "expectations", "spark_apps", "python_engine", "dags")
DOMAIN_APPS = {"spark_apps.fraud_detector", "spark_apps.telemetry_detector"}
READ_SIDE_REGISTRIES = {"read_models", "expectations"}


def _read_side_domains() -> set[str]:
    return {f"{package}.{path.parent.name}" for package in ("read_models", "expectations")
            for path in (ROOT / package).glob("*/__init__.py")}


READ_SIDE_DOMAINS = _read_side_domains()
EVERY_DOMAIN_PACKAGE = DOMAIN_PACKAGES | READ_SIDE_DOMAINS
READ_SIDE_FRAMEWORK = sorted(
    m for m in LOWER_MODULES
    if m.split(".")[0] in READ_SIDE and m not in DOMAIN_APPS | READ_SIDE_REGISTRIES
    and not any(_in_package(m, d) for d in READ_SIDE_DOMAINS))


def test_the_read_sides_domain_folders_and_framework_are_found():
    assert {"read_models.account", "read_models.iot", "read_models.site", "expectations.account",
            "expectations.iot", "expectations.site"} <= READ_SIDE_DOMAINS
    for module in ("spark_apps.projection", "spark_apps.merge", "spark_apps.events", "spark_apps.rebuild",
                   "spark_apps.status", "read_models.spec", "read_models.catalog", "expectations.checks",
                   "expectations.reconciliation", "dags.rebuild_read_model"):
        assert module in READ_SIDE_FRAMEWORK, module
    assert "read_models.iot.device_status" not in READ_SIDE_FRAMEWORK


@pytest.mark.parametrize("module", READ_SIDE_FRAMEWORK)
def test_the_read_sides_framework_imports_no_domain(module):
    domain = sorted(m for m in LOWER_IMPORTS[module] if any(_in_package(m, d) for d in EVERY_DOMAIN_PACKAGE))
    assert not domain, (f"{module} imports {domain}: the projection, checks, rebuild, status and DAGs know the "
                        f"domains only through the registries (read_models.REGISTRY, expectations.SUITES, "
                        f"event_store.domains) (docs/DESIGN.md, 'Adding a domain')")


def _named_read_models(path: Path, names: set[str]) -> list[str]:
    """The read models a module names in its string literals (docstrings aside: they may give an example)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return sorted({f"line {node.lineno}: {name}" for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                   for name in names if re.search(rf"\b{name}\b", node.value)})


def test_a_string_naming_a_read_model_is_seen(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""About payments."""\nTABLES = ("payments", "x")\n\ndef f():\n    """payments."""\n'
                      '    return f"{1}/account_summary"\n')
    assert _named_read_models(module, {"payments", "account_summary", "fraud"}) == [
        "line 2: payments", "line 6: account_summary"]


@pytest.mark.parametrize("module", READ_SIDE_FRAMEWORK)
def test_the_read_sides_framework_names_no_domains_table(module):
    import read_models

    named = _named_read_models(LOWER_MODULES[module], set(read_models.REGISTRY))
    assert not named, (f"{module} names read models ({'; '.join(named)}): what a domain's tables are, and the "
                       f"checks that compare them (expectations.<domain>.CROSS_MODEL_CHECKS), belong to the "
                       f"domain's folder; the framework reaches them through the registries")


# -- The whole repository: layers in order, no circle, no private name across modules -------------------------------
# docs/DESIGN.md, "Import structure". Every module of these packages, imports inside functions included.
# The layers, bottom first: a module imports modules of its own layer and of the layers below it, never above.
LAYERS = (
    ("lakehouse",),  # settings, storage, processes, signals: imports nothing else from the repository
    ("event_store",),  # the write side and the log's contracts
    ("read_models",),  # what each table is; the catalog of every table's identity and generations
    ("projection_core",),  # what a projection is, for both engines: its plan, checkpoint log, positions
    ("expectations",),  # the checks of the read models
    ("reference_data",),  # reference data from outside the log (merchants -> dim_merchant), checked by its suites
    ("spark_apps", "python_engine"),  # what runs on Spark (and the entry point choosing an engine); the Python engine
    ("infra",),  # what starts or deploys a real component (the CLI's helper)
    ("dags", "eventlake"),  # orchestration; the CLI, the demo, the generator, SQL reads
)
LAYER_OF = {package: n for n, packages in enumerate(LAYERS) for package in packages}
# Top-level folders of Python code outside the layers: nothing in the layers imports them.
OUTSIDE_LAYERS = {"tests", "bench"}
# What is left to mend: an import that closes circles (importer, module), and private names imported across modules
# (importer, module, name). Left because their files were being changed by other work at the time. Any other circle
# or private import fails the tests below; an entry mended fails ``test_what_is_left_to_mend_is_still_there`` until
# it is taken off these lists.
CIRCLE_IMPORTS_LEFT: set[tuple[str, str]] = set()
PRIVATE_IMPORTS_LEFT: set[tuple[str, str, str]] = set()


def _repository_modules() -> dict[str, Path]:
    return {name: path for package in LAYER_OF for name, path in _modules(package).items()}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the repository that ``name`` (a module, or a name in one) is, or lies in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], set[tuple[str, str, str]]]:
    """module -> the repository's modules it imports (anywhere in it: imports inside functions count); and every
    (importer, module, name) of a ``from module import _name`` across modules."""
    graph: dict[str, set[str]] = {}
    private: set[tuple[str, str, str]] = set()
    for module, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(filter(None, (_resolve(alias.name, modules) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: relative import (use absolute imports)"
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in modules else _resolve(node.module, modules)
                    if target is None:
                        continue
                    found.add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and target != module:
                        private.add((module, target, alias.name))
        graph[module] = found - {module}
    return graph, private


REPOSITORY = _repository_modules()
GRAPH, PRIVATE_IMPORTS = _import_graph(REPOSITORY)


def _layer(module: str) -> int:
    return LAYER_OF[module.split(".")[0]]


def _circles(graph: dict[str, set[str]]) -> list[tuple[set[str], list[str]]]:
    """Each set of modules that import each other in a loop, with one path a -> b -> ... -> a through it (Tarjan's
    strongly connected components, then a shortest way back to the first module inside one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    paths = []
    for component in components:
        start = min(component)
        came_from: dict[str, str] = {}
        frontier, end = [start], None
        while frontier and end is None:  # breadth first, inside the component, back to start
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & component):
                    if w == start:
                        end = v
                        break
                    if w not in came_from:
                        came_from[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [end]
        while path[-1] != start:
            path.append(came_from[path[-1]])
        paths.append((component, [*reversed(path), start]))
    return paths


def test_every_folder_of_python_code_has_a_layer():
    folders = {path.relative_to(ROOT).parts[0] for path in ROOT.glob("*/**/*.py")
               if not path.relative_to(ROOT).parts[0].startswith(".")}
    unplaced = sorted(folders - set(LAYER_OF) - OUTSIDE_LAYERS)
    assert not unplaced, (f"{unplaced}: a folder of Python code in no layer; add it to LAYERS in this test and to "
                          f"docs/DESIGN.md, 'Import structure'")


def test_the_graph_sees_every_layer_and_imports_inside_functions():
    assert {m.split(".")[0] for m in REPOSITORY} == set(LAYER_OF)
    # dags import spark_apps inside their task functions only (nothing heavy at parse time).
    assert "spark_apps.rebuild" in GRAPH["dags.rebuild_read_model"]


def test_a_circle_is_reported_as_a_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"} - {"e"}}
    assert _circles(graph) == [({"a", "b", "c"}, ["a", "b", "c", "a"])]


def test_the_repository_has_no_new_import_circle():
    graph = {m: {d for d in deps if (m, d) not in CIRCLE_IMPORTS_LEFT} for m, deps in GRAPH.items()}
    new = [path for _, path in _circles(graph)]
    assert not new, ("import circles: " + "; ".join(" -> ".join(path) for path in new) + ". Move what both sides "
                     "need to a module below them (by its job: a table's identity to read_models.catalog, an error "
                     "to a module of errors, a helper to the lower module) (docs/DESIGN.md, 'Import structure')")


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps if _layer(d) > _layer(m))
    order = " < ".join(", ".join(layer) for layer in LAYERS)
    assert not upward, (f"imports up a layer ({order}): {'; '.join(upward)}. Move what is needed down to the "
                        f"importer's layer or below (docs/DESIGN.md, 'Import structure')")


def test_no_private_name_is_imported_from_another_module():
    new = sorted(PRIVATE_IMPORTS - PRIVATE_IMPORTS_LEFT)
    assert not new, ("private names imported across modules: "
                     + "; ".join(f"{m} imports {name} from {d}" for m, d, name in new)
                     + ". Make the name public (no underscore, in __all__) or move it to where it is used")


def test_what_is_left_to_mend_is_still_there():
    in_circles = [component for component, _ in _circles(GRAPH)]
    mended = [f"{m} -> {d}" for m, d in sorted(CIRCLE_IMPORTS_LEFT)
              if d not in GRAPH.get(m, ()) or not any({m, d} <= c for c in in_circles)]
    mended += [f"{m} imports {name} from {d}" for m, d, name in sorted(PRIVATE_IMPORTS_LEFT - PRIVATE_IMPORTS)]
    assert not mended, (f"mended (well done): take {mended} off CIRCLE_IMPORTS_LEFT / PRIVATE_IMPORTS_LEFT in this "
                        f"test and docs/DESIGN.md, 'Import structure'")


# Tests use public names too. Left: the private names tests import from modules whose files were being changed by
# other work at the time (importing test file, module, name); any other fails the test below.
TESTS_PRIVATE_IMPORTS_LEFT = {
    ("tests/unit/test_event_parser.py", "event_store.envelope", "_load_json"),
    ("tests/unit/test_event_parser.py", "event_store.envelope", "_plain_event"),
    ("tests/unit/test_handler_core.py", "event_store.envelope", "_load_json"),
    ("tests/unit/test_handler_core.py", "event_store.decider", "_EVENT_ID_NAMESPACE"),
    ("tests/unit/test_fraud_consumer_core.py", "event_store.account.fraud_consumer", "_time_ms"),
    ("tests/unit/test_snapshots_and_policy.py", "event_store.client", "_needles"),
}


def test_tests_import_no_private_name_of_the_packages():
    found = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LAYER_OF:
                found.update((str(path.relative_to(ROOT)), node.module, alias.name) for alias in node.names
                             if alias.name.startswith("_") and not alias.name.startswith("__"))
    new = sorted(found - TESTS_PRIVATE_IMPORTS_LEFT)
    assert not new, ("tests import private names: " + "; ".join(f"{t} imports {n} from {m}" for t, m, n in new)
                     + ". Test through public names (make the name public, or test what uses it)")
