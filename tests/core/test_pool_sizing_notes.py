"""``PoolSizing.with_notes``: the value ``attrs.evolve(sizing, notes=...)`` makes, without re-validating (issue 37)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core import Serving, plan
from kvpools_core.errors import InvalidValueError
from kvpools_core.values import PoolSizing, PoolSpec
from kvpools_core.values._fields import _str_tuple

PRESETS = ("deepseek-v4-flash", "llama-3.1-8b", "gemma-3-12b-it", "qwen3-next-80b-a3b-thinking")


@pytest.fixture(scope="module")
def sizings() -> list[PoolSizing]:
    return [plan(name, Serving(), memory="40GiB").sizing for name in PRESETS]


def test_no_validator_reads_the_notes() -> None:
    """``with_notes`` runs the notes' converter alone: were a validator added to ``notes``, or were the notes
    read by another field's validator, it would have to run there too (this test is the reminder)."""
    field = attrs.fields(PoolSizing).notes
    assert field.validator is None
    assert field.converter is _str_tuple
    # every other validator is of a field the notes do not feed: a sizing whose notes are anything at all
    # validates exactly as one without notes
    pool = PoolSpec(name="kv", kind="kv", slots=4, bytes_per_slot=2, bytes=8)
    assert PoolSizing(max_total_num_tokens=4, max_running_requests=1, pools=[pool], notes=["x"]).notes == ("x",)


@given(notes=st.lists(st.text(max_size=20), max_size=5))
@settings(max_examples=30)
def test_with_notes_is_evolve(sizings: list[PoolSizing], notes: list[str]) -> None:
    for sizing in sizings:
        before = attrs.asdict(sizing, recurse=False)
        new = sizing.with_notes(notes)
        assert new == attrs.evolve(sizing, notes=notes)
        assert type(new) is PoolSizing and new.notes == tuple(notes)
        assert attrs.asdict(sizing, recurse=False) == before  # the sizing itself is unchanged
        for field in attrs.fields(PoolSizing):
            if field.name != "notes":
                assert getattr(new, field.name) is getattr(sizing, field.name)


def test_with_notes_takes_any_iterable_of_notes(sizings: list[PoolSizing]) -> None:
    sizing = sizings[0]
    assert sizing.with_notes(iter(["a", "b"])).notes == ("a", "b")
    assert sizing.with_notes(n for n in ("c",)).notes == ("c",)


def test_a_bad_sizing_is_still_refused_where_it_is_built() -> None:
    """The validation ``with_notes`` skips is the one that already ran: a sizing a plugin builds with a bad field
    is refused when it is built (the registry then names the plugin)."""
    with pytest.raises(InvalidValueError, match="max_total_num_tokens"):
        PoolSizing(max_total_num_tokens=-1, max_running_requests=1, pools=[])
    with pytest.raises(InvalidValueError, match="token_counts"):
        PoolSizing(max_total_num_tokens=4, max_running_requests=1, pools=[], token_counts={"full": -4})


def test_the_pipeline_adds_the_engine_default_notes_through_it() -> None:
    """DeepSeek-V4's engine defaults (page 256, SWA ratio 0.1) are notes the pipeline puts first."""
    sizing = plan("deepseek-v4-flash", Serving(), memory="40GiB").sizing
    assert sizing.notes[0].startswith("page_size 256: SGLang 0.5.23's default for DeepSeek-V4")
    assert sizing.notes[1].startswith("swa_full_tokens_ratio 0.1:")


def test_a_subclass_keeps_its_own_fields(sizings: list[PoolSizing]) -> None:
    """A value built on ``PoolSizing`` with a field of its own keeps it (and its class) through ``with_notes``."""

    @attrs.frozen(kw_only=True)
    class Tagged(PoolSizing):
        tag: str = "t"

    sizing = sizings[0]
    fields = {field.name: getattr(sizing, field.name) for field in attrs.fields(PoolSizing)}
    tagged = Tagged(**fields, tag="mine")
    new = tagged.with_notes(["n"])
    assert type(new) is Tagged and new.tag == "mine" and new.notes == ("n",)
    assert new == attrs.evolve(tagged, notes=["n"])
