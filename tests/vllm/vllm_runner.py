"""Run vLLM 0.33's own KV-cache planning on cases sent as JSON lines; run by the peers venv's Python.

Started by ``tests/vllm/peer.py`` as ``python vllm_runner.py SHARED_BENCH_DIR``; reads one JSON case per stdin
line and writes one JSON answer per stdout line.  The planning functions, spec classes, spec registry and
layout enum are vLLM's installed code, imported with ``peer_imports`` (``../shared/bench``) as the benchmarks
do; the stand-ins are only for what planning never reaches on this path (listed in ``_install``) and for
``VllmConfig`` (a namespace holding exactly the fields the planner reads).  A case with ``"op": "hybrid_specs"``
asks instead for a Mamba hybrid's layer specs from vLLM's own state calculators, config hooks and block alignment
(:class:`_Hybrid`, whose docstring lists its stand-ins; Kimi-Linear's from its layers' own methods,
``_Hybrid.kimi_linear_specs``); one with ``"op": "dsv4_specs"`` for DeepSeek-V4's layer
specs, block size and KV-cache layout from its layers' own ``get_kv_cache_spec`` methods, backends and vLLM's layout
resolution (:class:`_DeepseekV4`).  Nothing of vLLM is copied here.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import math
import sys
import traceback
from types import SimpleNamespace

DTYPE_NAMES = {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32"}
DEFAULT_BUILDER = "vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"


class _Platform:
    """``current_platform`` for the planner: the default builder, no custom specs (the base ``Platform``'s)."""

    def get_kv_cache_config_builder_cls(self, vllm_config):
        return DEFAULT_BUILDER

    def register_custom_kv_cache_specs(self, vllm_config):
        return None

    def is_pin_memory_available(self):  # read at import by ``vllm.utils.torch_utils``; no device here
        return False


def _install(bench_dir: str):
    sys.path.insert(0, bench_dir)
    import peer_imports as p

    p.install()
    for package in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.distributed"):
        p._BARE.add(package)  # heavy __init__s (torch patching, NCCL)
    p._STUB.add("vllm.distributed.kv_events", MEDIUM_GPU="GPU", MEDIUM_CPU="CPU")  # KV events off
    p._STUB.add("vllm.platforms", current_platform=_Platform())
    # ``logger.info_once`` asks whether this is the first local rank (one process here: it is).
    p._STUB.add("vllm.distributed.parallel_state", is_local_first_rank=lambda: True)
    # The attention backends' module (quantization, transformers) is read only for the ``MultipleOf`` class of
    # ``block_stride_alignment``: the installed class definition, compiled alone.
    p._STUB.add("vllm.v1.attention.backend", MultipleOf=_multiple_of_class(p._installed_dir("vllm")))
    # pydantic config tree (replaced by the namespace below), request/multimodal/metrics types, HiSparse
    # runtime (HiSparse off), and third-party modules imported by utilities planning does not call.
    for name in (
        "vllm.config",
        "vllm.multimodal",
        "vllm.v1.request",
        "vllm.v1.core.kv_cache_metrics",
        "vllm.v1.hisparse.runtime",
        "psutil",
        "regex",
        "uvloop",
        "cpuinfo",
        "requests",
        "zmq",
        "urllib3",
    ):
        p._STUB.add(name)
    # torch version probes read ``packaging``, absent from the --no-deps install; torch 2.13 passes them all.
    p._STUB.add(
        "vllm.utils.torch_version",
        is_torch_equal_or_newer=lambda target: True,
        is_torch_less_than=lambda target: False,
    )
    planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    managers.register_all_kvcache_specs(None)
    return planning, interface, utils


def _multiple_of_class(root: str):
    """``MultipleOf`` (``v1/attention/backend.py`` L51-56), compiled out of the installed file."""
    import dataclasses
    import os

    path = os.path.join(root, "v1", "attention", "backend.py")
    node = next(n for n in _parsed(path).body if isinstance(n, ast.ClassDef) and n.name == "MultipleOf")
    namespace = {"dataclass": dataclasses.dataclass}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace["MultipleOf"]


def _config(case):
    limits = case["limits"]
    max_concurrent_batches = limits["max_concurrent_batches"]
    max_num_batched_tokens = limits["max_num_batched_tokens"]
    from vllm.v1.kv_cache_layout import KVCacheLayout

    layout = KVCacheLayout[case.get("kv_cache_layout", "LBNHC")]  # resolved by the engine core before planning
    cache_config = SimpleNamespace(
        num_gpu_blocks_override=case.get("num_gpu_blocks_override"),
        kv_cache_layout=layout.name,
        prefix_cache_retention_interval=None,
        mamba_cache_mode=limits["mamba_cache_mode"],
        get_resolved_kv_cache_layout=lambda: layout,
    )
    return SimpleNamespace(
        model_config=SimpleNamespace(
            max_model_len=limits["max_model_len"],
            original_max_model_len=-1 if case.get("auto_fit") else limits["max_model_len"],
            supports_kv_cache_grouping=False,
        ),
        cache_config=cache_config,
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=max_num_batched_tokens
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=case.get("tp_size", 1),
            decode_context_parallel_size=limits["decode_context_parallel_size"],
            pipeline_parallel_size=len(case["workers"]),
        ),
        device_config=SimpleNamespace(device_type="cuda"),
        speculative_config=None,
        num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=max_concurrent_batches * max_num_batched_tokens,
    )


