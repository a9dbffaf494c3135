"""The experiment API: common seeds, paired differences, capacity retries, conservation; import layering."""

import ast
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroute import sim
from jaxroute.errors import JaxrouteError, LostRequests
from jaxroute.experiments import (
    Comparison,
    Row,
    conservation_failures,
    paired_difference,
    run_with_retry,
)
from jaxroute.metrics import summarize

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class NoiseModel(sim.Model):
    """x = seed noise * scale + shift; `overflow` when the noise exceeds `cap`."""

    cap: float = 10.0

    def init(self, key, workload, params):
        return jax.random.normal(key, ())

    def step(self, state, workload, params):
        return state

    def metrics(self, state, workload, params):
        return {"x": state * params["scale"] + params["shift"], "overflow": jnp.abs(state) > self.cap,
                "conservation_error": params["lost"]}

    def num_steps(self, workload=None):
        return 1

    def is_done(self, state):
        return jnp.bool_(True)


def _params(shift=0.0, scale=1.0, lost=0):
    return {"shift": jnp.float32(shift), "scale": jnp.float32(scale), "lost": jnp.int32(lost)}


def _compare(rows, seeds=6, cap=10.0):
    return Comparison(NoiseModel(cap), rows, seeds, ["x"], seed=3).run()


def test_rows_share_seeds_and_records_carry_info():
    res = _compare([Row("base", _params(), {"shift": 0}), ("plus1", _params(1.0)), ("double", _params(scale=2.0))])
    assert res.labels == ["base", "plus1", "double"]
    x = res.metrics["x"]
    np.testing.assert_allclose(x[1] - x[0], 1.0, rtol=1e-6)  # common random numbers: same noise per seed
    np.testing.assert_allclose(x[2], 2 * x[0], rtol=1e-6)
    rec = res.record("base")
    assert rec.policy == "base" and rec.params == {"shift": 0} and not rec.overflow
    assert rec.metrics["x"] == summarize(x[0])


def test_paired_difference_is_exact_when_rows_differ_by_a_constant():
    res = _compare([("base", _params(1.0)), ("plus1", _params(2.0))])
    d = paired_difference(res, "x", "plus1", "base")
    assert d.mean == pytest.approx(1.0, rel=1e-6) and d.half_width == pytest.approx(0.0, abs=1e-5)
    # the unpaired CIs are wide; the paired one is not
    assert res.record("base").metrics["x"].half_width > 0.1
    rel = paired_difference(res, "x", 1, 0, relative=True)
    x = np.asarray(res.metrics["x"], np.float64)
    per_seed = 100 * (x[1] / x[0] - 1)
    assert rel.mean == pytest.approx(float(np.mean(per_seed)), rel=1e-9)
    first3 = paired_difference(res, "x", "plus1", "base", seeds=slice(0, 3))
    assert len(first3.per_seed) == 3
    assert paired_difference(res.grid, "x", 1, 0).mean == pytest.approx(d.mean)


def test_paired_difference_errors():
    res = _compare([("a", _params()), ("b", _params(1.0))], seeds=2)
    with pytest.raises(JaxrouteError, match="no row 'c'"):
        paired_difference(res, "x", "c", "a")
    with pytest.raises(JaxrouteError, match="label"):
        paired_difference(res.grid, "x", "a", "b")


def test_a_lost_request_is_refused_even_where_a_capacity_overflowed():
    with pytest.raises(LostRequests, match="NoiseModel lost or invented requests .* in rows leaky:") as e:
        _compare([("ok", _params()), ("leaky", _params(lost=2))], seeds=2)
    assert e.value.rows == ["leaky"] and e.value.worst == 2
    # an overflowed seed is checked like any other (a full capacity's drops are counted by the model, not excused)
    with pytest.raises(LostRequests, match="in rows leaky:"):
        _compare([("ok", _params()), ("leaky", _params(lost=2))], seeds=2, cap=0.0)
    grid = sim.GridResult({"conservation_error": np.array([[0, 0], [0, 3]])}, 2, 2)
    assert grid.lost_rows() == [1] and conservation_failures(grid) == ["1"]
    assert _compare([("ok", _params())], seeds=2, cap=0.0).grid.overflow.all()  # overflow alone: no error


