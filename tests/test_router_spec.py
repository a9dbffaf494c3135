"""Each replica-cluster router is one typed spec (`routers/spec.py`): every list, table and help text is read from it."""

import inspect
from pathlib import Path

import pytest

from jaxroute.experiments import knobs
from jaxroute.routers import names, spec
from jaxroute.routers.spec import SPECS, RouterSpec
from tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_table_is_generated_from_the_specs():
    assert (ROOT / "docs" / "routers.md").read_text() == spec.docs_page(), \
        "docs/routers.md is stale: python -m jaxroute.routers.spec > docs/routers.md"
    for s in SPECS:
        assert f"| `{s.name}` | {s.summary} |" in spec.markdown_table()


def test_every_list_of_routers_is_read_from_the_specs():
    assert names.PREFIX_POLICIES == tuple(s.name for s in SPECS)
    assert names.PARTIAL_OK == tuple(s.name for s in SPECS if s.partial_ok)
    assert knobs.TUNABLE == {s.name: s.tunable for s in SPECS if s.tunable}


def test_the_settings_read_without_jax_are_the_modules_own():
    """--router-set is checked before JAX loads against `names.router_setting_names` (each module's make_params read
    from its source): the same names the modules take."""
    from jaxroute.routers import prefix

    assert names.router_setting_names() == set().union(*(set(m.settings) for m in prefix.MODULES.values()))


def test_each_spec_resolves_and_its_settings_exist():
    from jaxroute.routers import prefix
    from jaxroute.routers.names import SCORERS

    router_level = set(prefix.RouterParams.__dataclass_fields__) - {"own"}  # every router's own settings

    for s in SPECS:
        preset = prefix.PRESETS[s.name]
        assert preset.spec is s and callable(preset.rule)
        module = prefix.MODULES[s.module] if s.module else None
        assert preset.module is module
        n_args = len(inspect.signature(preset.rule).parameters)
        assert n_args == (5 if s.module else 4), f"{s.name}: {s.rule} takes {n_args} arguments"
        settings = router_level | set(module.settings if module else ())
        assert set(s.defaults) <= settings, (s.name, set(s.defaults) - settings)
        for k in s.tunable:
            assert (k.scorer in SCORERS) if k.scorer else (k.name in settings), (s.name, k.name)
            assert k.lo < k.hi


def test_a_spec_is_typed_and_refuses_what_it_cannot_be():
    with pytest.raises(TypeError, match="partial"):
        RouterSpec("x", "rule", "presets.rr", "source", partial=True)  # a misspelled field
    with pytest.raises(ValueError, match="rule must be 'module.function'"):
        RouterSpec("x", "rule", "rr", "source")
    s = SPECS[0]
    with pytest.raises(TypeError):
        s.defaults["theta"] = 0.1  # read-only: a spec is one fact


def test_cluster_help_lists_every_router_with_its_rule(capsys):
    assert cli(["cluster", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for s in SPECS:
        assert f"{s.name} {' '.join(s.summary.split())}" in out, s.name