def _spec(interface, data):
    import torch

    kind = data["kind"]
    common = {"block_size": data["block_size"]}
    if kind == "mamba":
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

        return interface.MambaSpec(
            shapes=tuple(tuple(s) for s in data["shapes"]),
            dtypes=tuple(getattr(torch, DTYPE_NAMES[b]) for b in data["dtype_bytes"]),
            page_size_padded=data.get("page_size_padded"),
            mamba_type=MambaAttentionBackendEnum[data.get("mamba_type", "mamba2").upper()],
            mamba_cache_mode=data.get("mamba_cache_mode", "none"),
            num_speculative_blocks=data.get("num_speculative_blocks", 0),
            num_prefill_checkpoint_blocks=data.get("num_prefill_checkpoint_blocks", 0),
            prefill_checkpoint_alignment=data.get("prefill_checkpoint_alignment"),
            **common,
        )
    attention = dict(
        common,
        num_kv_heads=data["num_kv_heads"],
        head_size=data["head_size"],
        dtype=getattr(torch, DTYPE_NAMES[data["dtype_bytes"]]),
        state_content_bytes=data.get("state_content_bytes"),
        max_tp_shards=data.get("max_tp_shards"),
        tokens_per_state=data.get("tokens_per_state", 1),
    )
    if data.get("block_stride_alignment") is not None:
        multiple_of = importlib.import_module("vllm.v1.attention.backend").MultipleOf
        attention["block_stride_alignment"] = multiple_of(data["block_stride_alignment"])
    if kind == "mla":
        return interface.MLAAttentionSpec(
            cache_dtype_str=data.get("cache_dtype_str"),
            cache_role=interface.SparseCacheRole(data.get("cache_role", "sparse")),
            alignment=data.get("alignment"),
            model_version=data.get("model_version"),
            **attention,
        )
    if kind == "circular_buffer":
        return interface.CircularBufferSpec(head_size_v=data["head_size_v"], **attention)
    if kind == "sliding_window_mla":
        return interface.SlidingWindowMLASpec(
            sliding_window=data["sliding_window"],
            bounded_replay=data.get("bounded_replay", False),
            cache_dtype_str=data.get("cache_dtype_str"),
            alignment=data.get("alignment"),
            model_version=data.get("model_version"),
            **attention,
        )
    attention["head_size_v"] = data["head_size_v"]
    if kind == "full":
        return interface.FullAttentionSpec(**attention)
    if kind == "sliding_window":
        return interface.SlidingWindowSpec(sliding_window=data["sliding_window"], **attention)
    if kind == "chunked_local":
        return interface.ChunkedLocalAttentionSpec(attention_chunk_size=data["attention_chunk_size"], **attention)
    raise ValueError(f"unknown spec kind {kind!r}")


def _plan(planning, interface, utils, case):
    config = _config(case)
    workers = [{name: _spec(interface, spec) for name, spec in worker.items()} for worker in case["workers"]]
    answer: dict = {}
    try:
        groups = planning.get_global_kv_cache_groups(config, workers)
    except NotImplementedError as error:
        return {"error": "NotImplementedError", "message": str(error)}
    answer["groups"] = [
        {
            "layers": list(g.layer_names),
            "block_size": g.kv_cache_spec.block_size,
            "page": g.kv_cache_spec.page_size_bytes,
        }
        for g in groups
    ]
    builder = planning.DefaultKVCacheConfigBuilder()
    projected = [planning._project_kv_cache_groups_to_worker(groups, worker) for worker in workers]
    memory = case["available_memory"]
    answer["bytes_per_block"] = [planning._pool_bytes_per_block_from_builder(builder, config, g) for g in projected]
    answer["estimates"] = [
        planning._estimate_max_model_len_from_groups(builder, config, g, m - b)
        for g, m, b in zip(projected, memory, answer["bytes_per_block"], strict=True)
    ]
    try:
        configs = planning.get_kv_cache_configs(config, workers, list(memory), groups)
    except ValueError as error:
        answer.update(error="ValueError", message=str(error))
        return answer
    scheduler = utils.generate_scheduler_kv_cache_config(configs)
    tokens, concurrency = utils.get_kv_cache_capacity(config, scheduler)
    answer.update(
        num_gpu_blocks=scheduler.num_blocks,
        max_model_len=config.model_config.max_model_len,
        max_concurrency=concurrency,
        kv_cache_size_tokens=tokens,
        tensor_bytes=[sum(t.size for t in c.kv_cache_tensors[:1]) for c in configs],
    )
    return answer


# ---------------------------------------------------------------------------
# a Mamba hybrid's layer specs: vLLM's state calculators, block alignment and MambaBase.get_kv_cache_spec
# ---------------------------------------------------------------------------


def _compile_function(path: str, function: ast.FunctionDef, namespace: dict):
    function.decorator_list = []
    glb = dict(namespace)
    exec(compile(ast.Module(body=[function], type_ignores=[]), path, "exec"), glb)
    return glb[function.name]


def _parsed(path: str) -> ast.Module:
    with open(path) as handle:
        return ast.parse(handle.read(), path)


def _method_from_installed(path: str, class_name: str, method: str, namespace: dict):
    """Compile one method of a class out of an installed vLLM file (decorators dropped: called as a function with
    the class or instance passed explicitly).  Nothing is copied: the source is read at run time."""
    cls = next(node for node in _parsed(path).body if isinstance(node, ast.ClassDef) and node.name == class_name)
    function = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == method)
    return _compile_function(path, function, namespace)


def _function_from_installed(path: str, name: str, namespace: dict):
    """Compile one top-level function out of an installed vLLM file (whose module is too heavy to import here)."""
    function = next(node for node in _parsed(path).body if isinstance(node, ast.FunctionDef) and node.name == name)
    return _compile_function(path, function, namespace)


