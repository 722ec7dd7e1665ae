"""The speculative decoding SGLang 0.5.23 runs on DeepSeek-V4 (issue 32).

``apply_deepseek_v4_defaults`` (``arg_groups/deepseek_v4_hook.py`` lines 137-159), which
``handle_model_specific_adjustments`` runs for ``DeepseekV4ForCausalLM`` before the speculative hook resolves
anything:

* ``--max-running-requests`` unset becomes 256 (so the speculative hooks' own default of 48, which they declare
  only while the option is still unset, never applies to DeepSeek-V4: the ``dsv4`` plugin's ``engine_defaults``
  answers 256 before the ``speculative`` plugin's ``trylast`` 48);
* the algorithm must be ``EAGLE`` or ``DSPARK`` (asserted on the spelling as given, before ``NEXTN`` is aliased
  to ``EAGLE``: ``NEXTN``, ``EAGLE3``, ``STANDALONE``, ``NGRAM`` and ``DFLASH`` are refused);
* ``EAGLE`` needs ``--speculative-eagle-topk`` 1, asserted before ``_auto_choose_speculative_params`` fills an
  unset top-k in, so an unset one is refused too.

The pools read the *largest* draft-token count, ``max_speculative_num_draft_tokens()`` (``runtime_context.py``
L1982-2000: with ``--speculative-adaptive``, ``max(candidate_steps) + 1``, 8 with SGLang's default tiers; else
``speculative_num_draft_tokens``), in two places (issue 33):

* the online c128 state's MTP banks (``CompressStatePool``: ``(size + 2) x (1 + banks)`` rows,
  ``online_mtp_max_draft_tokens``; the configurator's ``_get_c128_state_fixed_bytes``, ``pool_configurator.py``
  L1505-1525): :func:`online_mtp_draft_tokens`;
* ``DSV4PoolConfigurator._assert_ring_serves_draft_tokens`` (``pool_configurator.py`` L1194-1198, L1291-1306): per
  ratio 4 / 128 with layers on the stage (c128 skipped under online compression), the draft count must fit the
  ring's write pad ``get_compress_state_write_pad`` = ``ring - window + 2`` (``window`` 8 for c4, 128 for c128):
  10 for the speculative c4 ring of 16, 130 for the c128 ring of 256 (:func:`ring_problems`).

The compressor rings themselves (16 / 256, ``resolve_compress_state_ring_size``) and the unified SWA ring follow the
current ``speculative_num_draft_tokens``, which adaptive speculation resolves to ``steps + 1``.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import ModelSpec, Serving

SGLANG_ARCHITECTURE = "DeepseekV4ForCausalLM"
DSV4_SPECULATIVE_ALGORITHMS = ("EAGLE", "DSPARK")
"""The algorithms ``apply_deepseek_v4_defaults`` lets through (deepseek_v4_hook.py lines 148-154)."""
ALGORITHMS_MESSAGE = f"Only EAGLE and DSPARK speculative algorithms are supported for {SGLANG_ARCHITECTURE}"
TOPK_MESSAGE = f"Only EAGLE speculative algorithm with topk == 1 is supported for {SGLANG_ARCHITECTURE}"


def speculative_problems(serving: Serving) -> list[str]:
    """What ``apply_deepseek_v4_defaults`` asserts about speculative decoding, with SGLang's own messages."""
    algorithm = serving.speculative_algorithm
    o = option
    if algorithm is None:
        return []
    if algorithm not in DSV4_SPECULATIVE_ALGORITHMS:
        return [
            f"{o('speculative_algorithm')} {algorithm}: SGLang 0.5.23 asserts '{ALGORITHMS_MESSAGE}' "
            "(apply_deepseek_v4_defaults, arg_groups/deepseek_v4_hook.py). Use EAGLE with "
            f"{o('speculative_eagle_topk')} 1 and {o('speculative_draft_num_layers')} N (the checkpoint's MTP "
            "layers), or DSPARK."
        ]
    if algorithm == "EAGLE" and serving.speculative_eagle_topk != 1:
        seen = "unset" if serving.speculative_eagle_topk is None else str(serving.speculative_eagle_topk)
        return [
            f"{o('speculative_eagle_topk')} {seen} with {o('speculative_algorithm')} EAGLE: SGLang 0.5.23 asserts "
            f"'{TOPK_MESSAGE}' (apply_deepseek_v4_defaults, before it would choose a top-k itself). Pass "
            f"{o('speculative_eagle_topk')} 1."
        ]
    return []


RING_MESSAGE = (
    "speculative_num_draft_tokens={drafts} exceeds what the c{ratio} compress state ring can keep resident "
    "(ring_size={ring} serves at most {pad} draft tokens). Lower the draft count, or grow the ring in "
    "get_compress_state_ring_size()."
)


def ring_size(ratio: int, serving: Serving) -> int:
    """``get_compress_state_ring_size``: 8 / 128 (16 / 256 speculative); online c128 keeps 1."""
    if ratio == 128 and serving.enable_online_compress:
        return 1
    if serving.speculative:
        return 16 if ratio == 4 else 256
    return 8 if ratio == 4 else 128


def online_mtp_draft_tokens(serving: Serving) -> int:
    """``max_speculative_num_draft_tokens() or 0`` (0 without speculative decoding): online c128's MTP banks."""
    return (serving.max_speculative_num_draft_tokens or 0) if serving.speculative else 0


def ring_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``_assert_ring_serves_draft_tokens(max_speculative_num_draft_tokens())``, in SGLang's words."""
    if not serving.speculative:
        return []
    drafts = serving.max_speculative_num_draft_tokens or 0
    start, end = rank_layer_range(model, serving)
    ratios = {int(layer.params.get("compress_ratio", 0)) for layer in model.layers[start:end]}
    o = option
    problems = []
    for ratio in (4, 128):
        if ratio not in ratios or (ratio == 128 and serving.enable_online_compress):
            continue
        ring = ring_size(ratio, serving)
        window = ratio * (2 if ratio == 4 else 1)
        pad = ring - window + 2 if ring > window else 0
        if drafts > pad:
            which = (
                f"{o('speculative_adaptive')}'s largest draft count (max candidate_steps + 1)"
                if serving.adaptive_speculation
                else o("speculative_num_draft_tokens")
            )
            problems.append(
                f"{which} {drafts}: SGLang's DSV4PoolConfigurator asserts "
                f"'{RING_MESSAGE.format(drafts=drafts, ratio=ratio, ring=ring, pad=pad)}' "
                f"(_assert_ring_serves_draft_tokens). Use at most {pad} draft tokens."
            )
    return problems
