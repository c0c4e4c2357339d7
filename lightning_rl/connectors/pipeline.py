"""The Learner connector pipeline: small pieces that build a train batch from episodes.

A *piece* is any callable with the keyword arguments

    piece(rl_module=..., batch=..., episodes=..., shared_data=..., metrics=...) -> batch

It receives the batch built so far (``{module_id: {column: Tensor}}``), adds or changes
columns, and returns it. :class:`ConnectorPiece` is the base class to write one with
arguments; a plain function with those parameter names works too. A
:class:`ConnectorPipeline` runs its pieces in order and is a piece itself, so pipelines
nest. This is RLlib's ConnectorV2 idea for the Learner side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

from torch import Tensor

if TYPE_CHECKING:
    from lightning_rl.core.metrics import MetricsLogger
    from lightning_rl.core.rl_modules import MultiRLModule

TrainBatch = dict[str, dict[str, Tensor]]
"""A train batch: ``{module_id: {column: Tensor[rows, ...]}}``."""


class ConnectorPiece(ABC):
    """One step of a Learner connector: reads episodes, adds columns to the batch.

    Subclass it, take the piece's settings in ``__init__`` and implement ``__call__``.
    Give the subclass a ``__repr__`` showing its settings; the pipeline's repr lists it.
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abstractmethod
    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any],
        metrics: MetricsLogger,
    ) -> TrainBatch:
        """Called once per update, over all of the update's episodes, in pipeline order.

        Args:
            rl_module: The Learner's modules with their current weights (read values or
                logits here; the pipeline runs outside the gradient step).
            batch: The batch the pieces before this one built; change it in place or build
                a new one, and return it. Add a column to every row of a module, or to none:
                the Learner slices all columns of a module together into minibatches.
            episodes: The update's episodes, in the order they were sampled.
            shared_data: A dict the pieces of this one call share (e.g. which episodes
                became which module's rows); empty at the start of each call.
            metrics: The Learner's ``MetricsLogger``; values logged here appear in the
                update's results.

        Returns:
            The batch for the next piece.
        """


Piece = Union[ConnectorPiece, Callable[..., TrainBatch]]
"""A ``ConnectorPiece`` or a plain function with the same keyword parameters."""

PieceSelector = Union[type, str]
"""Which piece an editing call means: a class (its instances match) or a name (a class
name, or a function's ``__name__``)."""


