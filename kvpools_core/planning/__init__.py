"""The planners built on plans: each module answers one question a capacity planner asks.

- :mod:`~kvpools_core.planning.capacity`: how many requests of a length fit, and what context N requests reach.
- :mod:`~kvpools_core.planning.split`: which split of a hybrid model's pools runs the most requests of a workload.
- :mod:`~kvpools_core.planning.replay`: what concurrency a request trace achieves through the real allocators.
- :mod:`~kvpools_core.planning.fit`: which configurations on the fewest GPUs hold N requests of L tokens.
- :mod:`~kvpools_core.planning.sweep`: tokens, bytes and concurrency over a grid of models x options x budgets.
- :mod:`~kvpools_core.planning.compare`: one model through every engine's accounting, side by side.
- :mod:`~kvpools_core.planning.distributed` / :mod:`~kvpools_core.planning.rank_exchange`: plans on every rank
  of a job, agreed on one token count, failures named by rank.
- :mod:`~kvpools_core.planning.capacity_record`: the stable record orchestrators read per rank.
- :mod:`~kvpools_core.planning.engine_version`: which engine version a plan reproduces (``--engine-version``) and
  vLLM's plan from its options, shared by the command line and the service.
"""