class _Hybrid:
    """vLLM's code for a hybrid's specs: ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator``
    (``mamba_utils.py``), ``Platform._align_hybrid_block_size`` (``platforms/interface.py`` L940),
    ``MambaBase.get_kv_cache_spec`` (``mamba/abstract.py`` L72) and ``get_mamba_prefill_checkpoint_grid`` (L116).

    Stand-ins: the model class's two classmethods (``get_mamba_state_shape_from_config`` / ``..._dtype_...``, each
    family's argument mapping as its vLLM model file writes it, calling the real calculators), the attention
    backend (CUDA's FlashAttention: kernel blocks ``MultipleOf(16)``, ``customize_spec`` the identity) and the
    Mamba layers' ``get_prefill_checkpoint_alignment`` (the case's: 64 for FlashInfer's GDN prefill, else None).
    A Mamba2 layer's spec goes through ``MambaMixer2.get_kv_cache_spec`` (``mamba_mixer2.py`` L1108), read from
    the installed file: its prefill checkpoint block.
    """

    def __init__(self, bench_dir: str) -> None:
        import contextlib
        import logging
        import os

        import peer_imports as p

        self.case: dict = {}
        checkpoint = lambda vllm_config: self.case.get("checkpoint_alignment")  # noqa: E731
        p._STUB.add("vllm.config.vllm", set_current_vllm_config=lambda config: contextlib.nullcontext())
        p._STUB.add("vllm.config.cache", get_kv_cache_dtype_handler=lambda dtype: None)
        p._STUB.add("vllm.model_executor.layers.mamba.abstract", get_mamba_prefill_checkpoint_alignment=checkpoint)
        p._STUB.add("vllm.model_executor.models", ModelRegistry=SimpleNamespace(resolve_model_cls=self._model_cls))
        for package in ("vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.mamba"):
            p._BARE.add(package)
        distributed = importlib.import_module("vllm.distributed")
        distributed.divide = p.functions_from_installed_module(
            "vllm.distributed.utils", ["divide", "ensure_divisibility"], {}
        )["divide"]
        self.mamba_utils = importlib.import_module("vllm.model_executor.layers.mamba.mamba_utils")
        self.interface = importlib.import_module("vllm.v1.kv_cache_interface")
        root = sys.modules["vllm"].__path__[0]
        self.align = _method_from_installed(
            os.path.join(root, "platforms", "interface.py"),
            "Platform",
            "_align_hybrid_block_size",
            {"logger": logging.getLogger("vllm_runner")},
        )
        self.get_kv_cache_spec = _method_from_installed(
            os.path.join(root, "model_executor", "layers", "mamba", "abstract.py"),
            "MambaBase",
            "get_kv_cache_spec",
            {"MambaSpec": self.interface.MambaSpec, "KVCacheSpec": self.interface.KVCacheSpec},
        )
        models_config = os.path.join(root, "model_executor", "models", "config.py")
        namespace = {"logger": logging.getLogger("vllm_runner")}
        self.nemotron_ssm_dtype = _method_from_installed(
            models_config, "NemotronHForCausalLMConfig", "update_mamba_ssm_cache_dtype", namespace
        )
        self.qwen3_5_ssm_dtype = _method_from_installed(
            models_config, "Qwen3_5ForConditionalGenerationConfig", "verify_and_update_config", namespace
        )
        # MambaMixer2.get_kv_cache_spec (mamba_mixer2.py L1108-1118): MambaBase's spec plus the prefill checkpoint
        # block, for every Mamba2 layer (Nemotron-H, Falcon-H1, Granite-4.0-H, Zamba2, Mamba2); its zero-argument
        # super() is MambaBase's, called on the layer the runner passes
        base_spec = self.get_kv_cache_spec
        self.mixer2_layer: SimpleNamespace | None = None
        self.mamba2_kv_cache_spec = _method_from_installed(
            os.path.join(root, "model_executor", "layers", "mamba", "mamba_mixer2.py"),
            "MambaMixer2",
            "get_kv_cache_spec",
            {
                "super": lambda: SimpleNamespace(get_kv_cache_spec=lambda config: base_spec(self.mixer2_layer, config)),
                "replace": dataclasses.replace,
                "MambaSpec": self.interface.MambaSpec,
                "KVCacheSpec": self.interface.KVCacheSpec,
            },
        )
        self.checkpoint_grid = _function_from_installed(
            os.path.join(root, "model_executor", "layers", "mamba", "abstract.py"),
            "get_mamba_prefill_checkpoint_grid",
            {"get_mamba_prefill_checkpoint_alignment": checkpoint, "lcm": math.lcm},
        )

        # Kimi-Linear (registry.py L148-151: vllm.models.kimi_k3, CUDA: nvidia/model.py)
        import torch

        kimi = os.path.join(root, "models", "kimi_k3", "nvidia")
        kimi_gdn = os.path.join(root, "model_executor", "layers", "mamba", "gdn", "kimi_gdn_linear_attn.py")
        torch_utils = importlib.import_module("vllm.utils.torch_utils")
        calculators = {
            "torch": torch,
            "VllmConfig": object,
            "KVCacheSpec": self.interface.KVCacheSpec,
            "MambaStateShapes": tuple,
            "MambaStateShapeCalculator": self.mamba_utils.MambaStateShapeCalculator,
            "MambaStateDtypeCalculator": self.mamba_utils.MambaStateDtypeCalculator,
            "MLAAttentionSpec": self.interface.MLAAttentionSpec,
            "get_kv_quant_mode": self.interface.get_kv_quant_mode,
            "kv_cache_dtype_str_to_dtype": torch_utils.kv_cache_dtype_str_to_dtype,
        }
        self.kimi = {
            method: _method_from_installed(os.path.join(kimi, "model.py"), "KimiLinearForCausalLM", method, calculators)
            for method in ("get_mamba_state_shape_from_config", "get_mamba_state_dtype_from_config")
        }
        self.kimi.update(
            {
                method: _method_from_installed(kimi_gdn, "KimiGatedDeltaNetAttention", method, calculators)
                for method in ("get_state_shape", "get_state_dtype")
            }
        )
        self.kimi["mla_spec"] = _method_from_installed(
            os.path.join(kimi, "mla.py"), "MultiHeadLatentAttention", "get_kv_cache_spec", calculators
        )
        configs = os.path.join(root, "transformers_utils", "configs", "kimi_linear.py")
        self.kimi["is_kda_layer"] = _method_from_installed(configs, "KimiLinearConfig", "is_kda_layer", {})
        mla = os.path.join(root, "v1", "attention", "backends", "mla")
        multiple_of = {"MultipleOf": importlib.import_module("vllm.v1.attention.backend").MultipleOf}
        self.kimi_backends = {
            name: _method_from_installed(os.path.join(mla, file), cls, "get_supported_kernel_block_sizes", multiple_of)
            for name, file, cls in (
                ("FLASH_ATTN_MLA", "flashattn_mla.py", "FlashAttnMLABackend"),
                ("FLASHMLA", "flashmla.py", "FlashMLABackend"),
            )
        }

    def _model_cls(self, architecture, model_config=None):
        return self, architecture

    def get_mamba_state_shape_from_config(self, vllm_config):
        """Each family's classmethod: qwen3_next.py L893-912, nemotron_h.py L780-820, jamba.py L470-483,
        falcon_h1.py L538-571, granitemoehybrid.py L617-645."""
        hf = SimpleNamespace(**self.case["hf"])
        tp = vllm_config.parallel_config.tensor_parallel_size
        calc = self.mamba_utils.MambaStateShapeCalculator
        family = self.case["family"]
        if family == "kimi_linear":  # the installed classmethod itself (nvidia/model.py L1505-1524)
            return self.kimi["get_mamba_state_shape_from_config"](None, vllm_config)
        if family == "qwen_gdn":
            return calc.gated_delta_net_state_shape(
                tp,
                hf.linear_num_key_heads,
                hf.linear_num_value_heads,
                hf.linear_key_head_dim,
                hf.linear_value_head_dim,
                hf.linear_conv_kernel_dim,
                0,
            )
        if family == "jamba":
            return calc.mamba1_state_shape(
                tp_world_size=tp,
                intermediate_size=hf.mamba_expand * hf.hidden_size,
                state_size=hf.mamba_d_state,
                conv_kernel=hf.mamba_d_conv,
            )
        if family == "nemotron_h":
            return calc.mamba2_state_shape(
                intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim,
                tp_world_size=tp,
                n_groups=hf.n_groups,
                num_heads=hf.mamba_num_heads,
                head_dim=hf.mamba_head_dim,
                state_size=hf.ssm_state_size,
                conv_kernel=hf.conv_kernel,
                num_spec=0,
            )
        intermediate = hf.mamba_expand * hf.hidden_size
        if family == "falcon_h1" and hf.mamba_d_ssm is not None:
            intermediate = hf.mamba_d_ssm
        return calc.mamba2_state_shape(
            intermediate_size=intermediate,
            tp_world_size=tp,
            n_groups=hf.mamba_n_groups,
            num_heads=hf.mamba_n_heads,
            head_dim=hf.mamba_d_head,
            state_size=hf.mamba_d_state,
            conv_kernel=hf.mamba_d_conv,
            num_spec=0,
        )

    def get_mamba_state_dtype_from_config(self, vllm_config):
        if self.case["family"] == "kimi_linear":  # nvidia/model.py L1494-1503
            return self.kimi["get_mamba_state_dtype_from_config"](None, vllm_config)
        calc = self.mamba_utils.MambaStateDtypeCalculator
        cache = vllm_config.cache_config
        return calc._mamba_state_dtype(
            vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype
        )

    def kimi_linear_specs(self, case):
        """Kimi-Linear's layer specs, in layer order, as ``KimiDecoderLayer`` builds them on Hopper.

        Real code: ``KimiLinearConfig.is_kda_layer``, ``KimiLinearForCausalLM``'s two state classmethods,
        ``KimiGatedDeltaNetAttention.get_state_shape`` / ``get_state_dtype``, ``MambaBase.get_kv_cache_spec``,
        ``MultiHeadLatentAttention.get_kv_cache_spec``, ``Platform._align_hybrid_block_size`` and the MLA backends'
        ``get_supported_kernel_block_sizes``.  Stand-ins (building the layers needs a GPU): each layer is a namespace
        of what its ``__init__`` sets before the spec is asked (``kimi_gdn_linear_attn.py`` L177-195: ``tp_size``,
        ``num_heads``, ``head_dim``, ``conv_size``; ``num_spec`` 0 without speculative decoding; ``mla.py`` L160 and
        L318-322: ``head_size = kv_lora_rank + qk_rope_head_dim``, ``kv_cache_dtype`` is ``--kv-cache-dtype``),
        named ``model.layers.<i>.self_attn`` (``nvidia/model.py`` L716-762); ``ModelConfig.use_mla`` true with one
        KV head and ``kv_lora_rank + qk_rope_head_dim`` (``model_arch_config_convertor.py`` L91-98, L294-326); the
        MLA backend Hopper's priority list picks (``platforms/cuda.py`` L149-155): FlashAttention-MLA for ``auto`` /
        16-bit caches, FlashMLA for fp8 (``supported_kv_cache_dtypes``, ``flashattn_mla.py`` L42-46,
        ``flashmla.py`` L48-54).
        """
        import torch

        self.case = case
        tp = case["tp_size"]
        hf = SimpleNamespace(**case["hf"])
        model_dtype = getattr(torch, DTYPE_NAMES[case["model_dtype_bytes"]])
        model_config = SimpleNamespace(
            dtype=model_dtype,
            use_mla=True,
            architecture=case["hf"]["architectures"][0],
            hf_config=hf,
            get_num_kv_heads=lambda parallel: 1,
            get_head_size=lambda: hf.kv_lora_rank + hf.qk_rope_head_dim,
        )
        cache_config = SimpleNamespace(
            cache_dtype=case["cache_dtype"],
            block_size=case["block_size"],
            mamba_cache_mode="align",
            mamba_block_size=case["block_size"],
            mamba_page_size_padded=None,
            mamba_cache_dtype="auto",
            mamba_ssm_cache_dtype="auto",
            kv_cache_dtype_skip_layers=None,
            prefix_match_unit=None,
            use_replayssm=False,
        )
        name = "FLASH_ATTN_MLA" if case["cache_dtype"] in ("auto", "float16", "bfloat16") else "FLASHMLA"
        backend = SimpleNamespace(get_supported_kernel_block_sizes=self.kimi_backends[name])
        platform = SimpleNamespace(_find_non_ssm_backends=lambda config: [backend])
        vllm_config = SimpleNamespace(
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=SimpleNamespace(tensor_parallel_size=tp),
            speculative_config=None,
            num_speculative_tokens=0,
        )
        self.align(platform, vllm_config, backend)
        linear = case["hf"]["linear_attn_config"]
        kda = SimpleNamespace(
            tp_size=tp,
            num_heads=linear["num_heads"],
            head_dim=linear["head_dim"],
            conv_size=linear["short_conv_kernel_size"],
            num_spec=0,
            model_config=model_config,
            cache_config=cache_config,
            is_kv_cache_tp_replicated=False,
            mamba_type=self.mamba_utils.MambaAttentionBackendEnum.GDN_ATTN,  # GatedDeltaNetAttention (base.py L49-51)
        )
        kda.get_state_shape = lambda: self.kimi["get_state_shape"](kda)
        kda.get_state_dtype = lambda: self.kimi["get_state_dtype"](kda)
        mla = SimpleNamespace(
            kv_cache_dtype=case["cache_dtype"],
            head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,  # the latent "head" (mla.py L160)
            non_causal_multi_token_decode=False,
        )
        specs = []
        for index in range(hf.num_hidden_layers):
            if self.kimi["is_kda_layer"](hf, index):
                specs.append([f"model.layers.{index}.self_attn", _mamba_dict(self.get_kv_cache_spec(kda, vllm_config))])
            else:
                specs.append([f"model.layers.{index}.self_attn", _spec_dict(self.kimi["mla_spec"](mla, vllm_config))])
        return {"block_size": cache_config.block_size, "backend": name, "specs": specs}

    def specs(self, case):
        """The hybrid's attention block size, its Mamba layer's spec and its attention layer's page."""
        import torch

        if case["family"] == "kimi_linear":
            return self.kimi_linear_specs(case)
        self.case = case
        tp = case["tp_size"]
        model_dtype = getattr(torch, DTYPE_NAMES[case["model_dtype_bytes"]])
        model_config = SimpleNamespace(
            dtype=model_dtype,
            use_mla=False,
            architecture=case["family"],
            get_num_kv_heads=lambda parallel: max(1, case["num_kv_heads"] // parallel.tensor_parallel_size),
            get_head_size=lambda: case["head_size"],
        )
        cache_config = SimpleNamespace(
            cache_dtype=case["cache_dtype"],
            block_size=case["block_size"],
            mamba_cache_mode="align",
            mamba_block_size=case["block_size"],  # MambaModelConfig with prefix caching (models/config.py L778)
            mamba_page_size_padded=None,
            mamba_cache_dtype="auto",
            mamba_ssm_cache_dtype="auto",
            kv_cache_dtype_skip_layers=None,
            prefix_match_unit=None,
            use_replayssm=False,
        )
        hf_config = SimpleNamespace(**case["hf"])
        architecture = case["hf"]["architectures"][0]
        if architecture.startswith("NemotronH"):  # MODELS_CONFIG_MAP (models/config.py L1251)
            nemotron = SimpleNamespace(DEFAULT_MAMBA_SSM_CACHE_DTYPE="float32")
            self.nemotron_ssm_dtype(nemotron, cache_config=cache_config, hf_config=hf_config)
        elif architecture.startswith("Qwen3_5"):  # L1259-1262
            config = SimpleNamespace(cache_config=cache_config, model_config=SimpleNamespace(hf_text_config=hf_config))
            self.qwen3_5_ssm_dtype(config)
        multiple_of = importlib.import_module("vllm.v1.attention.backend").MultipleOf(16)

        class FlashAttention:
            @staticmethod
            def get_supported_kernel_block_sizes():
                return [multiple_of]

            @staticmethod
            def customize_spec(spec):
                return spec

        platform = SimpleNamespace(_find_non_ssm_backends=lambda config: [FlashAttention])
        vllm_config = SimpleNamespace(
            model_config=model_config,
            cache_config=cache_config,
            parallel_config=SimpleNamespace(tensor_parallel_size=tp),
            num_speculative_tokens=0,
        )
        self.align(platform, vllm_config, FlashAttention)
        layer = SimpleNamespace(
            get_state_shape=lambda: self.get_mamba_state_shape_from_config(vllm_config),
            get_state_dtype=lambda: self.get_mamba_state_dtype_from_config(vllm_config),
            mamba_type=self.mamba_utils.MambaAttentionBackendEnum[case["mamba_type"].upper()],
            is_kv_cache_tp_replicated=False,
        )
        vllm_config.cache_config.use_replayssm = False
        if case["mamba_type"] == "mamba2":  # the layer is a MambaMixer2
            self.mixer2_layer = layer
            mamba = self.mamba2_kv_cache_spec(layer, vllm_config)
        else:
            mamba = self.get_kv_cache_spec(layer, vllm_config)
        if case.get("checkpoint_alignment") is not None:  # QwenGatedDeltaNetAttention.get_kv_cache_spec L739-750
            mamba = dataclasses.replace(
                mamba,
                num_prefill_checkpoint_blocks=1,
                prefill_checkpoint_alignment=self.checkpoint_grid(vllm_config),
            )
        kv_dtype = model_dtype if case["cache_dtype"] == "auto" else getattr(torch, DTYPE_NAMES[1])
        attention = self.interface.FullAttentionSpec(
            block_size=cache_config.block_size,
            num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
            head_size=case["head_size"],
            dtype=kv_dtype,
        )
        return {
            "block_size": cache_config.block_size,
            "attention_page": attention.page_size_bytes,
            "mamba": _mamba_dict(mamba),
        }


def _mamba_dict(mamba) -> dict:
    """A vLLM ``MambaSpec`` in the runner's form."""
    from vllm.utils.torch_utils import get_dtype_size

    return {
        "kind": "mamba",
        "block_size": mamba.block_size,
        "shapes": [list(shape) for shape in mamba.shapes],
        "dtype_bytes": [get_dtype_size(dtype) for dtype in mamba.dtypes],
        "page_size_padded": mamba.page_size_padded,
        "mamba_type": mamba.mamba_type.name.lower(),
        "mamba_cache_mode": mamba.mamba_cache_mode,
        "num_speculative_blocks": mamba.num_speculative_blocks,
        "num_prefill_checkpoint_blocks": mamba.num_prefill_checkpoint_blocks,
        "prefill_checkpoint_alignment": mamba.prefill_checkpoint_alignment,
    }


# ---------------------------------------------------------------------------
# DeepSeek-V4's layer specs: its layers' get_kv_cache_spec, the backends' block sizes and layouts
# ---------------------------------------------------------------------------


def _init_defaults(path: str, class_name: str) -> dict:
    """The keyword defaults of an installed class's ``__init__`` (literals only), read from its source."""
    cls = next(node for node in _parsed(path).body if isinstance(node, ast.ClassDef) and node.name == class_name)
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    args = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    return {arg.arg: ast.literal_eval(default) for arg, default in zip(args, init.args.defaults, strict=True)}


def _assignment_from_installed(path: str, name: str, namespace: dict):
    """One module-level constant of an installed file, evaluated in ``namespace``."""
    node = next(
        n
        for n in _parsed(path).body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
    )
    glb = dict(namespace)
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), glb)
    return glb[name]