def test_run_with_retry_doubles_only_the_capacity_that_overflowed(capsys):
    calls = []

    def run(caps):  # queue needs 10, ring needs 3
        calls.append(dict(caps))
        return SimpleNamespace(metrics={"queue_full": np.array([caps["queue"] < 10]),
                                        "ring_full": np.array([[False, caps["ring"] < 3]])})

    result, caps = run_with_retry(run, {"queue": 2, "ring": 4}, {"queue": "queue_full", "ring": "ring_full"})
    assert caps == {"queue": 16, "ring": 4} and len(calls) == 4
    assert not result.metrics["queue_full"].any()
    assert "capacity queue = 2 overflowed" in capsys.readouterr().err


def test_run_with_retry_gives_up_loudly(capsys):
    run = lambda caps: SimpleNamespace(metrics={"full": np.array([True])})
    result, caps = run_with_retry(run, {"k": 1}, {"k": "full"}, max_tries=3)
    assert caps == {"k": 4} and result.metrics["full"].all()
    assert "still overflowed after 3 tries" in capsys.readouterr().err
    with pytest.raises(JaxrouteError, match="still overflowed"):
        run_with_retry(run, {"k": 1}, {"k": "full"}, max_tries=2, strict=True)
    with pytest.raises(JaxrouteError, match="no overflow metric 'missing'"):
        run_with_retry(run, {"k": 1}, {"k": "missing"})


def test_run_with_retry_on_a_grid():
    rows = [("a", _params()), ("b", _params(1.0))]
    res, caps = run_with_retry(lambda c: Comparison(NoiseModel(c["cap"] / 100), rows, 8, ["x"]).run(),
                               {"cap": 50}, {"cap": "overflow"}, max_tries=6)
    assert not res.grid.overflow.any() and caps["cap"] > 50 and math.isfinite(res.records[0].metrics["x"].mean)


# --------------------------------------------------------------------------- layering


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_scripts_do_not_import_commands():
    for path in sorted((ROOT / "scripts").glob("*.py")):
        bad = [n for n in _imports(path) if n == "jaxroute.commands" or n.startswith("jaxroute.commands.")]
        assert not bad, f"{path.name} imports {bad}: move the code into a library module (jaxroute.experiments)"


def test_commands_do_not_import_each_other():
    for path in sorted((ROOT / "jaxroute" / "commands").glob("*.py")):
        bad = [n for n in _imports(path) if n.startswith("jaxroute.commands.")
               and not n.startswith("jaxroute.commands._common")]
        assert not bad, f"commands/{path.name} imports {bad}: shared code belongs in a library module"


def test_only_the_entry_point_imports_the_cli():
    """The CLI sits on top: the library (reproductions, experiments, bench) sets JAX up through `runtime`."""
    for path in sorted((ROOT / "jaxroute").rglob("*.py")):
        if path.name in ("cli.py", "__main__.py"):
            continue
        bad = [n for n in _imports(path) if n == "jaxroute.cli" or n.startswith("jaxroute.cli.")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: JAX's set-up is jaxroute.runtime's"


def test_the_code_cites_the_repositorys_own_architecture_doc():
    """DESIGN.md lives outside the repository: the code cites docs/architecture.md, which a clone has."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for section in ("## The model contract", "## Three kinds of configuration", "## The event loop",
                    "## Capacities, overflow and conservation", "## Routers", "## Results convention"):
        assert section in doc, section
    cites = [p for p in (ROOT / "jaxroute").rglob("*.py") if "DESIGN.md" in p.read_text()]
    assert not cites, [str(p.relative_to(ROOT)) for p in cites]
