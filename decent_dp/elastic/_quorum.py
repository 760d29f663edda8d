"""Membership of elastic gossip, on torchft's lighthouse, ``Manager`` and checkpoint transport.

torchft serves membership as it is: its lighthouse tracks heartbeats and forms
a quorum of replica groups, its ``Manager`` asks for one and reconfigures a
gloo process group spanning the quorum, and its ``HTTPTransport`` copies a
state from one replica to another. What it does not give gossip, this module
adds, thinly:

* **The member list of each quorum.** The ``Manager`` keeps the quorum's
  result to itself; the process group's ``configure`` (subclassed here) sees
  the quorum id, the store and this replica's rank, and each member publishes
  its replica id, step and checkpoint address on the quorum's store, under a
  prefix per quorum call, so that every member reads the same list.
* **Healing from a peer the gossip chooses.** torchft's own healing picks the
  source itself (round-robin among the replicas at the highest step), which
  need not be a neighbour; quorums are therefore asked with
  ``allow_heal=False`` and :mod:`decent_dp.elastic` chooses the source, which
  stages its state on its ``HTTPTransport`` for the joiner to fetch and
  withdraws it once the joiner says it has it (:meth:`Membership.heal`); a
  transfer that breaks is a failed heal (:class:`HealFailed`), asked again.
* **Gossip's own process group.** ``Manager.allreduce`` and torchft's DDP,
  LocalSGD and DiLoCo average over the whole quorum; the elastic wrapper makes
  a gloo group of every process of the quorum on the quorum's store instead
  (:meth:`Membership.world_store`), and the topology's groups within it.
* **Replica groups of several processes** (one torchrun per host, as torchft
  launches them): each process has its own ``Manager`` of the group's rank, the
  group asks the lighthouse once, the quorum's gloo group spans one group rank
  of every member, each process publishes its own checkpoint address, and
  :meth:`Membership.world_store` gives the store of a flat group of every process.

torchft is imported when a :class:`Membership` is built, never by ``import
decent_dp``. The module is one unit past 500 lines: every part of it works on
the same torchft objects of one membership (its ``Manager``, the quorum's group
and store, the transport), which no other module touches.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

__all__ = [
    "QUORUM_TIMEOUTS",
    "HealFailed",
    "Membership",
    "QuorumView",
    "check_lighthouse",
    "default_advertise_host",
]

# how many timeout_s a quorum may take: start the lighthouse with
# timeout_s < --join_timeout_ms < (QUORUM_TIMEOUTS - 1) * timeout_s
QUORUM_TIMEOUTS = 3


class _MemberGone(RuntimeError):
    """A member of the quorum just formed did not take part in it (it died meanwhile)."""


class HealFailed(RuntimeError):
    """A heal's state was not received whole (its source died, or the stream broke)."""


@dataclass(frozen=True)
class QuorumView:
    """One quorum as every member sees it.

    Attributes:
        quorum_id: torchft's quorum id (new on every change of membership).
        rank: This replica's rank, its index in ``members``.
        members: The members' replica ids, in rank order (torchft sorts them as strings).
        steps: Each member's step count when it asked for the quorum (its group rank 0's).
        addresses: Each member's checkpoint address (``HTTPTransport``) of its group rank 0.
        group_rank: This process's rank in its replica group.
        group_world_size: The processes of each replica group.
        process_addresses: The checkpoint address of every member's every group
            rank, member-major (``process_addresses[rank][group_rank]``).
    """

    quorum_id: int
    rank: int
    members: tuple[str, ...]
    steps: tuple[int, ...]
    addresses: tuple[str, ...]
    group_rank: int = 0
    group_world_size: int = 1
    process_addresses: tuple[tuple[str, ...], ...] = ()

    @property
    def world_size(self) -> int:
        """The number of members."""
        return len(self.members)

    def address(self, member: int, group_rank: int) -> str:
        """The checkpoint address of group rank ``group_rank`` of member ``member``.

        A joiner's group rank g heals from its source's group rank g: each
        process holds its own state.
        """
        if group_rank == 0 and not self.process_addresses:
            return self.addresses[member]
        return self.process_addresses[member][group_rank]