class _DeepseekV4:
    """vLLM's code for DeepSeek-V4's specs on CUDA with the default FlashMLA class (``nvidia/model.py`` L537-568):
    ``_resolve_dsv4_kv_cache_dtype`` and the ``get_kv_cache_spec`` of ``DeepseekV4Attention``,
    ``DeepseekV4IndexerCache`` (``attention.py`` L94, L860, L911), ``CompressorStateCache`` (``compressor.py`` L179)
    and ``DeepseekV4SWACache`` (``sparse_swa.py`` L120, with its ``__init__`` defaults); the four backends'
    ``get_supported_kernel_block_sizes`` (``sparse_mla.py`` L60, ``indexer.py`` L355, ``sparse_swa.py`` L161,
    ``compressor.py`` L69) and the indexer's ``supported_kv_cache_layouts`` (``indexer.py`` L349);
    ``AttentionBackend.supports_block_size``, ``Platform._preferred_block_size_for_backends``
    (``platforms/interface.py`` L700), ``customize_attention_spec`` (``v1/worker/utils.py`` L476),
    ``get_supported_kv_cache_layouts`` and
    ``resolve_kv_cache_layout`` (``v1/attention/backends/utils.py`` L243, L293).

    Stand-ins (building the layers needs a GPU): each layer is a namespace holding what its ``__init__`` computes
    before the spec is asked -- ``compress_ratio = max(1, ratio)`` (``attention.py`` L236-242), the indexer key width
    ``index_head_dim + index_head_dim // 128 * 4`` (L1007, L1024-1029), the compressor state ``2 x coff x head_dim``
    float32 with ``coff = 1 + (ratio == 4)`` (``compressor.py`` L239-240, L261, L282-287) in blocks of 4 (c4) or 8
    (c128) tokens, window ``coff x ratio`` (L155-171) -- registered in ``DeepseekV4Attention.__init__``'s order
    (indexer L309-320, SWA cache L349-356, the attention itself L363, its compressor L368-377); the backend classes
    are namespaces carrying those methods; no ``VLLM_KV_CACHE_LAYOUT`` nor KV connector.
    """

    def __init__(self, interface) -> None:
        import collections
        import dataclasses
        import itertools
        import logging
        import os
        from collections.abc import Iterable

        import torch
        from vllm.v1.kv_cache_layout import KVCacheLayout

        root = sys.modules["vllm"].__path__[0]
        self.interface = interface
        self.multiple_of = importlib.import_module("vllm.v1.attention.backend").MultipleOf
        logger = logging.getLogger("vllm_runner")
        logger.info_once = logger.info  # type: ignore[attr-defined]
        common = {
            "torch": torch,
            "MultipleOf": self.multiple_of,
            "KVCacheSpec": interface.KVCacheSpec,
            "AttentionSpec": interface.AttentionSpec,
            "MLAAttentionSpec": interface.MLAAttentionSpec,
            "SlidingWindowMLASpec": interface.SlidingWindowMLASpec,
            "get_kv_quant_mode": interface.get_kv_quant_mode,
            "KVCacheLayout": KVCacheLayout,
            "VllmConfig": object,
            "CacheConfig": object,
            "AttentionBackend": object,
            "Iterable": Iterable,
            "logger": logger,
            "math": math,
            "itertools": itertools,
            "replace": dataclasses.replace,
            "defaultdict": collections.defaultdict,
        }
        self.common = common
        path = os.path.join
        attention = path(root, "models", "deepseek_v4", "attention.py")
        compressor = path(root, "models", "deepseek_v4", "compressor.py")
        sparse_swa = path(root, "v1", "attention", "backends", "mla", "sparse_swa.py")
        indexer = path(root, "v1", "attention", "backends", "mla", "indexer.py")
        utils = path(root, "v1", "attention", "backends", "utils.py")
        self.resolve_dtype = _function_from_installed(attention, "_resolve_dsv4_kv_cache_dtype", common)
        self.attention_spec = _method_from_installed(attention, "DeepseekV4Attention", "get_kv_cache_spec", common)
        self.indexer_spec = _method_from_installed(attention, "DeepseekV4IndexerCache", "get_kv_cache_spec", common)
        self.state_spec = _method_from_installed(compressor, "CompressorStateCache", "get_kv_cache_spec", common)
        self.swa_spec = _method_from_installed(sparse_swa, "DeepseekV4SWACache", "get_kv_cache_spec", common)
        self.swa_defaults = _init_defaults(sparse_swa, "DeepseekV4SWACache")
        self.supports = _method_from_installed(
            path(root, "v1", "attention", "backend.py"), "AttentionBackend", "supports_block_size", common
        )
        backend = self.make_backend

        self.flashmla = backend(
            "FLASHMLA_SPARSE_DSV4", path(root, "models", "deepseek_v4", "sparse_mla.py"), "DeepseekV4SparseMLABackend"
        )
        indexer_layouts = _method_from_installed(
            indexer, "DeepseekV4IndexerBackend", "supported_kv_cache_layouts", common
        )
        self.indexer = backend("DEEPSEEK_V4_INDEXER", indexer, "DeepseekV4IndexerBackend", indexer_layouts)
        self.swa = backend("DEEPSEEK_SPARSE_SWA", sparse_swa, "DeepseekSparseSWABackend")
        self.compressor = backend("CompressorBackend", compressor, "CompressorBackend")
        self.preferred_block_size = _method_from_installed(
            path(root, "platforms", "interface.py"), "Platform", "_preferred_block_size_for_backends", common
        )
        self.customize = _function_from_installed(
            path(root, "v1", "worker", "utils.py"), "customize_attention_spec", common
        )
        cache = path(root, "config", "cache.py")
        layouts = dict(common)
        layouts["_LAYOUT_COMPAT_ALIASES"] = _assignment_from_installed(cache, "_LAYOUT_COMPAT_ALIASES", common)
        layouts["_layout_from_name"] = _function_from_installed(cache, "_layout_from_name", layouts)
        layouts["_layout_names"] = _function_from_installed(utils, "_layout_names", layouts)
        layouts["_DEFAULT_LAYOUT_PREFERENCE"] = _assignment_from_installed(utils, "_DEFAULT_LAYOUT_PREFERENCE", layouts)
        layouts["envs"] = SimpleNamespace(VLLM_KV_CACHE_LAYOUT=None)
        layouts["get_kv_connector_cache_layout"] = lambda vllm_config: None
        self.supported_layouts = _function_from_installed(utils, "get_supported_kv_cache_layouts", layouts)
        self.resolve_layout = _function_from_installed(utils, "resolve_kv_cache_layout", layouts)

    def make_backend(self, name, file, class_name, layouts=None, namespace=None):
        """A backend class as a namespace carrying its installed ``get_supported_kernel_block_sizes``."""
        sizes = _method_from_installed(file, class_name, "get_supported_kernel_block_sizes", namespace or self.common)
        backend = SimpleNamespace(name=name, get_supported_kernel_block_sizes=sizes, customize_spec=lambda s: s)
        backend.supports_block_size = lambda size: self.supports(backend, size)
        backend.get_name = lambda: name
        backend.supported_kv_cache_layouts = (lambda: layouts(None)) if layouts else (lambda: None)
        return backend

    def finish(self, registered, cache_config, vllm_config):
        """The block size the layers' backends settle on, each layer's customised spec and the resolved layout."""
        backends = []
        for _, _, _, backend in registered:
            if backend not in backends:
                backends.append(backend)
        if cache_config.block_size == 16:  # not user-specified: update_block_size_for_backend (interface.py L750-778)
            cache_config.block_size = self.preferred_block_size(None, backends, 16, vllm_config)
        specs = {}
        for name, layer, get_spec, backend in registered:
            spec = get_spec(layer, vllm_config)
            if spec:
                specs[name] = self.customize(backend, spec)
        names = [layout.name for layout in self.supported_layouts(backends)]
        layout = self.resolve_layout(vllm_config, [names], specs.values())
        return {
            "block_size": cache_config.block_size,
            "kv_cache_dtype": cache_config.cache_dtype,
            "kv_cache_layout": layout.name,
            "specs": [[name, _spec_dict(spec)] for name, spec in specs.items()],
        }

    def specs(self, case):
        """The layer specs one worker reports (``get_kv_cache_spec`` of the runner), the block size, the layout."""
        import torch

        cache_config = SimpleNamespace(
            block_size=case["block_size"], cache_dtype=case["cache_dtype"], kv_cache_layout=None
        )
        vllm_config = SimpleNamespace(cache_config=cache_config)
        try:
            kv_cache_dtype, torch_dtype = self.resolve_dtype(True, cache_config.cache_dtype, cache_config)
        except ValueError as error:
            return {"error": "ValueError", "message": str(error)}
        ratios = [max(1, ratio) for ratio in case["compress_ratios"][: case["num_hidden_layers"]]]
        registered = []  # (name, layer, get_kv_cache_spec, backend) in static_forward_context order
        for index, ratio in enumerate(ratios):
            prefix = f"model.layers.{index}.attn"
            if ratio == 4:
                key_dim = case["index_head_dim"] + case["index_head_dim"] // 128 * 4
                key = SimpleNamespace(cache_config=cache_config, head_dim=key_dim, dtype=torch.uint8, compress_ratio=4)
                registered.append((f"{prefix}.indexer.k_cache", key, self.indexer_spec, self.indexer))
                registered.append(
                    (
                        f"{prefix}.indexer.compressor.state_cache",
                        self._state(4, case["index_head_dim"]),
                        self.state_spec,
                        self.compressor,
                    )
                )
            swa = SimpleNamespace(
                cache_config=cache_config,
                head_dim=case["head_dim"],
                window_size=case["sliding_window"],
                dtype=torch_dtype,
                block_size=self.swa_defaults["block_size"],
                packed_bytes_per_token=self.swa_defaults["packed_bytes_per_token"],
                packed_page_alignment=self.swa_defaults["packed_page_alignment"],
                packed_block_stride_alignment=self.swa_defaults["packed_block_stride_alignment"],
                bounded_replay=self.swa_defaults["bounded_replay"],
            )
            registered.append((f"{prefix}.swa_cache", swa, self.swa_spec, self.swa))
            attn = SimpleNamespace(
                compress_ratio=ratio,
                kv_cache_dtype=kv_cache_dtype,
                kv_cache_torch_dtype=torch_dtype,
                head_dim=case["head_dim"],
            )
            registered.append((prefix, attn, self.attention_spec, self.flashmla))
            if ratio > 1:
                registered.append(
                    (
                        f"{prefix}.compressor.state_cache",
                        self._state(ratio, case["head_dim"]),
                        self.state_spec,
                        self.compressor,
                    )
                )
        return self.finish(registered, cache_config, vllm_config)

    @staticmethod
    def _state(ratio: int, head_dim: int):
        import torch

        coff = 1 + (ratio == 4)
        return SimpleNamespace(
            state_dim=2 * coff * head_dim,
            dtype=torch.float32,
            sliding_window=coff * ratio,
            block_size=4 if ratio == 4 else 8,
        )


