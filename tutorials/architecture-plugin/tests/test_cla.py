"""The CLA plugin's own tests, written with the kit's fixtures (``kvpools_registry``) and helpers.

Every figure is worked out by hand from the config, so a change in the
plugin or in the parts library that moves a byte fails here, with the
arithmetic beside it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import kvpools_cla
import pytest
from click.testing import CliRunner

from kvpools_core import ConfigError, Plan, Serving, UnsupportedCombinationError, is_public_module, plan
from kvpools_core.cli import main
from kvpools_core.testing.registries import plan_and_build

ROOT = Path(__file__).parents[1]
CLA_1B = ROOT / "kvpools_cla" / "presets" / "cla-1b.json"
CLA_3B = ROOT / "configs" / "cla-3b-factor3.json"
GiB = 1 << 30


# --8<-- [start:fixtures]
@pytest.fixture
def registry(kvpools_registry):
    """The CLA plugin and the cpu platform alone: no other installed plugin can claim, size or build."""
    return kvpools_registry(["cla"])


def config(path: Path = CLA_1B, **changes: object) -> dict[str, object]:
    return {**json.loads(path.read_text()), **changes}


def cell(registry, serving: Serving | None = None, path: Path = CLA_1B):
    return plan(str(path), serving or Serving(platform="cpu"), memory=8 * GiB, registry=registry).cell


# --8<-- [end:fixtures]


# -- bytes per token, by hand ------------------------------------------------------------------


# --8<-- [start:bytes]
def test_cla_1b_stores_the_kv_of_every_second_layer(registry) -> None:
    """16 layers in groups of 2: 8 layers store K/V.

    8 KV layers x 8 KV heads x 64 (head_dim) x 2 (K and V) x 2 B (bf16) = 16,384 B per token,
    half of the 32,768 B the same Llama-shaped model without CLA stores.
    """
    result = cell(registry)
    assert result.bytes_per_token == 8 * 8 * 64 * 2 * 2 == 16_384
    assert {part.name: part.bytes_per_token for part in result.parts} == {"k": 8_192, "v": 8_192}
    assert result.num_layers == 8  # the layers the token cost covers: a draft layer costs one of them


# --8<-- [end:bytes]


def test_a_share_factor_that_does_not_divide_the_layers_rounds_the_kv_layers_up(registry) -> None:
    """28 layers in groups of 3: layers 0, 3, ..., 27 store K/V, ceil(28 / 3) = 10 of them (the last group: 1 layer).

    head_dim = hidden_size / num_attention_heads = 3072 / 24 = 128;
    10 x 8 KV heads x 128 x 2 (K and V) x 2 B = 40,960 B per token.
    """
    model = plan(str(CLA_3B), Serving(platform="cpu"), memory=8 * GiB, registry=registry).model
    assert [layer.index for layer in model.layers if layer.kind == kvpools_cla.KV_LAYER] == list(range(0, 28, 3))
    assert model.layers[5].params == {"kv_layer": 3}
    assert cell(registry, path=CLA_3B).bytes_per_token == 10 * 8 * 128 * 2 * 2 == 40_960


def test_fp8_kv_halves_the_bytes(registry, monkeypatch) -> None:
    """fp8_e4m3 stores 1 B per element: 8 x 8 x 64 x 2 x 1 B = 8,192 B per token.

    On the cpu platform fp8 needs Intel AMX on the serving host: ``KVPOOLS_CPU_AMX=1`` says it has it, so the
    test does not depend on the machine running it."""
    monkeypatch.setenv("KVPOOLS_CPU_AMX", "1")
    assert cell(registry, Serving(platform="cpu", kv_cache_dtype="fp8_e4m3")).bytes_per_token == 8_192


def test_tp_2_splits_the_kv_heads(registry) -> None:
    """TP 2: each rank stores 8 / 2 = 4 KV heads: 8 x 4 x 64 x 2 x 2 B = 8,192 B per token per rank."""
    assert cell(registry, Serving(platform="cpu", tp_size=2)).bytes_per_token == 8_192


# --8<-- [start:tp]
def test_tp_16_replicates_the_8_kv_heads(registry) -> None:
    """TP 16 > 8 KV heads: every rank keeps one (replicated) KV head: 8 x 1 x 64 x 2 x 2 B = 2,048 B per rank."""
    assert cell(registry, Serving(platform="cpu", tp_size=16)).bytes_per_token == 2_048


# --8<-- [end:tp]


def test_pipeline_stages_at_group_boundaries_split_the_kv_layers(registry) -> None:
    """PP 2: stages of 8 layers each hold 4 KV layers: 4 x 8 x 64 x 2 x 2 B = 8,192 B per token."""
    for rank in (0, 1):
        assert cell(registry, Serving(platform="cpu", pp_size=2, pp_rank=rank)).bytes_per_token == 8_192


def test_a_pipeline_stage_starting_inside_a_group_is_refused_naming_the_option(registry) -> None:
    """PP 3 splits 16 layers 5/5/6: stage 1 would start at layer 5, which reads layer 4's cache on stage 0."""
    with pytest.raises(UnsupportedCombinationError, match=r"pp_size 3 starts pipeline stages at layers \[5\]"):
        cell(registry, Serving(platform="cpu", pp_size=3))
    assert cell(registry, Serving(platform="cpu", pp_size=3, pp_layer_partition=(6, 6, 4))).bytes_per_token == 6_144