def _split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``http://host:port``, ``host:port`` or ``[v6]:port``."""
    text = address if "://" in address else f"tcp://{address}"
    parsed = urllib.parse.urlsplit(text)
    if parsed.hostname is None or parsed.port is None:
        raise ValueError(
            f"lighthouse={address!r} is invalid; give it as http://HOST:PORT (e.g. http://10.0.0.1:29510)"
        )
    return parsed.hostname, parsed.port


def check_lighthouse(address: str, timeout_s: float) -> None:
    """Raise one line if nothing answers at the lighthouse's address within ``timeout_s``.

    Raises:
        ValueError: The address is not ``http://HOST:PORT``.
        TimeoutError: No connection within the timeout.
    """
    host, port = _split_address(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, timeout_s))):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"lighthouse={address!r} cannot be reached within timeout_s={timeout_s:g} "
                    f"({exc.strerror or exc}); start it with `torchft_lighthouse --min_replicas N "
                    "--bind [::]:29510` (or `make lighthouse`)"
                ) from None
            time.sleep(0.2)


def default_advertise_host(lighthouse: str) -> str:
    """The address of this host's interface towards the lighthouse (what peers can reach).

    Hosts may share a hostname (network namespaces, containers), so the name is
    no address to advertise; the source address of a route to the lighthouse is.
    """
    host, port = _split_address(lighthouse)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return str(s.getsockname()[0])