class _DeepseekV41:
    """vLLM's code for DeepSeek-V4.1's specs (``DeepseekV41ForCausalLM``, ``vllm.models.deepseek_v41``) on a CUDA GPU
    that is not SM100 nor SM12x, with the default FlashMLA class (``nvidia/model.py`` L201-262):
    ``_resolve_dsv4_kv_cache_dtype`` and the ``get_kv_cache_spec`` of ``DeepseekV4Attention`` and
    ``DeepseekV4IndexerCache`` (``deepseek_v41/attention.py`` L141, L1206, L1274), ``CompressorStateCache``
    (``deepseek_v41/compressor.py`` L229) and ``DeepseekV4SWACache`` (``sparse_swa.py`` L120); the backends'
    ``get_supported_kernel_block_sizes`` (``deepseek_v41/sparse_mla.py`` L115, ``indexer.py`` L365, ``sparse_swa.py``
    L161, ``deepseek_v41/compressor.py`` L46) with ``current_platform.is_device_capability_family`` answering for the
    case's GPU family, the indexer's ``supported_kv_cache_layouts`` (``indexer.py`` L349); block size, spec
    customisation and layout resolution as in :class:`_DeepseekV4`.

    Stand-ins (building the layers needs a GPU): each layer is a namespace holding what ``DeepseekV4Attention.__init__``
    computes before the spec is asked -- the layer's ratio, ``is_kv_source`` / ``is_index_source`` (L332-345), the
    indexer key cache only on a layer that is both (L444-455), the V4 record on a GPU other than SM100 (L133-140,
    L524-531: 584 B rows, 576 B pages), the SWA cache's constructor arguments (L563-580: 32-token blocks, no block
    stride alignment, bounded replay on, as model runner V2 and CUDA leave it), the compressor ring only on a ratio-2
    kv source (``compressor.py`` L306-314; rows ``max(8, next power of two of 2)``, L221-223, no speculative tokens)
    -- registered in ``__init__``'s order: the attention itself first (L433-436), its indexer key cache, its SWA cache
    (L563), its compressor's ring (L588-597).  No ``VLLM_KV_CACHE_LAYOUT``, KV connector, sparse logits, MXFP4 indexer.
    """

    def __init__(self, interface, v4: _DeepseekV4) -> None:
        import os

        root = sys.modules["vllm"].__path__[0]
        self.interface = interface
        self.v4 = v4
        self.family = 90
        common = dict(v4.common)
        common.update(
            CircularBufferSpec=interface.CircularBufferSpec,
            current_platform=SimpleNamespace(is_device_capability_family=lambda family: family == self.family),
            _use_v41_mxfp8_kv_record=lambda: False,
        )
        path = os.path.join
        attention = path(root, "models", "deepseek_v41", "attention.py")
        compressor = path(root, "models", "deepseek_v41", "compressor.py")
        indexer = path(root, "v1", "attention", "backends", "mla", "indexer.py")
        self.resolve_dtype = _function_from_installed(attention, "_resolve_dsv4_kv_cache_dtype", common)
        self.attention_spec = _method_from_installed(attention, "DeepseekV4Attention", "get_kv_cache_spec", common)
        self.indexer_spec = _method_from_installed(attention, "DeepseekV4IndexerCache", "get_kv_cache_spec", common)
        self.ring_spec = _method_from_installed(compressor, "CompressorStateCache", "get_kv_cache_spec", common)
        self.flashmla = v4.make_backend(
            "FLASHMLA_SPARSE_DSV41",
            path(root, "models", "deepseek_v41", "sparse_mla.py"),
            "DeepseekV4SparseMLABackend",
            namespace=common,
        )
        indexer_layouts = _method_from_installed(
            indexer, "DeepseekV4IndexerBackend", "supported_kv_cache_layouts", common
        )
        self.indexer = v4.make_backend(
            "DEEPSEEK_V41_INDEXER", indexer, "DeepseekV41IndexerBackend", indexer_layouts, namespace=common
        )
        self.compressor = v4.make_backend("CompressorBackend", compressor, "CompressorBackend", namespace=common)

    def specs(self, case):
        import torch

        self.family = case.get("capability_family", 90)
        cache_config = SimpleNamespace(
            block_size=case["block_size"], cache_dtype=case["cache_dtype"], kv_cache_layout=None
        )
        vllm_config = SimpleNamespace(
            cache_config=cache_config, attention_config=SimpleNamespace(indexer_sparse_logits=False)
        )
        try:
            kv_cache_dtype, torch_dtype = self.resolve_dtype(True, cache_config.cache_dtype, cache_config)
        except ValueError as error:
            return {"error": "ValueError", "message": str(error)}
        kv_sources = set(case["kv_source_layer_ids"])
        index_sources = set(case["index_source_layer_ids"])
        registered = []
        for index, ratio in enumerate(case["compress_ratios"][: case["num_hidden_layers"]]):
            prefix = f"model.layers.{index}.attn"
            is_kv_source = index in kv_sources
            attn = SimpleNamespace(
                is_kv_source=is_kv_source,
                compress_ratio=ratio,
                kv_cache_dtype=kv_cache_dtype,
                kv_cache_torch_dtype=torch_dtype,
                head_dim=case["head_dim"],
                kv_page_alignment=576,
                compressed_bytes_per_token=584,
            )
            registered.append((prefix, attn, self.attention_spec, self.flashmla))
            if is_kv_source and index in index_sources:
                key = SimpleNamespace(
                    cache_config=cache_config,
                    head_dim=case["index_head_dim"] + case["index_head_dim"] // 128 * 4,
                    dtype=torch.uint8,
                    compress_ratio=ratio,
                    sparse_logits=False,
                    rocm_mxfp4=False,
                )
                registered.append((f"{prefix}.indexer.k_cache", key, self.indexer_spec, self.indexer))
            swa = SimpleNamespace(
                cache_config=cache_config,
                head_dim=case["head_dim"],
                window_size=case["sliding_window"],
                dtype=torch_dtype,
                block_size=32,
                packed_bytes_per_token=584,
                packed_page_alignment=576,
                packed_block_stride_alignment=None,
                bounded_replay=True,
            )
            registered.append((f"{prefix}.swa_cache", swa, self.v4.swa_spec, self.v4.swa))
            if is_kv_source and ratio > 1:
                ring = SimpleNamespace(
                    block_size=max(8, 1 << (2 - 1).bit_length()), state_dim=2 * case["head_dim"], dtype=torch.float32
                )
                registered.append((f"{prefix}.compressor.state_cache", ring, self.ring_spec, self.compressor))
        return self.v4.finish(registered, cache_config, vllm_config)