# -- building: the core builds what the parts describe ------------------------------------------


# --8<-- [start:build]
def test_the_core_builds_exactly_the_planned_bytes_on_meta(registry) -> None:
    planned, pools = plan_and_build(str(CLA_1B), Serving(platform="cpu"), memory=8 * GiB, registry=registry)
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in planned.pools}
    assert planned.pool("kv").bytes_per_slot == 16_384
    assert pools.provenance["build_pool"] == ("core",)  # the core's BytePool: this plugin has no build_pool


# --8<-- [end:build]


def test_speculative_draft_layers_are_charged_as_one_kv_layer_each(kvpools_registry) -> None:
    """EAGLE with a 1-layer draft: one KV layer's 8 x 64 x 2 x 2 B = 2,048 B per token, in pool draft_kv.

    The built-in ``speculative`` plugin charges the draft (a wrapper of ``estimate_cell_size``), from the
    cell's cost per layer: ``CellSize.num_layers`` counts the KV layers, not the 16 decoder layers.
    """
    registry = kvpools_registry(["cla", "speculative"])
    serving = Serving(
        platform="cpu",
        speculative_algorithm="EAGLE",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        speculative_draft_num_layers=1,
    )
    planned, pools = plan_and_build(str(CLA_1B), serving, memory=8 * GiB, registry=registry)
    assert planned.pool("draft_kv").bytes_per_slot == 2_048
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in planned.pools}


# -- parsing: claims, declines, config errors ----------------------------------------------------


def test_a_plain_llama_config_is_declined() -> None:
    llama = config(architectures=["LlamaForCausalLM"], model_type="llama")
    del llama["cla_share_factor"]
    assert kvpools_cla.parse_model_config(llama, "llama.json") is None


# --8<-- [start:config-errors]
@pytest.mark.parametrize(
    ("factor", "problem"),
    [
        (0, "must be an integer >= 1, got 0"),
        (-2, "must be an integer >= 1, got -2"),
        ("2", "must be an integer >= 1, got '2'"),
        (2.0, "must be an integer >= 1, got 2.0"),
        (17, "is 17, more than the 16 layers"),
        (None, "is missing"),
    ],
)
def test_a_bad_share_factor_is_a_config_error_naming_the_field(factor: object, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"cla-1b.json: field 'cla_share_factor' ") as raised:
        kvpools_cla.parse_model_config(config(cla_share_factor=factor), "cla-1b.json")
    assert problem in str(raised.value)


# --8<-- [end:config-errors]


