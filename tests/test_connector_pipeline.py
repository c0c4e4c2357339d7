"""ConnectorPipeline: running pieces in order, editing the pipeline, and its errors."""

from __future__ import annotations

import pickle

import pytest

from lightning_rl.connectors import (
    AddColumnsFromEpisodes,
    ConnectorPiece,
    ConnectorPipeline,
    GeneralAdvantageEstimation,
    piece_name,
)
from lightning_rl.core.metrics import MetricsLogger


class Mark(ConnectorPiece):
    """Appends its tag to shared_data["order"] and to the batch's "trace" list."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, *, rl_module, batch, episodes, shared_data, metrics):
        shared_data.setdefault("order", []).append(self.tag)
        batch.setdefault("trace", []).append(self.tag)
        return batch

    def __repr__(self) -> str:
        return f"Mark({self.tag!r})"


class OtherMark(Mark):
    pass


def double_rewards(rl_module, batch, episodes, shared_data, metrics):
    batch.setdefault("trace", []).append("double_rewards")
    return batch


def run(pipeline: ConnectorPipeline, shared_data: dict | None = None) -> dict:
    return pipeline(
        rl_module=None, batch={}, episodes=[], shared_data={} if shared_data is None else shared_data, metrics=None
    )


def tags(pipeline: ConnectorPipeline) -> list[str]:
    return [getattr(piece, "tag", piece_name(piece)) for piece in pipeline]


def test_pieces_run_in_order_sharing_one_dict_and_passing_the_batch_on():
    shared: dict = {}
    batch = run(ConnectorPipeline([Mark("a"), double_rewards, Mark("b")]), shared)
    assert batch["trace"] == ["a", "double_rewards", "b"]
    assert shared["order"] == ["a", "b"]


def test_a_piece_that_returns_a_new_batch_hands_that_one_to_the_next_piece():
    def replace(rl_module, batch, episodes, shared_data, metrics):
        return {"fresh": ["replace"]}

    assert run(ConnectorPipeline([Mark("a"), replace, Mark("b")])) == {"fresh": ["replace"], "trace": ["b"]}


def test_append_prepend_and_insert_around_a_piece_selected_by_class_or_name():
    pipeline = ConnectorPipeline([Mark("middle")])
    pipeline.append(Mark("last"))
    pipeline.prepend(Mark("first"))
    pipeline.insert_before(Mark, Mark("before-first-mark"))
    pipeline.insert_after("Mark", double_rewards)
    pipeline.insert_after("double_rewards", OtherMark("other"))
    assert tags(pipeline) == ["before-first-mark", "double_rewards", "other", "first", "middle", "last"]
    assert len(pipeline) == 6
    assert pipeline[2].tag == "other"


def test_a_class_selects_its_subclasses_and_a_name_only_that_exact_class():
    pipeline = ConnectorPipeline([OtherMark("sub"), Mark("base")])
    pipeline.insert_before("Mark", Mark("by-name"))
    pipeline.insert_before(Mark, Mark("by-class"))
    assert tags(pipeline) == ["by-class", "sub", "by-name", "base"]


def test_remove_takes_out_every_matching_piece():
    pipeline = ConnectorPipeline([Mark("a"), double_rewards, Mark("b"), OtherMark("c")])
    pipeline.remove("Mark")
    assert tags(pipeline) == ["double_rewards", "c"]
    pipeline.remove(double_rewards.__name__)
    pipeline.remove(Mark)
    assert len(pipeline) == 0
    assert run(pipeline) == {}


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.remove(GeneralAdvantageEstimation),
        lambda p: p.insert_before("GeneralAdvantageEstimation", Mark("x")),
        lambda p: p.insert_after(GeneralAdvantageEstimation, Mark("x")),
    ],
)
def test_editing_around_a_missing_piece_names_it_and_the_pieces_present(edit):
    pipeline = ConnectorPipeline([AddColumnsFromEpisodes(), double_rewards])
    with pytest.raises(ValueError, match=r"GeneralAdvantageEstimation.*\[AddColumnsFromEpisodes, double_rewards\]"):
        edit(pipeline)
    assert len(pipeline) == 2


def test_invalid_pieces_and_selectors_are_refused_with_what_was_expected():
    with pytest.raises(TypeError, match="must be callable"):
        ConnectorPipeline([3])
    with pytest.raises(TypeError, match=r"instance, not the class Mark; e.g. Mark\(\)"):
        ConnectorPipeline().append(Mark)
    with pytest.raises(TypeError, match="by its class or its name"):
        ConnectorPipeline([Mark("a")]).remove(Mark("a"))


def test_a_piece_that_forgets_to_return_the_batch_is_named():
    def forgets(rl_module, batch, episodes, shared_data, metrics):
        batch["x"] = {}

    with pytest.raises(TypeError, match="connector piece forgets returned NoneType"):
        run(ConnectorPipeline([forgets]))


def test_a_pipeline_is_a_piece_and_nests():
    inner = ConnectorPipeline([Mark("inner-1"), Mark("inner-2")])
    outer = ConnectorPipeline([Mark("outer"), inner])
    outer.insert_after(ConnectorPipeline, double_rewards)
    assert run(outer)["trace"] == ["outer", "inner-1", "inner-2", "double_rewards"]
    assert isinstance(inner, ConnectorPiece)


def test_repr_lists_the_pieces_with_their_settings():
    pipeline = ConnectorPipeline([AddColumnsFromEpisodes(module_id="p0"), GeneralAdvantageEstimation(0.99, 0.95)])
    pipeline.append(double_rewards)
    assert repr(pipeline) == (
        "ConnectorPipeline([\n"
        "    AddColumnsFromEpisodes(module_id='p0'),\n"
        "    GeneralAdvantageEstimation(gamma=0.99, gae_lambda=0.95),\n"
        "    double_rewards,\n"
        "])"
    )
    assert repr(ConnectorPipeline()) == "ConnectorPipeline([])"


class HasSettings:
    """Stands in for a Learner: per-module settings from a bound method."""

    def gamma_for(self, module_id: str) -> float:
        return {"a": 0.9}.get(module_id, 0.99)


def test_the_default_pieces_pickle_as_a_learner_group_sends_them():
    pipeline = ConnectorPipeline(
        [AddColumnsFromEpisodes(), GeneralAdvantageEstimation(gamma=HasSettings().gamma_for, gae_lambda={"a": 0.5})]
    )
    copy = pickle.loads(pickle.dumps(pipeline))
    assert repr(copy) == repr(pipeline)
    assert copy[1].gamma.for_module("a") == 0.9


def test_pieces_may_log_to_the_learners_metrics():
    def count_rows(rl_module, batch, episodes, shared_data, metrics):
        metrics.log_value("rows", 7.0, reduce="sum")
        return batch

    metrics = MetricsLogger()
    ConnectorPipeline([count_rows])(rl_module=None, batch={}, episodes=[], shared_data={}, metrics=metrics)
    assert metrics.reduce() == {"rows": 7.0}