def _spec_dict(spec) -> dict:
    """A vLLM attention spec in ``vllm_runner`` form, with the page vLLM computes."""
    from vllm.utils.torch_utils import get_dtype_size

    kind = {"SlidingWindowMLASpec": "sliding_window_mla", "CircularBufferSpec": "circular_buffer"}.get(
        type(spec).__name__, "mla"
    )
    data = {
        "kind": kind,
        "block_size": spec.block_size,
        "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "head_size_v": spec.head_size_v,
        "dtype_bytes": get_dtype_size(spec.dtype),
        "state_content_bytes": spec.state_content_bytes,
        "max_tp_shards": spec.max_tp_shards,
        "tokens_per_state": spec.tokens_per_state,
        "block_stride_alignment": None if spec.block_stride_alignment is None else spec.block_stride_alignment.base,
    }
    if kind == "circular_buffer":
        return {**data, "page_size_bytes": spec.page_size_bytes}
    data.update(
        cache_dtype_str=spec.cache_dtype_str,
        alignment=spec.alignment,
        model_version=spec.model_version,
        page_size_bytes=spec.page_size_bytes,
    )
    if kind == "mla":
        data["cache_role"] = spec.cache_role.value
    else:
        data["sliding_window"] = spec.sliding_window
        if spec.bounded_replay:  # DeepSeek-V4.1's SWA caches only; V4's keep the default
            data["bounded_replay"] = True
    return data


def main() -> None:
    planning, interface, utils = _install(sys.argv[1])
    hybrid = _Hybrid(sys.argv[1])
    deepseek_v4 = _DeepseekV4(interface)
    deepseek_v41 = _DeepseekV41(interface, deepseek_v4)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            case = json.loads(line)
            if case.get("op") == "hybrid_specs":
                try:
                    print(json.dumps(hybrid.specs(case)), flush=True)
                except AssertionError as error:  # vLLM's divide(): the state does not split over this TP size
                    print(json.dumps({"error": "AssertionError", "message": str(error)}), flush=True)
                continue
            if case.get("op") == "dsv4_specs":
                print(json.dumps(deepseek_v4.specs(case)), flush=True)
                continue
            if case.get("op") == "dsv41_specs":
                print(json.dumps(deepseek_v41.specs(case)), flush=True)
                continue
            answer = _plan(planning, interface, utils, case)
        except Exception as error:  # reported to the test, which fails with vLLM's traceback
            answer = {"error": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
