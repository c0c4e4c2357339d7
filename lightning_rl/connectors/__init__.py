"""Learner connector pieces: episodes in, a train batch ``{module_id: {column: Tensor}}`` out.

A :class:`ConnectorPipeline` runs small pieces in order; the default one holds
:class:`AddColumnsFromEpisodes`, PPO adds :class:`GeneralAdvantageEstimation` after it (IMPALA
and APPO :class:`AddNextValues`), and a Learner with stateful (recurrent) modules ends it with
:class:`AddTimeDimToBatchAndZeroPad`.
"""

from lightning_rl.connectors.add_columns import MODULE_EPISODES, AddColumnsFromEpisodes
from lightning_rl.connectors.bootstrap_values import AddNextValues
from lightning_rl.connectors.connector_v2 import ConnectorV2
from lightning_rl.connectors.episode_columns import AddNextObservationsFromEpisodesToTrainBatch, ComputeReturnsToGo
from lightning_rl.connectors.gae import GeneralAdvantageEstimation
from lightning_rl.connectors.pipeline import (
    ConnectorPiece,
    ConnectorPipeline,
    Piece,
    PieceSelector,
    TrainBatch,
    piece_name,
)
from lightning_rl.connectors.time_axis import AddTimeDimToBatchAndZeroPad

__all__ = [
    "MODULE_EPISODES",
    "AddColumnsFromEpisodes",
    "AddNextObservationsFromEpisodesToTrainBatch",
    "AddNextValues",
    "AddTimeDimToBatchAndZeroPad",
    "ComputeReturnsToGo",
    "ConnectorPiece",
    "ConnectorPipeline",
    "ConnectorV2",
    "GeneralAdvantageEstimation",
    "Piece",
    "PieceSelector",
    "TrainBatch",
    "piece_name",
]