def test_a_share_factor_of_one_is_plain_attention(registry, tmp_path: Path) -> None:
    """Factor 1: every layer stores its own K/V, 16 x 8 x 64 x 2 x 2 B = 32,768 B (the model without CLA)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config(cla_share_factor=1)))
    assert cell(registry, path=path).bytes_per_token == 32_768


# -- the command line, as a user runs it ---------------------------------------------------------


# --8<-- [start:cli]
def test_kvpools_plan_on_the_config_file() -> None:
    result = CliRunner().invoke(main, ["plan", str(CLA_1B), "--memory", "8GiB", "--platform", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    planned = Plan.from_json(result.output)
    assert planned.model.architecture == "cla"
    assert planned.cell.bytes_per_token == 16_384
    assert planned.planned_bytes <= 8 * GiB
    assert planned.provenance["parse_model_config"] == ("cla",)


# --8<-- [end:cli]


def test_kvpools_build_on_meta_matches_the_plan() -> None:
    result = CliRunner().invoke(main, ["build", "cla-1b", "--memory", "8GiB", "--device", "meta"])
    assert result.exit_code == 0, result.output
    assert "total" in result.output and "mismatch" not in result.output
    assert "build_pool: core" in result.output


def test_the_preset_ships_with_the_package() -> None:
    """Installed from a wheel too (``pip install tutorials/architecture-plugin``): package data is declared."""
    shipped = kvpools_cla.presets()
    assert list(shipped) == ["cla-1b"]
    assert json.loads(Path(shipped["cla-1b"]).read_text()) == config()


def test_the_plugin_imports_only_public_core_modules() -> None:
    """What docs/plugins.md promises stays stable: a plugin that imports internals breaks on any release."""
    tree = ast.parse(Path(kvpools_cla.__file__).read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    core = [name for name in imported if name.startswith("kvpools_core")]
    assert core and all(is_public_module(name) for name in core), core


# -- the weights: --gpu, fit and GPU sweeps with the plugin's own answer -------------------------

CLA_1B_PARAMETERS = 8 * 60_821_504 + 8 * 58_724_352 + 128_256 * 2_048 + 2_048
"""cla-1b's parameters, by hand from its config (hidden 2048, 32 heads and 8 KV heads of 64, intermediate 8192,
16 layers in groups of 2, vocabulary 128256, tied head):

* a KV layer: q 2048 x 2048 + k and v 512 x 2048 each + o 2048 x 2048 = 10,485,760, the SwiGLU MLP
  3 x 8192 x 2048 = 50,331,648 and two norms of 2048: 60,821,504;
* a sharing layer: q and o only, 8,388,608 + 50,331,648 + 4,096 = 58,724,352;
* the embedding 128256 x 2048 (a multiple of 64 rows: no padding), the final norm 2048; the head is the
  embedding (tied): 1,219,037,184 in all, 2 B each in bfloat16."""

CLA_1B_TP2_RANK_PARAMETERS = 8 * 30_412_800 + 8 * 29_364_224 + 64_128 * 2_048 + 2_048
"""One rank of TP 2: q and o split by heads (1024 x 2048 and 2048 x 1024), k and v 4 KV heads (256 x 2048 each),
the MLP's intermediate halved (3 x 4096 x 2048), norms whole: 30,412,800 a KV layer and 29,364,224 a sharing one;
the embedding's 128256 rows split in two (64128)."""


# --8<-- [start:weights]
def test_a_gpu_plan_subtracts_the_weights_the_plugin_estimates() -> None:
    """``kvpools plan cla-1b --gpu h100``: the budget takes 2 B x 1,219,037,184 parameters = 2,438,074,368 B of
    weights (TP 1), answered by this plugin's ``estimate_weights``."""
    result = CliRunner().invoke(main, ["plan", "cla-1b", "--gpu", "h100", "--json"])
    assert result.exit_code == 0, result.output
    planned = Plan.from_json(result.output)
    assert planned.budget.weights_bytes == 2 * CLA_1B_PARAMETERS == 2_438_074_368
    tp2 = CliRunner().invoke(main, ["plan", "cla-1b", "--gpu", "h100", "--tp-size", "2", "--json"])
    assert tp2.exit_code == 0, tp2.output
    assert Plan.from_json(tp2.output).budget.weights_bytes == 2 * CLA_1B_TP2_RANK_PARAMETERS == 1_219_104_768


