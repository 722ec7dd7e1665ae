"""How the ranks of a process group tell each other how planning went, in bounded time, naming who failed.

A collective (``all_reduce``) waits for every rank: one that raised before reaching it, exited or lags leaves the
others blocked until the group's own timeout (30 minutes by default), then failing with a gloo or nccl error that
names neither kvpools nor the rank.  :func:`kvpools_core.planning.distributed.plan_on_group` exchanges
through the group's
key-value store instead (the one every backend rendezvoused through): in each round a rank runs its own work
inside a ``try``, publishes ``ok`` with its values or its error type and message under its own key, and waits at
most ``timeout`` seconds for every rank's key.  A key that never appears names a rank that exited, hangs or never
called; a rank that gives up publishes that for the later rounds too, so a laggard that arrives late learns why
at once.  Every rank reads the same keys and raises the same :class:`~kvpools_core.errors.DistributedPlanError`.

Ranks must also plan the same thing: :func:`fingerprint` hashes the canonical JSON of the model and the serving
options without what legitimately differs per rank, and :func:`first_difference` names the first field that does
differ.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from kvpools_core.errors import (
    ConfigError,
    DistributedPlanError,
    RankFailedError,
    RankMismatchError,
    RankTimeoutError,
    short_repr,
)
from kvpools_core.values import ModelSpec, Serving, to_dict

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
"""How long a rank waits, in each round of :func:`~kvpools_core.planning.distributed.plan_on_group`,
for the slowest rank."""

RANK_LOCAL_SERVING_FIELDS = ("pp_rank", "platform_traits", "workspaces")
"""``Serving`` fields left out of the fingerprint: ``pp_rank`` follows from each rank's place in the group, and
the platform's traits and workspaces are resolved on each rank by its own platform plugin (the platform's name,
which is compared, decides them).  Budget inputs (memory, free memory, weights, device) are per rank by design."""

RANK_LOCAL_MODEL_FIELDS = ("name", "source")
"""``ModelSpec`` fields left out of the fingerprint: where each node read the config from, and the name taken from
that path; the layers, dtype and parameters that size the pools are compared."""

_MESSAGE_LIMIT = 2000
_calls: dict[str, itertools.count[int]] = {}


def fingerprint_document(model: ModelSpec, serving: Serving, draft: ModelSpec | None) -> dict[str, Any]:
    """The canonical form of what every rank must plan alike: the model, the serving options and the draft model,
    without the rank-local fields (:data:`RANK_LOCAL_SERVING_FIELDS`, :data:`RANK_LOCAL_MODEL_FIELDS`)."""
    serving_doc = {k: v for k, v in to_dict(serving).items() if k not in RANK_LOCAL_SERVING_FIELDS}
    if isinstance(serving_doc.get("speculative_draft"), dict):
        draft_doc = dict(serving_doc["speculative_draft"])
        draft_doc["model"] = _model_document(draft_doc["model"])
        serving_doc["speculative_draft"] = draft_doc
    return {
        "model": _model_document(to_dict(model)),
        "serving": serving_doc,
        "draft_model": None if draft is None else _model_document(to_dict(draft)),
    }


def fingerprint(document: Mapping[str, Any]) -> str:
    """A stable hash of ``document``'s canonical JSON (sorted keys, no whitespace)."""
    return hashlib.sha256(_canonical_json(document).encode()).hexdigest()


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, str, str] | None:
    """The first field where two documents differ, in the documents' own order: ``(path, a's, b's)``, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip("."), _shown(a.get(key, "(absent)")), _shown(b.get(key, "(absent)"))
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{index}]")
            if found:
                return found
        if len(a) != len(b):
            return path.lstrip("."), f"{len(a)} entries", f"{len(b)} entries"
        return None
    if _canonical_json(a) != _canonical_json(b):
        return path.lstrip("."), _shown(a), _shown(b)
    return None


class RankExchange:
    """One call's rounds of status exchange among the ranks of a group, through a ``torch.distributed`` store."""

    def __init__(
        self, store: Any, prefix: str, rank: int, world: int, timeout_s: float, rounds: Mapping[str, str]
    ) -> None:
        self.store, self.prefix, self.rank, self.world, self.timeout_s = store, prefix, rank, world, timeout_s
        self.rounds = dict(rounds)
        """Round name -> what the ranks exchange in it (for messages), in the order they run."""
        self._gave_up = False

    @classmethod
    def on_group(cls, group: Any, timeout_s: float, rounds: Mapping[str, str]) -> RankExchange:
        """The exchange of this call of ``plan_on_group`` on ``group`` (the default group when ``None``)."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "plan_on_group runs on a torch.distributed process group: call "
                "torch.distributed.init_process_group on every rank first."
            )
        rank = dist.get_rank(group)
        if rank < 0:
            raise ConfigError("plan_on_group: this process is not a member of the group it was given.")
        members = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        group_key = hashlib.sha256(",".join(map(str, members)).encode()).hexdigest()[:16]
        # the n-th call on a group meets the n-th call of the other ranks: counted before anything can raise, so
        # a rank refused here (a bad timeout) stays in step with the others for the next call
        call = next(_calls.setdefault(group_key, itertools.count()))
        check_timeout(timeout_s)
        store = dist.distributed_c10d._get_default_store()
        prefix = f"kvpools/plan_on_group/{group_key}/{call}/"
        return cls(store, prefix, rank, dist.get_world_size(group), timeout_s, rounds)

    def round(self, name: str, work: Callable[[], tuple[T, Any]]) -> tuple[T, list[Any]]:
        """Run ``work`` (returning this rank's local result and the JSON value it publishes) and gather every
        rank's value; every rank raises the same :class:`DistributedPlanError` if any rank failed or is missing."""
        try:
            local, public = work()
        except Exception as exc:
            self._publish(name, _failure(exc))
            statuses, missing = self._collect(name)
            raise self._error(name, statuses, missing) from exc
        self._publish(name, {"ok": True, "value": public})
        statuses, missing = self._collect(name)
        if missing or any(not s["ok"] for s in statuses.values()):
            raise self._error(name, statuses, missing)
        return local, [statuses[r]["value"] for r in range(self.world)]

    def share(self, name: str, value: Any) -> None:
        """Store a document beside this rank's status, read only on demand (:meth:`shared`)."""
        self._set(f"{name}/{self.rank}", value)

    def shared(self, name: str, rank: int) -> Any:
        """A document a rank stored with :meth:`share` before publishing the status that is already in."""
        try:
            return json.loads(self.store.get(self.prefix + f"{name}/{rank}"))
        except Exception as exc:
            raise self._store_error(exc) from exc

    def where(self) -> str:
        return f"kvpools plan_on_group, rank {self.rank} of {self.world}"

    # -- helpers ---------------------------------------------------------------

    def _publish(self, name: str, status: dict[str, Any]) -> None:
        if not self._gave_up:
            self._set(f"{name}/status/{self.rank}", status)

    def _set(self, key: str, value: Any) -> None:
        try:
            self.store.set(self.prefix + key, _canonical_json(value))
        except Exception as exc:
            raise self._store_error(exc) from exc

    def _collect(self, name: str) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """Every rank's status of round ``name`` that arrives within the timeout, and the ranks whose did not."""
        keys = [self.prefix + f"{name}/status/{r}" for r in range(self.world)]
        deadline = time.monotonic() + self.timeout_s
        try:
            # at least 10 ms: a store reads a zero timeout as "wait forever"
            while (remaining := deadline - time.monotonic()) > 0.01:
                try:
                    self.store.wait(keys, timedelta(seconds=remaining))
                    break
                except Exception:  # a timeout (RuntimeError or DistStoreError, by store), or a store that is gone
                    self.store.check(keys[:1])  # raises if the store is gone; else which keys are in says who
                    time.sleep(0.05)
            missing = [r for r, key in enumerate(keys) if not self.store.check([key])]
            statuses = {r: json.loads(self.store.get(key)) for r, key in enumerate(keys) if r not in missing}
        except Exception as exc:
            raise self._store_error(exc) from exc
        return statuses, missing

    def _error(self, name: str, statuses: Mapping[int, dict[str, Any]], missing: Sequence[int]) -> DistributedPlanError:
        """The error every rank raises for round ``name``; this rank publishes it for the later rounds too, so a
        rank that arrives late stops at once instead of waiting for ranks that are gone."""
        errors = {r: (s["type"], s["message"]) for r, s in sorted(statuses.items()) if not s["ok"]}
        parts = []
        if missing:
            parts.append(
                f"{describe_ranks(missing)} did not report within {self.timeout_s:g} s while the ranks exchanged "
                f"{self.rounds[name]}: {'it exited, hangs' if len(missing) == 1 else 'they exited, hang'}, or "
                f"never called plan_on_group"
            )
        by_message: dict[tuple[str, str], list[int]] = {}
        for r, reported in errors.items():
            by_message.setdefault(reported, []).append(r)
        for (error_type, message), ranks in by_message.items():
            parts.append(f"{describe_ranks(ranks)} failed: {error_type}: {message}")
        own_failures = [r for r, s in sorted(statuses.items()) if not s["ok"] and not s.get("gave_up")]
        if missing:
            fix = (
                f"Every rank of the group must call plan_on_group; raise timeout= (now {self.timeout_s:g} s) if a "
                f"rank is slow to get there."
            )
        elif own_failures:
            fix = f"Every rank stopped; fix {describe_ranks(own_failures)} and plan again."
        else:  # the others gave up, in an earlier round, on a rank that arrived late (this one, or another)
            fix = (
                f"Every rank stopped; plan again, with a longer timeout= (now {self.timeout_s:g} s) if a rank is slow."
            )
        message = f"{self.where()}: {'; '.join(parts)}. {fix}"
        kind: type[DistributedPlanError] = RankTimeoutError if missing else RankFailedError
        error = kind(message, ranks=sorted({*missing, *errors}), errors=errors)
        later = list(self.rounds)[list(self.rounds).index(name) + 1 :]
        gave_up = {
            "ok": False,
            "gave_up": True,
            "type": kind.__name__,
            "message": f"gave up: {'; '.join(parts)}"[:_MESSAGE_LIMIT],
        }
        for round_name in later:
            try:
                self._publish(round_name, gave_up)
            except DistributedPlanError:
                break  # the store is gone too: the others time out on their own
        self._gave_up = True
        return error

    def _store_error(self, exc: Exception) -> DistributedPlanError:
        return DistributedPlanError(
            f"{self.where()}: the group's key-value store failed ({type(exc).__name__}: {exc}). The rank that hosts "
            f"it (rank 0 under tcp:// or env:// initialisation) may have exited; see its log.",
            ranks=(),
        )


def check_timeout(timeout_s: float) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
        raise ConfigError(f"timeout must be a number of seconds, got {short_repr(timeout_s)}.")
    if timeout_s <= 0:
        raise ConfigError(f"timeout must be positive (seconds to wait for the slowest rank), got {timeout_s!r}.")


def mismatch_error(
    exchange: RankExchange, fingerprints: Sequence[str], document: Callable[[int], Mapping[str, Any]]
) -> RankMismatchError | None:
    """The error every rank raises when ranks plan other inputs than the group's first rank, or None."""
    differ = [r for r, digest in enumerate(fingerprints) if digest != fingerprints[0]]
    if not differ:
        return None
    reference = document(0)
    details = []
    for r in differ:
        found = first_difference(reference, document(r))
        path, ours, theirs = found or ("(the documents hash differently)", "?", "?")
        details.append(f"rank {r} at {path} (rank 0: {ours}, rank {r}: {theirs})")
    verb = "plans" if len(differ) == 1 else "plan"
    return RankMismatchError(
        f"{exchange.where()}: {describe_ranks(differ)} {verb} other inputs than rank 0: {'; '.join(details)}. "
        f"Every rank must plan the same model and serving options; only the budget (memory, free memory, device, "
        f"weights) is per rank.",
        ranks=differ,
    )


def _model_document(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in RANK_LOCAL_MODEL_FIELDS}


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object of {len(value)} fields"
    if isinstance(value, list):
        return f"{len(value)} entries"
    return short_repr(value, 60)


def describe_ranks(ranks: Sequence[int]) -> str:
    """ "rank 2" or "ranks 1, 3"."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _failure(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "type": type(exc).__name__, "message": str(exc)[:_MESSAGE_LIMIT]}
