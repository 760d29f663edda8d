"""A lost peer, told apart from other errors and named on one line.

A collective that fails because a peer stopped answering (its link is cut, its
host is gone) raises whatever the backend raises, often over several lines and
with the backend's source location. :func:`comm_failure` recognises those
errors and :class:`PeerLostError` names the step, the peers and their hosts
instead. See ``docs/recovery.md`` (losing a link or a host).
"""

from __future__ import annotations

import re

__all__ = ["PeerLostError", "comm_failure"]

# what gloo and NCCL say when a peer stops answering or goes away (not a bug of ours)
_LOST = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|unreachable|"
    r"no route to host|peer .*(closed|gone|unreachable)",
    re.IGNORECASE,
)


def comm_failure(exc: BaseException) -> str | None:
    """The backend's reason, on one line and without its source location, if ``exc`` is a lost peer.

    Returns:
        ``None`` for any other error.
    """
    if not isinstance(exc, RuntimeError) or not _LOST.search(str(exc)):
        return None
    # gloo prefixes "[/path/to/unbound_buffer.cc:78] " and may add advice after the first sentence
    text = re.sub(r"^\[[^\]]*:\d+\]\s*", "", " ".join(str(exc).split()))
    return re.split(r"\.\s", text, maxsplit=1)[0]


class PeerLostError(RuntimeError):
    """A collective failed because peers stopped answering: their link or their host is gone.

    Args:
        step: The step that failed.
        peers: The other ranks of the group whose collective failed.
        reason: The backend's reason (:func:`comm_failure`).
        hosts: Each rank's host, to name the peers' hosts (``None``: ranks only).
        rank: This rank; with ``hosts``, only the peers on other hosts are named
            (a link's loss cannot cut a host off from itself).
    """

    def __init__(
        self,
        step: int,
        peers: list[int],
        reason: str,
        hosts: list[str] | None = None,
        rank: int | None = None,
    ) -> None:
        self.step, self.peers, self.reason = step, peers, reason
        named = peers
        if hosts is not None and rank is not None:
            named = [r for r in peers if hosts[r] != hosts[rank]] or peers
        text = f"rank(s) {', '.join(map(str, named))}"
        if hosts is not None:
            text += f" on {', '.join(sorted({hosts[r] for r in named}))}"
        super().__init__(
            f"lost contact with {text} at step {step} ({reason}); restart the job "
            "(or let torchrun --max-restarts do it) to resume from its newest checkpoint"
        )

    def on_hosts(self, hosts: list[str], rank: int) -> PeerLostError:
        """The same error, naming the peers on other hosts than ``rank``'s, and those hosts."""
        return PeerLostError(self.step, self.peers, self.reason, hosts, rank)
