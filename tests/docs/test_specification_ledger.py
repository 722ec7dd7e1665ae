"""``docs/specification.md``, the ledger of the two specification files, is checked row by row.

The page is the source of truth: this module parses its two tables and fails when a row's evidence does not
hold (issue 32):

* a cited test node id (``tests/x/test_y.py::test_z``) names no test in ``tests/`` (an AST scan, no collection);
* a quoted refusal (``refusal: `...` ``) occurs nowhere in kvpools' source (``kvpools_core/``, ``plugins/``);
* a row is neither tested, refused (a refusal and a test), not applicable with a reason, nor NOT MODELLED with
  an open issue;
* a function or class of ``../shared/reference/000_*`` / ``002_*`` has no row, or a row names one that does
  not exist or cites lines outside it (skipped, with the shared checkout's reason, where ``../shared`` is absent);
* a server argument or environment variable the files read has no line in the page's index of reads, or a
  line cites a row that does not exist;
* the counts at the top of the page are not the rows' own.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.oracle.locate import SHARED_DIR, skip_or_fail

ROOT = Path(__file__).parents[2]
LEDGER = ROOT / "docs" / "specification.md"
REFERENCE = SHARED_DIR / "reference"
SOURCES = (ROOT / "kvpools_core", ROOT / "plugins")

OPEN_ISSUES: frozenset[int] = frozenset()
"""Issues a NOT MODELLED row may cite: none (31, the unified memory pool, 32, the silent mis-plans, and 33, the rest
of the specification, are closed), so no branch may be left NOT MODELLED.  Add a number when an open issue takes a
branch on; every row still citing it fails here once it closes."""

STATUSES = ("tested", "refused", "not applicable", "NOT MODELLED")
FILES = {"002": "002_*.txt", "000": "000_*.txt"}
"""Row id prefix -> the specification file its rows cite."""

TEST_ID = re.compile(r"`(tests/[\w/]+\.py(?:::\w+)+)`")
REFUSAL = re.compile(r"refusal: `([^`]+)`")
ISSUE = re.compile(r"#(\d+)\b")
LINES = re.compile(r"\bL(\d+)(?:-(\d+))?")
QUALNAME = re.compile(r"^`([\w.]+)`")
READS_HEADING = "## Options and environment variables read"
READS = (
    r"envs\.(SGLANG_\w+)",
    r"server_args\.(\w+)",
    r"\bsa\.(\w+)",
    r"\bdisagg\.(\w+)",
    r"get_(?:memory|schedule|disagg|spec|parallel|mm)\(\)\.(\w+)",
    r"get_exec\(\)\.(?:mamba|kernel|features)\.(\w+)",
    r"\b(max_speculative_num_draft_tokens|pre_capture_activation_reserve_mb)\(",
)
"""How the files read a server argument or an environment variable (``get_*()`` are SGLang's runtime context)."""
ROW_ID = re.compile(r"\b(\d{3}-\d+)\b")
COUNTS = re.compile(
    r"\*\*Counts:\*\* (\d+) rows: (\d+) tested, (\d+) refused by name, (\d+) not applicable, (\d+) NOT MODELLED"
)


@dataclass(frozen=True)
class Row:
    id: str
    spec: str
    decides: str
    status: str
    evidence: str

    @property
    def qualname(self) -> str:
        match = QUALNAME.match(self.spec)
        assert match, f"{self.id}: the specification cell must start with the `function` it cites: {self.spec!r}"
        return match.group(1)

    @property
    def lines(self) -> list[tuple[int, int]]:
        return [(int(a), int(b or a)) for a, b in LINES.findall(self.spec)]

    @property
    def tests(self) -> list[str]:
        return TEST_ID.findall(self.evidence)

    @property
    def refusals(self) -> list[str]:
        return REFUSAL.findall(self.evidence)

    @property
    def issues(self) -> set[int]:
        return {int(n) for n in ISSUE.findall(self.evidence)}

    def __str__(self) -> str:
        return self.id


def parse_ledger(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        if not re.match(r"^\| \d{3}-\d+ \|", line):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, f"a ledger row has five cells: {line!r}"
        rows.append(Row(*cells))
    return rows


@cache
def ledger() -> tuple[Row, ...]:
    return tuple(parse_ledger(LEDGER.read_text(encoding="utf-8")))


@cache
def collected_test_ids() -> frozenset[str]:
    """``path::test`` and ``path::TestClass::test`` of every test function in ``tests/`` (an AST scan)."""
    ids: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                ids.add(f"{prefix}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                walk(node.body, f"{prefix}::{node.name}")

    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        walk(ast.parse(path.read_text(encoding="utf-8")).body, path.relative_to(ROOT).as_posix())
    return frozenset(ids)


@cache
def kvpools_source() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for root in SOURCES for path in sorted(root.rglob("*.py")))


def spec_definitions(path: Path) -> dict[str, tuple[int, int]]:
    """Every function and class of a specification file, by qualified name, with its first and last line."""
    found: dict[str, tuple[int, int]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{node.name}"
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found[name] = (first, node.end_lineno or node.lineno)
                walk(node.body, f"{name}.")

    walk(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


def needs_a_row(definitions: dict[str, tuple[int, int]]) -> set[str]:
    """Every function, and every class that defines none (a result record); a class with methods is ledgered
    by its methods."""
    return {name for name in definitions if not any(other.startswith(f"{name}.") for other in definitions)} | {
        name for name in definitions if not name.split(".")[-1][:1].isupper()
    }


def reference_file(prefix: str) -> Path:
    found = sorted(REFERENCE.glob(FILES[prefix]))
    if len(found) != 1:
        skip_or_fail(
            f"the specification file {FILES[prefix]} is not in {REFERENCE}: the shared checkout (../shared) "
            f"is needed to check the ledger against it"
        )
    return found[0]


def rows_of(prefix: str) -> Iterator[Row]:
    return (row for row in ledger() if row.id.startswith(f"{prefix}-"))


# ---------------------------------------------------------------------------------------------------------- rows


def test_the_page_has_both_tables_and_unique_ids() -> None:
    ids = [row.id for row in ledger()]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    assert {i.split("-")[0] for i in ids} == set(FILES)


@pytest.mark.parametrize("row", ledger(), ids=str)
def test_every_row_is_tested_refused_not_applicable_or_an_open_issue(row: Row) -> None:
    assert row.status in STATUSES, f"{row.id}: status {row.status!r} is none of {STATUSES}"
    assert row.decides, f"{row.id}: say what the branch decides"
    if row.status == "tested":
        assert row.tests, f"{row.id}: a tested row cites the test that reproduces it"
    elif row.status == "refused":
        assert row.refusals and row.tests, f"{row.id}: a refused row quotes the refusal and cites its test"
    elif row.status == "not applicable":
        reason = TEST_ID.sub("", row.evidence)
        assert len(reason.split()) >= 8, f"{row.id}: a not-applicable row says why, in a sentence"
    else:
        assert row.issues, f"{row.id}: a NOT MODELLED row cites the open issue that covers it"
        assert row.issues <= OPEN_ISSUES, f"{row.id}: issue(s) {sorted(row.issues - OPEN_ISSUES)} are not open"


@pytest.mark.parametrize("row", [row for row in ledger() if row.tests], ids=str)
def test_cited_tests_exist(row: Row) -> None:
    missing = [node for node in row.tests if node not in collected_test_ids()]
    assert not missing, f"{row.id} cites test(s) that do not exist: {missing}"


@pytest.mark.parametrize("row", [row for row in ledger() if row.refusals], ids=str)
def test_quoted_refusals_are_kvpools_own_words(row: Row) -> None:
    missing = [text for text in row.refusals if text not in kvpools_source()]
    assert not missing, f"{row.id} quotes refusal text found nowhere in kvpools_core/ or plugins/: {missing}"


def test_the_counts_at_the_top_are_the_rows() -> None:
    text = LEDGER.read_text(encoding="utf-8")
    match = COUNTS.search(text)
    assert match, "the page states its counts: **Counts:** N rows: a tested, b refused by name, ..."
    assert tuple(int(n) for n in match.groups()) == counts(ledger())
    by_issue = Counter(n for row in ledger() if row.status == "NOT MODELLED" for n in row.issues)
    stated = text[match.end() :].split("\n", 1)[0]
    assert {int(n): int(k) for n, k in re.findall(r"#(\d+): (\d+)", stated)} == dict(by_issue), (
        "the NOT MODELLED rows citing each issue"
    )
    # each table's own line, in the page's order (002 first)
    per_table = re.findall(COUNTS.pattern.replace(r"\*\*Counts:\*\* ", "^"), text, re.MULTILINE)
    want = [counts(tuple(rows_of(prefix))) for prefix in FILES]
    assert [tuple(int(n) for n in line) for line in per_table] == want


def counts(rows: tuple[Row, ...]) -> tuple[int, ...]:
    statuses = Counter(row.status for row in rows)
    return (len(rows), *(statuses[status] for status in STATUSES))


def test_the_checker_reads_a_row_apart() -> None:
    """The parser on a hand-written row: its function, lines, tests, refusal and issues."""
    (row,) = parse_ledger(
        "| 000-999 | `A.b` L10-12, L20 | what | refused | refusal: `no such thing`; "
        "`tests/x/test_y.py::TestZ::test_w`, see #31 |"
    )
    assert (row.qualname, row.lines) == ("A.b", [(10, 12), (20, 20)])
    assert (row.tests, row.refusals, row.issues) == (["tests/x/test_y.py::TestZ::test_w"], ["no such thing"], {31})
    assert "tests/docs/test_specification_ledger.py::test_the_checker_reads_a_row_apart" in collected_test_ids()


def index_of_reads() -> dict[str, list[str]]:
    """The page's index of reads: each name of a line's first cell -> the row ids of its last cell."""
    text = LEDGER.read_text(encoding="utf-8")
    assert READS_HEADING in text, f"the page has a section {READS_HEADING!r}"
    index: dict[str, list[str]] = {}
    for line in text[text.index(READS_HEADING) :].splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for name in re.findall(r"`(\w+)`", cells[0]):
                index[name] = ROW_ID.findall(cells[-1])
    return index


def test_every_line_of_the_index_of_reads_cites_rows_that_exist() -> None:
    ids = {row.id for row in ledger()}
    for name, rows in index_of_reads().items():
        assert rows, f"{name}: cite the rows that ledger its branches"
        assert set(rows) <= ids, f"{name} cites rows that do not exist: {sorted(set(rows) - ids)}"


# ----------------------------------------------------------------------------------------- the specification


@pytest.mark.parametrize("prefix", sorted(FILES))
def test_every_function_of_the_specification_has_a_row(prefix: str) -> None:
    definitions = spec_definitions(reference_file(prefix))
    covered = {row.qualname for row in rows_of(prefix)}
    missing = sorted(needs_a_row(definitions) - covered)
    assert not missing, f"{FILES[prefix]}: no ledger row for {missing}"


@pytest.mark.parametrize("prefix", sorted(FILES))
def test_rows_cite_lines_inside_their_function(prefix: str) -> None:
    definitions = spec_definitions(reference_file(prefix))
    for row in rows_of(prefix):
        assert row.qualname in definitions, f"{row.id}: {FILES[prefix]} defines no {row.qualname}"
        first, last = definitions[row.qualname]
        assert row.lines, f"{row.id}: cite the lines (L12-34) of {row.qualname}"
        for start, end in row.lines:
            assert first <= start <= end <= last, (
                f"{row.id}: L{start}-{end} is outside {row.qualname} (lines {first}-{last} of {FILES[prefix]})"
            )


@pytest.mark.parametrize("prefix", sorted(FILES))
def test_every_option_and_environment_variable_read_is_indexed(prefix: str) -> None:
    text = reference_file(prefix).read_text(encoding="utf-8")
    read = {name for pattern in READS for name in re.findall(pattern, text)}
    missing = sorted(read - set(index_of_reads()))
    assert not missing, f"{FILES[prefix]} reads {missing}, which the page's index of reads does not list"