# --8<-- [end:weights]


def test_the_estimate_counts_every_parameter(registry) -> None:
    from kvpools_core import estimate_weights

    estimate = estimate_weights("cla-1b", registry=registry)
    assert estimate.parameters == CLA_1B_PARAMETERS == 1_219_037_184
    assert estimate.bytes_total == estimate.bytes_per_rank == 2 * CLA_1B_PARAMETERS
    assert estimate.parameters_by_family["attention"] == 8 * 10_485_760 + 8 * 8_388_608


def test_without_the_plugins_weights_a_gpu_plan_asks_for_them(kvpools_registry) -> None:
    """The same plugin without its ``estimate_weights``: no other plugin claims a CLA config, so a GPU plan
    cannot subtract weights and asks for ``--weights-memory`` (the weights above are this plugin's answer)."""
    hooks = {
        name: getattr(kvpools_cla, name) for name in ("presets", "parse_model_config", "estimate_cell_size", "validate")
    }
    without = type("ClaWithoutWeights", (), {name: staticmethod(hook) for name, hook in hooks.items()})
    registry = kvpools_registry(["mha", "cuda"], objects={"cla-no-weights": without})
    with pytest.raises(ConfigError, match=r"model_type' is 'cla'. No installed architecture plugin estimates"):
        plan("cla-1b", Serving(), gpu="h100", registry=registry)
    given = plan("cla-1b", Serving(), gpu="h100", weights_memory="2GiB", registry=registry)
    assert given.budget.weights_bytes == 2 * GiB


def test_kvpools_fit_plans_every_configuration_with_the_plugins_weights() -> None:
    """``kvpools fit cla-1b``: every configuration's GPU budget subtracts this plugin's estimate for its TP."""
    from kvpools_core import estimate_weights
    from kvpools_core.planning.fit import fit

    result = fit("cla-1b", 64, 131072, gpu="h100")
    assert result.fits
    for found in result.fits:
        serving = found.plan.serving
        expected = estimate_weights("cla-1b", serving).bytes_per_rank
        assert found.plan.budget.weights_bytes == expected
        if (serving.tp_size, serving.pp_size) == (2, 1):
            assert expected == 2 * CLA_1B_TP2_RANK_PARAMETERS
    assert any(found.plan.serving.tp_size == 2 for found in result.fits)
    cli = CliRunner().invoke(main, ["fit", "cla-1b", "--requests", "64", "--context", "128k", "--gpu", "h100"])
    assert cli.exit_code == 0, cli.output
    assert "cla-1b" in cli.output


def test_a_sweep_over_gpus_uses_the_plugins_weights() -> None:
    """``kvpools sweep --gpu h100,h200``: each GPU budget is the whole GPU's plan, weights subtracted."""
    from kvpools_core.planning.sweep import SweepGrid, run_sweep

    rows = run_sweep(SweepGrid(models=("cla-1b",), budgets=({"gpu": "h100"}, {"gpu": "h200"}), contexts=(8192,)))
    assert [row.error for row in rows] == [None, None]
    for row, gpu in zip(rows, ("h100", "h200"), strict=True):
        planned = plan("cla-1b", Serving(), gpu=gpu)
        assert planned.budget.weights_bytes == 2 * CLA_1B_PARAMETERS
        assert row.budget_bytes == planned.budget.budget_bytes
        assert row.tokens == {"full": planned.sizing.max_total_num_tokens}
    cli = CliRunner().invoke(main, ["sweep", "--model", "cla-1b", "--gpu", "h100,h200", "--context", "8192"])
    assert cli.exit_code == 0, cli.output
