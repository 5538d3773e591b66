"""studies.minimum.new_searches on the documentation's tiny problem: each search's run is read back from its result
file with its phases, the trust-region search is held to the lbfgs search's gradient equivalents, a point is the
lbfgs search's minimum only when E* and the head norms agree; the which-route table goes into a page between its
markers; and docs/experiments.md holds the table the shipped record renders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.minimum.new_searches import MARKERS, PAGE, RECORD, main, same_minimum, table

TINY = Path(__file__).resolve().parents[2] / "data" / "configs" / "tiny.toml"


def test_runs_record_and_table(tmp_path):
    assert main(["run", "--start", "2", "--config", str(TINY), "--out", str(tmp_path), "--threads", "1"]) == 0
    start = json.loads((tmp_path / "start-2" / "new_searches.json").read_text())
    runs = start["runs"]
    assert list(runs) == ["lbfgs", "float32", "trust-region"] and start["flow"]["t"] == 2.0
    base = runs["lbfgs"]
    assert base["certified"] and base["gradients"] > 0 and base["cpu"] > 0 and base["process_wall"] > 0
    phases = base["phases"]
    # + the certification's two: its spectrum's start vector and the gradient its drift about the minimum starts from
    assert phases["first_order_gradients"] + phases["second_order_gradients"] == base["gradients"] - 2
    assert phases["second_order_products"] == base["products"]
    assert runs["float32"]["phases"]["float32_gradients"] > 0
    region = runs["trust-region"]
    assert region["command"].endswith(f"--max-cost {base['search_equivalents']!r}")
    assert region["search_equivalents"] <= base["search_equivalents"] + 300 * 2.5 + 1  # one subproblem may overrun
    assert region["same_minimum_as_lbfgs"] == same_minimum(region, base)
    # same_minimum: E* and the sorted head norms, both certified
    assert same_minimum(base, base)
    assert not same_minimum(base, base | {"energy": base["energy"] + 1e-9})
    assert not same_minimum(base, base | {"head_norms": [x * (1 + 1e-5) for x in base["head_norms"]]})
    assert not same_minimum(base, base | {"certified": False})

    record = tmp_path / "record.json"
    assert main(["record", str(tmp_path), "--out", str(record)]) == 0
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{MARKERS[0]}\n| old |\n{MARKERS[1]}\noutro\n")
    assert main(["table", "--record", str(record), "--write", str(page)]) == 0
    text = page.read_text()
    rows = text.split(MARKERS[0])[1].split(MARKERS[1])[0].strip().splitlines()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "| old |" not in text
    assert [row.split("|")[1].strip() for row in rows[2:]] == ["lbfgs", "float32", "trust-region"]


@pytest.mark.skipif(not RECORD.exists(), reason="no record shipped yet")
def test_the_page_holds_the_table_the_record_renders():
    text = PAGE.read_text(encoding="utf-8")
    inside = text.split(MARKERS[0])[1].split(MARKERS[1])[0].strip()
    assert inside == table(json.loads(RECORD.read_text())), (
        "the which-route table is stale: python -m studies.minimum.new_searches table --write docs/experiments.md")