class Membership:
    """This replica's membership of the quorum: a torchft ``Manager``, its gloo group, a transport.

    Each process of a replica group (one host's torchrun) builds one, with the
    group's ``replica_id`` and its own ``group_rank``; group rank 0 makes the
    group's store and runs the ``Manager``'s server, which asks the lighthouse
    once for the whole group, so that every process gets the same quorum. The
    group's store, the ``Manager``'s server and the checkpoint servers advertise
    ``host``, the address peers reach this host at. The exchanges, the
    all-reduce, the store keys and the checkpoints work per group rank: the
    quorum's gloo group spans the same group rank of every member.

    Args:
        lighthouse: The lighthouse's address, ``http://HOST:PORT``.
        replica_id: This replica's id, unique among the live replicas.
        min_replicas: The fewest replicas a quorum may have.
        timeout_s: Seconds for the lighthouse to answer and for a peer's exchange,
            collective or checkpoint before it counts as lost; a quorum may take
            ``QUORUM_TIMEOUTS`` (3) times as long.
        host: The address to advertise; by default the interface towards the lighthouse.
        log: Where progress lines go (``print`` to stderr by default).
        group_rank: This process's rank in its replica group.
        group_world_size: The processes of the replica group (the same on every host).
        group_store: ``(host, port)`` of the replica group's rendezvous store, where
            group rank 0 publishes the port of its store for the others; by default
            (with ``group_world_size > 1``) torchrun's ``MASTER_ADDR``/``MASTER_PORT``.

    Raises:
        ValueError: A bad ``group_rank`` or ``group_world_size``, or no rendezvous store.
    """

    # how many Memberships this process built per replica id: part of the key under which group
    # rank 0 publishes its store's port (every process of a group builds them alike)
    _built: ClassVar[dict[str, int]] = {}

    def __init__(
        self,
        lighthouse: str,
        replica_id: str,
        min_replicas: int,
        timeout_s: float,
        host: str | None = None,
        log: Callable[[str], None] | None = None,
        group_rank: int = 0,
        group_world_size: int = 1,
        group_store: tuple[str, int] | None = None,
    ) -> None:
        if group_world_size < 1:
            raise ValueError(f"group_world_size={group_world_size} is invalid; it must be >= 1")
        if not 0 <= group_rank < group_world_size:
            raise ValueError(
                f"group_rank={group_rank} is invalid; it must be in "
                f"[0, group_world_size={group_world_size})"
            )
        if group_world_size > 1 and group_store is None:
            if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
                raise ValueError(
                    f"group_store=None with group_world_size={group_world_size} needs "
                    "MASTER_ADDR and MASTER_PORT (launch with torchrun) or group_store=(host, port)"
                )
            group_store = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        check_lighthouse(lighthouse, timeout_s)
        from torch.distributed import TCPStore
        from torchft import Manager
        from torchft.checkpointing.http_transport import HTTPTransport
        from torchft.process_group import ProcessGroupGloo, create_store_client

        self._create_store_client = create_store_client
        self.lighthouse = lighthouse
        self.replica_id = replica_id
        self.min_replicas = min_replicas
        self.timeout = timedelta(seconds=timeout_s)
        # a quorum may wait for the lighthouse's join timeout, which must exceed timeout_s (a
        # survivor stuck for timeout_s in the work of the quorum before is then waited for)
        self.quorum_timeout = timedelta(seconds=QUORUM_TIMEOUTS * timeout_s)
        self.host = host or default_advertise_host(lighthouse)
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        seen: dict[str, Any] = {}
        self._seen = seen

        class _QuorumGloo(ProcessGroupGloo):
            """torchft's gloo group, noting each quorum it is configured for."""

            def configure(
                self, store_addr: str, replica_id: str, rank: int, world_size: int, *args: Any
            ) -> None:
                quorum_id = args[0] if args else None
                seen.update(store=store_addr, rank=rank, world=world_size, quorum_id=quorum_id)
                super().configure(store_addr, replica_id, rank, world_size, *args)

        store_host, store_port = self._group_store(TCPStore, group_store)
        self.pg = _QuorumGloo(timeout=self.timeout)
        self.transport = HTTPTransport(timeout=self.timeout, num_chunks=0)
        self.manager = Manager(
            pg=self.pg,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=min_replicas,
            use_async_quorum=False,
            timeout=self.timeout,
            quorum_timeout=self.quorum_timeout,
            connect_timeout=self.timeout,
            # group rank 0's server advertises this store as the quorum's: it must be `host`
            store_addr=store_host,
            store_port=store_port,
            rank=group_rank,
            world_size=group_world_size,
            lighthouse_addr=lighthouse,
            replica_id=replica_id,
            hostname=self.host,
            checkpoint_transport=self.transport,
            init_sync=False,
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decent-dp-quorum")
        self._calls: dict[int, int] = {}  # quorum id -> quorum calls made under it
        self._stores: dict[int, Any] = {}
        self._addresses: dict[int, str] = {}  # quorum id -> its store's address, see below
        self._lock = threading.Lock()
        self.view: QuorumView | None = None
        self._progress_every = min(10.0, max(1.0, timeout_s / 4))

    def _group_store(self, tcp_store: Any, rendezvous: tuple[str, int] | None) -> tuple[str, int]:
        """``(host, port)`` of the replica group's store; group rank 0 makes it.

        Not torchrun's store itself: torchft advertises the group's store to the
        other hosts as the quorum's, and torchrun's is often on loopback
        (``--standalone``) and outlives a restart of the workers; so group rank 0
        makes its own on ``host`` (as with one process) and publishes its port on
        the rendezvous store, under a key per restart and per Membership built.
        """
        made = self._built.get(self.replica_id, 0)
        self._built[self.replica_id] = made + 1
        self._store: Any = None
        if self.group_rank == 0:
            self._store = tcp_store(self.host, 0, is_master=True, wait_for_workers=False)
        self._group_client: Any = self._store  # every process's client of the group's store
        if rendezvous is None:  # one process per group: nobody to tell
            return self.host, int(self._store.port)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        key = f"decent_dp/group_store/{self.replica_id}/{restart}/{made}"
        rdzv = tcp_store(
            rendezvous[0],
            rendezvous[1],
            is_master=False,
            wait_for_workers=False,
            timeout=self.timeout,
        )
        if self.group_rank == 0:
            rdzv.set(key, f"{self.host} {self._store.port}")
            return self.host, int(self._store.port)
        try:
            host, port = bytes(rdzv.get(key)).decode().split()
        except RuntimeError:  # torch's DistStoreError: group rank 0 never came
            raise TimeoutError(
                f"group rank 0 of replica_id={self.replica_id!r} published no store at "
                f"{rendezvous[0]}:{rendezvous[1]} within timeout_s={self.timeout.total_seconds():g}"
            ) from None
        self._group_client = tcp_store(
            host, int(port), is_master=False, wait_for_workers=False, timeout=self.timeout
        )
        return host, int(port)

    # ----------------------------------------------------------------- quorum
    def _checkpoint_address(self) -> str:
        # the transport advertises socket.gethostname(), which hosts may share
        parts = urllib.parse.urlsplit(self.transport.metadata())
        host = f"[{self.host}]" if ":" in self.host else self.host
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{parts.port}"))

    def _wait_quorum(self, step: int, start: float) -> None:
        """``Manager.start_quorum``, with a progress line while it waits."""
        self.manager.load_state_dict({"step": step, "batches_committed": 0})
        left = self.quorum_timeout.total_seconds() - (time.monotonic() - start)
        future = self._pool.submit(
            self.manager.start_quorum, allow_heal=False, timeout=timedelta(seconds=max(left, 0.1))
        )
        # torchft's own timeout is not always kept (a lighthouse with no other replica
        # left kept a restarted host waiting for minutes): the deadline is kept here too
        deadline = start + self.quorum_timeout.total_seconds() + self._progress_every
        while True:
            try:
                future.result(
                    timeout=max(0.1, min(self._progress_every, deadline - time.monotonic()))
                )
                return
            except FutureTimeout:
                if time.monotonic() >= deadline:
                    raise self._no_quorum("no other replica came") from None
                self._progress(start)
            except Exception as exc:
                raise self._no_quorum(type(exc).__name__) from None

    def _progress(self, start: float, members: int | None = None) -> None:
        have = f", {members} so far" if members is not None else ""
        self.log(
            f"[decent_dp.elastic] {self.replica_id}: waiting for a quorum of "
            f"min_replicas={self.min_replicas}{have} at {self.lighthouse} "
            f"({time.monotonic() - start:.0f} s of {self.quorum_timeout.total_seconds():g} s)"
        )

    def _no_quorum(self, why: str) -> TimeoutError:
        return TimeoutError(
            f"no quorum of min_replicas={self.min_replicas} formed at {self.lighthouse} within "
            f"{self.quorum_timeout.total_seconds():g} s ({why}); fewer replicas came: start "
            "more hosts or lower min_replicas"
        )

    def quorum(self, step: int) -> QuorumView:
        """Ask for a quorum of at least ``min_replicas`` at ``step`` and read its members.

        The lighthouse's own ``--min_replicas`` may be lower: a quorum with
        fewer members is asked again (its members all wait here alike) until
        enough replicas joined or the timeout passed.

        Raises:
            TimeoutError: No quorum of ``min_replicas`` within the timeout.
            ValueError: This replica's id is used by another member too.
        """
        self.withdraw_state()  # a heal of an earlier quorum that failed half-way
        start = time.monotonic()
        last = start
        gone = 0
        while True:
            try:
                view = self._one_quorum(step, start)
            except _MemberGone as exc:
                # a member died between joining the quorum and taking part in it: the
                # lighthouse drops it once its heartbeats stop, and a new quorum forms
                gone += 1
                if gone > 3:
                    raise RuntimeError(
                        f"quorum at step {step} failed {gone} times in a row ({exc})"
                    ) from None
                self.log(f"[decent_dp.elastic] {self.replica_id}: {exc}; asking again")
                start = last = time.monotonic()
                continue
            if view.world_size >= self.min_replicas:
                return view
            if time.monotonic() - start > self.quorum_timeout.total_seconds():
                raise self._no_quorum(f"{view.world_size} came")
            if time.monotonic() - last >= self._progress_every:
                self._progress(start, view.world_size)
                last = time.monotonic()
            time.sleep(0.2)

    def _one_quorum(self, step: int, start: float) -> QuorumView:
        self._wait_quorum(step, start)
        if self.manager.errored() is not None:
            raise _MemberGone(f"the quorum's group failed ({self.manager.errored()})")
        qid = int(self._seen["quorum_id"])
        rank, world = int(self._seen["rank"]), int(self._seen["world"])
        count = self._calls.get(qid, 0)
        self._calls[qid] = count + 1
        try:
            store = self._quorum_store(qid)
        except RuntimeError as exc:  # torch's DistNetworkError: the store's host died meanwhile
            why = (str(exc).splitlines() or [""])[0][:160]
            raise _MemberGone(f"quorum {qid}'s store cannot be reached ({why})") from None
        prefix = f"c{count}"
        mine = {
            "id": self.replica_id,
            "step": step,
            "addr": self._checkpoint_address(),
            "groups": self.group_world_size,
        }
        store.set(f"{prefix}/member/{rank}/{self.group_rank}", json.dumps(mine))
        # members and steps from each member's group rank 0 (the same in every process), first,
        # so that a bad quorum fails at once; then every group rank's checkpoint address
        infos = [self._member_info(store, f"{prefix}/member", qid, r, 0) for r in range(world)]
        sizes = {int(i.get("groups", 1)) for i in infos}
        if sizes != {self.group_world_size}:
            raise ValueError(
                f"group_world_size={self.group_world_size} differs between the members of "
                f"quorum {qid} ({sorted(sizes)}); launch the same processes on every host"
            )
        ids = [str(i["id"]) for i in infos]
        twins = [r for r, i in enumerate(ids) if i == self.replica_id]
        if len(twins) > 1:
            raise ValueError(
                f"replica_id={self.replica_id!r} is used by {len(twins)} members of quorum {qid} "
                f"(ranks {twins}); give each host its own replica_id"
            )
        table = [
            [info]
            + [
                self._member_info(store, f"{prefix}/member", qid, r, g)
                for g in range(1, self.group_world_size)
            ]
            for r, info in enumerate(infos)
        ]
        self.view = QuorumView(
            quorum_id=qid,
            rank=rank,
            members=tuple(ids),
            steps=tuple(int(i["step"]) for i in infos),
            addresses=tuple(str(i["addr"]) for i in infos),
            group_rank=self.group_rank,
            group_world_size=self.group_world_size,
            process_addresses=tuple(tuple(str(i["addr"]) for i in row) for row in table),
        )
        self._prefix = prefix
        return self.view

    @staticmethod
    def _member_info(store: Any, prefix: str, qid: int, rank: int, group_rank: int) -> Any:
        try:
            return json.loads(store.get(f"{prefix}/{rank}/{group_rank}"))
        except RuntimeError:  # torch's DistStoreError: it never wrote, within the timeout
            raise _MemberGone(
                f"rank {rank} (group rank {group_rank}) of quorum {qid} never took part"
            ) from None

    def _quorum_address(self, qid: int) -> str:
        """``host:port/prefix`` of quorum ``qid``'s store, one namespace for every group rank.

        torchft configures the gloo group of group rank g on
        ``{store}/torchft/{quorum_id}/{g}``, where ``store`` is the group store of
        the member at g modulo the members at the highest step: group ranks may
        have different stores. Every process uses group rank 0's, which group
        rank 0 tells the others of its group on the group's own store.
        """
        address, _, last = str(self._seen["store"]).rpartition("/")
        if last != str(self.group_rank):
            raise RuntimeError(f"torchft's quorum store {self._seen['store']!r} has no group rank")
        if self.group_world_size > 1:
            key = f"decent_dp/quorum_store/{qid}"
            if self.group_rank == 0:
                self._group_client.set(key, address)
            else:
                try:
                    address = bytes(self._group_client.get(key)).decode()
                except RuntimeError:  # torch's DistStoreError: group rank 0 did not come
                    raise _MemberGone(f"group rank 0 took no part in quorum {qid}") from None
        return f"{address}/decent_dp"

    def _quorum_store(self, qid: int) -> Any:
        if qid not in self._stores:
            self._stores.clear()
            self._addresses = {qid: self._quorum_address(qid)}
            self._stores[qid] = self._create_store_client(self._addresses[qid], self.timeout)
        return self._stores[qid]

    def store_set(self, key: str, value: str) -> None:
        """Set a key under the current quorum call's prefix, for this group rank's processes."""
        assert self.view is not None
        store = self._quorum_store(self.view.quorum_id)
        store.set(f"{self._prefix}/g{self.group_rank}/{key}", value)

    def store_get(self, key: str) -> str:
        """Wait for a key under the current quorum call's prefix (up to the timeout)."""
        assert self.view is not None
        store = self._quorum_store(self.view.quorum_id)
        return bytes(store.get(f"{self._prefix}/g{self.group_rank}/{key}")).decode()

    def world_store(self, prefix: str) -> Any:
        """A store every process of the current quorum reaches, for a flat process group.

        One namespace for all group ranks, under the quorum and the quorum call
        (keys of other quorums and calls do not collide) and ``prefix``. The flat
        group has ``view.world_size * group_world_size`` processes; this process's
        flat rank is ``view.rank * group_world_size + group_rank``. E.g.
        ``torch.distributed.ProcessGroupGloo(membership.world_store("dp"), rank, size,
        timeout)``, which every process of the quorum must build alike.

        Returns:
            A ``torch.distributed.PrefixStore`` over this process's client of the quorum's store.
        """
        import torch.distributed as dist

        assert self.view is not None, "world_store() needs a quorum first"
        # the quorum's one client: with a new connection per call, a quorum now and then
        # waited 5 s for one member's, and every member waited with it
        client = self._quorum_store(self.view.quorum_id)
        return dist.PrefixStore(f"{self._prefix}/world/{prefix}", client)

    # --------------------------------------------------------------- healing
    def heal(
        self,
        sources: dict[int, int],
        step: int,
        snapshot: Callable[[], dict[str, Any]],
        address: Callable[[int], str],
    ) -> dict[str, Any] | None:
        """The quorum's healing, for this process: serve its joiners, or fetch from its source.

        Every member calls it with the same ``sources`` (``{joiner: source}``,
        member ranks). A source stages ``snapshot()`` and, once each of its
        joiners said it has the state (or failed), withdraws it; a joiner
        fetches its source's at ``address(source)``. The keys are those of this
        group rank: each process heals from its source's process of its rank.

        Returns:
            The state this member fetched, or ``None`` (it is no joiner).

        Raises:
            HealFailed: This joiner's fetch failed, or one of this source's joiners'.
            RuntimeError: A joiner or source did not come within the timeout.
        """
        assert self.view is not None
        rank = self.view.rank
        joiners = [j for j, src in sorted(sources.items()) if src == rank]
        try:
            if joiners:
                self.serve_state(step, snapshot())
                self.store_set(f"staged/{rank}", "1")
            state = None
            if rank in sources:
                self.store_get(f"staged/{sources[rank]}")
                try:
                    state = self.fetch_state(address(sources[rank]), step)
                except HealFailed:
                    self.store_set(f"healed/{rank}", "0")  # its source need not wait it out
                    raise
                self.store_set(f"healed/{rank}", "1")
            failed = [j for j in joiners if self.store_get(f"healed/{j}") != "1"]
            if failed:
                names = [self.view.members[j] for j in failed]
                raise HealFailed(f"{names} could not fetch this member's state")
            return state
        finally:
            if joiners:
                self.withdraw_state()

    def serve_state(self, step: int, state: dict[str, Any]) -> None:
        """Stage a copy of ``state`` for joiners to fetch at ``step``."""
        self.transport.send_checkpoint(
            dst_ranks=[], step=step, state_dict=state, timeout=self.timeout
        )

    def withdraw_state(self) -> None:
        """Stop serving the staged state and drop it (torchft's ``Manager`` withdraws at each step).

        A fetch still streaming is let finish first, within the timeout. The
        transport then serves no step: a late request fails at once (HTTP 400)
        rather than waiting ``timeout_s`` on a withdrawn one.
        """
        transport = self.transport
        if transport._state_dict is None and transport._step == -1:
            return  # nothing staged since the last withdrawal (or ever)
        try:
            transport.disallow_checkpoint()  # waits for the readers in flight
        except TimeoutError:  # a fetch of an earlier quorum still streams; it keeps its own copy
            transport._disallowed = False
        # torchft keeps the staged copy until the next stage: a model and its optimizer's state
        transport._state_dict = None
        transport._chunks = None
        transport._spec = None
        transport.allow_checkpoint(-1)

    def fetch_state(self, address: str, step: int) -> dict[str, Any]:
        """Fetch the state a peer staged at ``step``.

        Raises:
            HealFailed: It did not arrive whole: any failure of the transfer or of
                its decoding (a stream cut in its header raises ``EOFError``, in its
                pickle ``UnpicklingError``, ...), which the quorum's work asks again for.
        """
        try:
            state = self.transport.recv_checkpoint(
                src_rank=-1, metadata=address, step=step, timeout=self.timeout
            )
            return dict(state)
        except Exception as exc:
            why = (str(exc).splitlines() or [""])[0][:160]
            raise HealFailed(
                f"the state staged at {address} for step {step} did not arrive whole "
                f"({type(exc).__name__}: {why})"
            ) from None

    def close(self) -> None:
        """Leave: stop heartbeating, close the servers and the group."""
        with self._lock:
            manager = getattr(self, "manager", None)
            if manager is None:
                return
            self.manager = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._stores.clear()
        self.withdraw_state()
        manager.shutdown(wait=False)  # its checkpoint transport too
        self.pg.shutdown()