class ConnectorPipeline(ConnectorPiece):
    """Runs pieces one after the other, each getting the batch the previous one returned.

    Args:
        pieces: The pieces, in the order they run.

    Raises:
        TypeError: If a piece is not callable.

    Example::

        pipeline = ConnectorPipeline([AddColumnsFromEpisodes(), GeneralAdvantageEstimation(0.99, 0.95)])
        pipeline.insert_after(AddColumnsFromEpisodes, my_reward_scaling)
        batch = pipeline(rl_module=module, batch={}, episodes=episodes, shared_data={}, metrics=metrics)
    """

    def __init__(self, pieces: Iterable[Piece] = ()) -> None:
        self._pieces: list[Piece] = [_checked_piece(piece) for piece in pieces]

    def __call__(
        self,
        *,
        rl_module: MultiRLModule,
        batch: TrainBatch,
        episodes: Sequence[Any],
        shared_data: dict[str, Any] | None = None,
        metrics: MetricsLogger | None = None,
        **kwargs: Any,
    ) -> TrainBatch:
        """Run every piece in order (see :meth:`ConnectorPiece.__call__` for the arguments).

        As RLlib's pipeline, ``shared_data`` and ``metrics`` may be left out (a new dict, and a
        new ``MetricsLogger`` whose values are dropped), and other keywords (``explore``) are
        accepted and not passed on.

        Raises:
            TypeError: If a piece returns something other than a dict (a piece that changes
                the batch in place must still return it).
        """
        if shared_data is None:
            shared_data = {}
        if metrics is None:
            from lightning_rl.core.metrics import MetricsLogger

            metrics = MetricsLogger()
        for piece in self._pieces:
            batch = piece(rl_module=rl_module, batch=batch, episodes=episodes, shared_data=shared_data, metrics=metrics)
            if not isinstance(batch, dict):
                raise TypeError(
                    f"connector piece {piece_name(piece)} returned {type(batch).__name__}; a piece must return "
                    "the batch {module_id: {column: Tensor}} (also when it changed it in place)"
                )
        return batch

    def append(self, piece: Piece) -> None:
        """Add ``piece`` at the end: it sees every column the other pieces added."""
        self._pieces.append(_checked_piece(piece))

    def prepend(self, piece: Piece) -> None:
        """Add ``piece`` at the start: it runs before any column exists."""
        self._pieces.insert(0, _checked_piece(piece))

    def insert_before(self, selector: PieceSelector, piece: Piece) -> None:
        """Add ``piece`` just before the first piece ``selector`` matches.

        Raises:
            ValueError: If no piece matches ``selector`` (the message lists the pieces).
        """
        self._pieces.insert(self._first_index(selector), _checked_piece(piece))

    def insert_after(self, selector: PieceSelector, piece: Piece) -> None:
        """Add ``piece`` just after the first piece ``selector`` matches.

        Raises:
            ValueError: If no piece matches ``selector`` (the message lists the pieces).
        """
        self._pieces.insert(self._first_index(selector) + 1, _checked_piece(piece))

    def remove(self, selector: PieceSelector) -> None:
        """Remove every piece ``selector`` matches.

        Raises:
            ValueError: If no piece matches ``selector`` (the message lists the pieces).
        """
        kept = [piece for piece in self._pieces if not _matches(piece, selector)]
        if len(kept) == len(self._pieces):
            raise ValueError(self._not_found_message(selector))
        self._pieces = kept

    def __iter__(self) -> Iterator[Piece]:
        return iter(list(self._pieces))

    def __len__(self) -> int:
        return len(self._pieces)

    def __getitem__(self, index: int) -> Piece:
        return self._pieces[index]

    def __repr__(self) -> str:
        if not self._pieces:
            return "ConnectorPipeline([])"
        lines = "".join(f"    {_piece_repr(piece)},\n" for piece in self._pieces)
        return f"ConnectorPipeline([\n{lines}])"

    def _first_index(self, selector: PieceSelector) -> int:
        for index, piece in enumerate(self._pieces):
            if _matches(piece, selector):
                return index
        raise ValueError(self._not_found_message(selector))

    def _not_found_message(self, selector: PieceSelector) -> str:
        wanted = f"class {selector.__name__}" if isinstance(selector, type) else f"name {selector!r}"
        present = ", ".join(piece_name(piece) for piece in self._pieces) or "no pieces"
        return f"no connector piece of {wanted} in this pipeline; it has: [{present}]"


def piece_name(piece: Piece) -> str:
    """A piece's name: a function's ``__name__``, else the class name of the piece."""
    return getattr(piece, "__name__", type(piece).__name__)


def _matches(piece: Piece, selector: PieceSelector) -> bool:
    if isinstance(selector, type):
        return isinstance(piece, selector)
    if isinstance(selector, str):
        return piece_name(piece) == selector
    raise TypeError(
        f"select a connector piece by its class or its name (a str), got {type(selector).__name__} {selector!r}"
    )


def _checked_piece(piece: Any) -> Piece:
    if isinstance(piece, type):
        raise TypeError(f"pass a connector piece instance, not the class {piece.__name__}; e.g. {piece.__name__}()")
    if not callable(piece):
        raise TypeError(
            "a connector piece must be callable as piece(rl_module=..., batch=..., episodes=..., shared_data=..., "
            f"metrics=...), got {type(piece).__name__} {piece!r}"
        )
    return piece


def _piece_repr(piece: Piece) -> str:
    # Functions' default repr carries a memory address; their name says enough.
    return piece_name(piece) if hasattr(piece, "__name__") else repr(piece).replace("\n", "\n    ")
