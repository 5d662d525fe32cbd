"""What a scheduler sink that can read its nodes back offers: a normalised view of a node.

Slurm, Kubernetes and other schedulers spell node states differently; the outbox
and the reconciler only need to know whether a node accepts work, who took it
out of service, and whether that matches what rackguard intends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from adapters.base import SchedulerSink
from policies.model import Action, Decision
from policies.safety import reason_excludes, reason_is_ours

ExcludeState = Literal["drain", "down"]
# What an exclusion sets, the one default of every sink and of the config
# ([scheduler] exclude_state): "drain" (Slurm DRAIN, Kubernetes NoSchedule; the
# job notices tell the running work, then requeue or evict it after the grace);
# "down" (Slurm DOWN, Kubernetes NoExecute) ends it at once.
EXCLUDE_STATE_DEFAULT: ExcludeState = "drain"


@dataclass(frozen=True, slots=True)
class NodeView:
    """The scheduler's view of one node, reduced to what rackguard acts on."""

    node: str
    exists: bool = True
    drained: bool = False  # accepts no new work (Slurm DRAIN, Kubernetes NoSchedule)
    down: bool = False  # taken out now (Slurm DOWN, Kubernetes NoExecute)
    reason: str = ""  # why, as the scheduler records it
    detail: str = ""  # the scheduler's own words, e.g. "IDLE+DRAIN", for logs
    unsettled: str = ""  # work still to do for the current state (e.g. pods to evict)

    @property
    def held(self) -> bool:
        """Out of service, by anyone."""
        return self.drained or self.down

    @property
    def ours(self) -> bool:
        """The hold (if any) carries rackguard's reason (``rackguard:``, ``rackguard[domain]:``)."""
        return reason_is_ours(self.reason)

    @property
    def foreign(self) -> bool:
        """Held by someone else or for another reason: rackguard must not touch it."""
        return self.held and not self.ours

    def satisfies(self, action: Action, *, exclude_down: bool = True) -> bool:
        """True when the node already is where ``action`` would put it.

        ``exclude_down=False``: the sink carries out an exclusion as a drain
        (Slurm's ``exclude_state = "drain"``), so a drained node satisfies it;
        and a drain whose reason marks an exclusion does not satisfy a drain
        (the reason is rewritten, so other agents no longer read it as critical).
        """
        if not self.exists:
            return False
        if action is Action.RESUME:
            return not self.held
        if self.foreign or self.unsettled:
            return False
        if action is Action.DRAIN and not exclude_down and reason_excludes(self.reason):
            return False
        if action is Action.DRAIN or not exclude_down:
            return self.drained or (action is Action.EXCLUDE and self.down)
        return self.down


class NodeReadError(Exception):
    """The scheduler's view of the nodes could not be read (transient unless ``permanent``)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@runtime_checkable
class ReadableSink(SchedulerSink, Protocol):
    """A sink that can also read the scheduler's view of nodes: for read-back and reconciling."""

    async def read_state(self, nodes: Sequence[str]) -> dict[str, NodeView]:
        """The view of each named node; a node the scheduler does not know has exists=False.

        Raises NodeReadError when the scheduler cannot be read.
        """


def describe(view: NodeView) -> str:
    """A short human description for logs: ``drained (rackguard: hot) [IDLE+DRAIN]``."""
    if not view.exists:
        return "unknown to the scheduler"
    state = "down" if view.down else "drained" if view.drained else "in service"
    reason = f" ({view.reason})" if view.held and view.reason else ""
    detail = f" [{view.detail}]" if view.detail else ""
    return f"{state}{reason}{detail}"


def exclude_down(sink: object) -> bool:
    """Whether ``sink`` sets an excluded node down (the default) or drains it."""
    return bool(getattr(sink, "exclude_down", True))


def intended(decision: Decision, *, exclude_down: bool = True) -> str:
    """The state a decision asks for, in the words describe() uses."""
    if decision.action is Action.EXCLUDE and not exclude_down:
        return "drained"
    return {Action.DRAIN: "drained", Action.EXCLUDE: "down", Action.RESUME: "in service"}[
        decision.action
    ]
