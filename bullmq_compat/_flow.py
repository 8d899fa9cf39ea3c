"""FlowProducer: trees of jobs across queues, added in one transaction, as Node BullMQ's.

A parent is added in ``waiting-children`` and each of its children holds a link to it; upstream's
scripts move the parent on (to waiting) when its last child finishes, whichever language runs the
workers. Every node of a call goes into one MULTI/EXEC, in the order Node sends them (parents
before their children, level by level), each add deferring its parent's release; a
``releaseParentIfNoPendingDependencies`` per parent closes the transaction, as Node's ``addFlow``.
"""
from __future__ import annotations

import asyncio
import collections
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence

from opentelemetry.trace import SpanKind

from bullmq_compat._backends import open_backend
from bullmq_compat._backends.base import NewJob
from bullmq_compat._errors import (
    InvalidArgument,
    InvalidJobOptions,
    ParentJobNotFound,
    QueueClosed,
    RedisOutOfMemory,
    is_out_of_memory,
    script_error,
)
from bullmq_compat._groups import GROUP_OPTIONS, GroupJobRefused, check_group_combination, group_support
from bullmq_compat._job import Job
from bullmq_compat._job_ids import JobIdGenerator, id_generator
from bullmq_compat._queue import Connection, Queue, check_prefix, check_queue_name
from bullmq_compat._telemetry import BULK_COUNT, BULK_NAMES, FLOW_NAME, JOB_ID, JOB_NAME, Telemetry, resolve
from bullmq_compat._transactions import driver_connection
from bullmq_compat._wire.options import merge_defaults, normalize_job_options

_NODE_KEYS = {"name", "queue_name", "queueName", "data", "opts", "children", "prefix"}
_GROUP_KEYS = ("group", "order_ms", "orderMs")
_POLICY_FLAGS = (("failParentOnFailure", "fpof"), ("removeDependencyOnFailure", "rdof"),
                 ("ignoreDependencyOnFailure", "idof"), ("continueParentOnFailure", "cpof"))


@dataclass
class JobNode:
    """One node of a flow: its `Job` and its children's nodes (empty for a leaf).

    Also readable as Node's plain object: ``node["job"]``, ``node["children"]``.
    """

    job: Job
    children: list["JobNode"] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        if key not in ("job", "children"):
            raise KeyError(key)
        return getattr(self, key)

    def walk(self) -> Iterator["JobNode"]:
        """This node, then every node below it (depth first)."""
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass
class _Entry:
    """One node's add, ready to go into the transaction."""

    prepared: Any  # the backend's prepared add (prepare_flow_node)
    node: JobNode
    parent_key: Optional[str]


class FlowProducer:
    """Adds flows — a parent job that runs once all its children (in any queues) are done.

    >>> flows = FlowProducer(connection="redis://127.0.0.1:6379/0")
    >>> tree = await flows.add({
    ...     "name": "render", "queue_name": "renders", "data": {"movie": 7},
    ...     "children": [{"name": "frame", "queue_name": "frames", "data": {"n": n}} for n in range(3)],
    ... })
    >>> await tree.job.get_state()
    'waiting-children'

    The parent's processor reads its children's results with ``await job.get_children_values()``.
    Child options ``fail_parent_on_failure``, ``ignore_dependency_on_failure``,
    ``remove_dependency_on_failure`` and ``continue_parent_on_failure`` choose what a child's
    failure does to its parent, as in Node.
    """

    def __init__(self, connection: Connection = None, *, prefix: str = "bull", telemetry: Any = None,
                 schema: Optional[str] = None, migrate: bool = False,
                 job_id_generator: Optional[JobIdGenerator] = None) -> None:
        """Add flows on ``connection`` (a URL, a client, or a PostgreSQL pool); ``telemetry`` as for
        `Queue`, ``job_id_generator`` names each node that gives no id (else a UUIDv4, as Node's)."""
        self.prefix = check_prefix(prefix)
        # the id of each node that gives none (else a UUIDv4, as Node's FlowProducer)
        self._id_generator = id_generator(job_id_generator)
        # OpenTelemetry, as Node's FlowProducer with bullmq-otel: a producer span "addFlow <queue>"
        # (or "addBulkFlows"), one "addNode <queue>" per job below it (a child's under its
        # parent's), and each job's opts.tm holding its addNode span's context
        self.telemetry: Optional[Telemetry] = resolve(telemetry)
        # the connection, bound to no queue in particular: each queue's backend shares it (for_queue)
        self._backend = open_backend("flows", connection, prefix=self.prefix, schema=schema, migrate=migrate)
        self._queues: dict[tuple[str, str], Queue] = {}
        self._ready = False
        self.closing = False

    @property
    def job_id_generator(self) -> Optional[JobIdGenerator]:
        """The ``job_id_generator=`` this producer was made with, or None."""
        return None if self._id_generator is None else self._id_generator.fn

    @property
    def client(self) -> Any:
        """The redis-py client (Redis only)."""
        return getattr(self._backend, "client")

    def _closed_error(self) -> QueueClosed:
        return QueueClosed("this FlowProducer is closed: create a new FlowProducer to add or read flows "
                           "(a closed one does not reconnect)")

    async def wait_until_ready(self) -> None:
        """Check once that the datastore answers (raises naming the address, never a password)."""
        if self.closing:
            raise self._closed_error()
        if not self._ready:
            await self._backend.connect()
            self._ready = True

    async def close(self) -> None:
        """Close the connection it opened (a client passed as ``connection=`` stays open); later calls
        (and those of its queues' jobs) raise `QueueClosed`; closing again does nothing."""
        if self.closing:
            return
        self.closing = True
        for queue in self._queues.values():  # they share our connection: closed with it
            await queue.close()
        await self._backend.close()

    async def __aenter__(self) -> "FlowProducer":
        await self.wait_until_ready()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def queue(self, name: str, prefix: Optional[str] = None) -> Queue:
        """The Queue (on this producer's connection) that jobs of queue ``name`` are bound to."""
        prefix = self.prefix if prefix is None else check_prefix(prefix)
        found = self._queues.get((prefix, name))
        if found is None:
            if self.closing:
                raise self._closed_error()
            found = Queue(name, prefix=prefix, skip_meta_update=True,
                          backend=self._backend.for_queue(name, prefix))
            self._queues[(prefix, name)] = found
        return found

    # -- adding ---------------------------------------------------------------------------------
    async def add(self, flow: Mapping[str, Any], *,
                  queues_options: Optional[Mapping[str, Mapping[str, Any]]] = None, transaction: Any = None) -> JobNode:
        """Add one flow atomically: every job of the tree, or (on bad input) none.

        ``flow`` is ``{"name", "queue_name" (or Node's "queueName"), "data", "opts", "children":
        [...flows], "prefix"}``; a root may name an existing parent in ``opts["parent"]``.
        ``queues_options`` gives default job options per queue name:
        ``{"frames": {"default_job_options": {"attempts": 3}}}``. ``transaction=`` (PostgreSQL):
        the caller's open transaction, as for `Queue.add`: the whole tree commits or rolls back with it.
        """
        return (await self._add([flow], queues_options, bulk=False, transaction=transaction))[0]

    async def add_bulk(self, flows: Sequence[Mapping[str, Any]], *, transaction: Any = None) -> list[JobNode]:
        """Add several flows in one transaction; a bad one refuses them all before anything is written.

        A root whose ``opts["parent"]`` names a job that does not exist raises `ParentJobNotFound`
        and writes nothing, of that tree or of the others (Node writes the other trees and returns
        every tree, the one refused included, as if it had been added)."""
        if isinstance(flows, (str, bytes, Mapping)) or not isinstance(flows, Sequence):
            raise InvalidArgument(f"add_bulk takes a list of flows, not {type(flows).__name__}")
        return await self._add(list(flows), None, bulk=True, transaction=transaction)

    async def _add(self, flows: list[Mapping[str, Any]], queues_options: Optional[Mapping[str, Mapping[str, Any]]],
                   *, bulk: bool, transaction: Any = None) -> list[JobNode]:
        if self.closing:
            raise self._closed_error()
        if self.telemetry is None:
            return await self._add_flows(flows, queues_options, None, transaction)
        if bulk:
            names = ",".join(str(flow.get("name")) for flow in flows if isinstance(flow, Mapping))
            traced = self.telemetry.span(SpanKind.PRODUCER, "", "addBulkFlows",
                                         attributes={BULK_COUNT: len(flows), BULK_NAMES: names})
        else:
            root = flows[0] if isinstance(flows[0], Mapping) else {}
            queue_name = str(root.get("queue_name", root.get("queueName", "")))
            traced = self.telemetry.span(SpanKind.PRODUCER, queue_name, "addFlow", queue_name,
                                         attributes={FLOW_NAME: str(root.get("name"))})
        with traced:
            return await self._add_flows(flows, queues_options, [], transaction)

    async def _add_flows(self, flows: list[Mapping[str, Any]],
                         queues_options: Optional[Mapping[str, Mapping[str, Any]]],
                         node_spans: Optional[list[Any]], transaction: Any = None) -> list[JobNode]:
        defaults = self._queue_defaults(queues_options)
        try:
            entries, roots = self._collect(flows, defaults, node_spans)
        finally:
            for span in reversed(node_spans or []):  # children's first, as Node's nested spans end
                span.end()
        if not entries:
            return roots
        await self.wait_until_ready()
        backend = self._backend
        if transaction is not None:
            backend = backend.in_transaction(await driver_connection(transaction))
        try:
            results = await backend.add_flow([entry.prepared for entry in entries])
        except ParentJobNotFound as err:
            trees = [f"flow[{i}]" for i, root in enumerate(roots) if root.job.parent_key == err.parent_key]
            if trees and len(roots) > 1:
                refused = ParentJobNotFound(f"{', '.join(trees)}: {err}; nothing was added", job_id=err.job_id,
                                            command=err.command)
                refused.parent_key = err.parent_key
                raise refused from None
            raise
        except Exception as err:
            if is_out_of_memory(err):
                raise RedisOutOfMemory("flow add", err) from err
            raise
        for entry, result in zip(entries, results):
            if isinstance(result, BaseException):
                if is_out_of_memory(result):
                    raise RedisOutOfMemory("flow add", result) from result
                raise result
            if isinstance(result, int) and result < 0:
                raise script_error(result, job_id=str(entry.node.job.id), command="addJob",
                                   parent_key=entry.parent_key)
        return roots

    @staticmethod
    def _queue_defaults(queues_options: Optional[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
        if not queues_options:
            return {}
        if not isinstance(queues_options, Mapping):
            raise InvalidArgument(f"queues_options={queues_options!r} must be a dict of queue name -> options")
        out: dict[str, dict[str, Any]] = {}
        for name, options in queues_options.items():
            if not isinstance(options, Mapping) or set(options) - {"default_job_options", "defaultJobOptions"}:
                raise InvalidArgument(
                    f"queues_options[{name!r}]={options!r} must be {{'default_job_options': {{...}}}}")
            raw = options.get("default_job_options", options.get("defaultJobOptions")) or {}
            out[name] = normalize_job_options(raw)
        return out

    def _collect(self, flows: list[Mapping[str, Any]], defaults: Mapping[str, dict[str, Any]],
                 node_spans: Optional[list[Any]] = None) -> tuple[list[_Entry], list[JobNode]]:
        """Validate and encode every node, level by level (Node's order): parents come first.
        With ``node_spans``, each node's addNode span is started (under its parent's) and kept there."""
        entries: list[_Entry] = []
        roots: list[JobNode] = []
        pending: collections.deque[tuple[Any, Optional[dict[str, Any]], str, Optional[JobNode], Any]] = \
            collections.deque((flow, None, f"flow[{i}]", None, None) for i, flow in enumerate(flows))
        while pending:
            spec, parent_opts, path, holder, trace_parent = pending.popleft()
            entry, children, trace_context = self._entry(spec, parent_opts, path, defaults, node_spans, trace_parent)
            entries.append(entry)
            node = entry.node
            if holder is None:
                roots.append(node)
            else:
                holder.children.append(node)
            link_for_children = {"id": str(node.job.id), "queue": node.job.queue.qualified_name}
            for i, child in enumerate(children):
                pending.append((child, link_for_children, f"{path}.children[{i}]", node, trace_context))
        return entries, roots

    def _traced_node(self, opts: dict[str, Any], queue_name: str, name: Any, job_id: str,
                     node_spans: list[Any], trace_parent: Any) -> Any:
        """Start the node's addNode span and store its context in the job's options (opts.tm) as
        Node does: metadata the job was given wins; omit_context stores none."""
        assert self.telemetry is not None
        span, context = self.telemetry.start(SpanKind.PRODUCER, queue_name, "addNode", queue_name, trace_parent,
                                             {JOB_NAME: str(name), JOB_ID: job_id})
        node_spans.append(span)
        given = opts.get("telemetry") or {}
        omit = bool(given.get("omitContext"))
        metadata = given.get("metadata") or (None if omit else Telemetry.metadata(context))
        if metadata or omit:
            opts["telemetry"] = {**({"metadata": metadata} if metadata else {}),
                                 **({"omitContext": True} if omit else {})}
        return context

    def _entry(self, spec: Any, parent_opts: Optional[dict[str, Any]], path: str,
               defaults: Mapping[str, dict[str, Any]], node_spans: Optional[list[Any]] = None,
               trace_parent: Any = None) -> tuple[_Entry, list[Any], Any]:
        if not isinstance(spec, Mapping):
            raise InvalidArgument(f"{path} must be a dict with name, queue_name, data, opts, children; got {spec!r}")
        unknown = set(spec) - _NODE_KEYS
        if unknown:
            raise InvalidArgument(f"{path} has unknown keys {sorted(unknown)}; allowed: {sorted(_NODE_KEYS)}")
        if "queue_name" in spec and "queueName" in spec and spec["queue_name"] != spec["queueName"]:
            raise InvalidArgument(f"{path} has both queue_name={spec['queue_name']!r} and "
                                  f"queueName={spec['queueName']!r}: give one")
        try:
            queue_name = check_queue_name(spec.get("queue_name", spec.get("queueName")))
            if "name" not in spec:
                raise InvalidArgument("it has no 'name'")
            children = spec.get("children") or []
            if isinstance(children, (str, bytes, Mapping)) or not isinstance(children, Sequence):
                raise InvalidArgument(f"children={children!r} must be a list of flows")
            queue = self.queue(queue_name, spec.get("prefix") or None)
            raw_opts = spec.get("opts") or {}
            if not isinstance(raw_opts, Mapping):
                raise InvalidJobOptions(f"opts={raw_opts!r} must be a dict")
            grouped = [key for key in _GROUP_KEYS if raw_opts.get(key) is not None]
            if grouped and children:
                raise GroupJobRefused(
                    f"option {grouped[0]!r}={raw_opts[grouped[0]]!r} on a node with children: a group job cannot "
                    "be a flow parent (the group gate holds jobs in waiting-children, where upstream also keeps "
                    "a parent until its children finish, and moves it out when they have); group its children "
                    "instead")
            opts = merge_defaults(defaults.get(queue_name), normalize_job_options(raw_opts, extra=GROUP_OPTIONS))
            # A child's parent is the node above it; a root keeps the parent its opts name (if any).
            if parent_opts is not None:
                opts["parent"] = parent_opts
            check_group_combination(opts)
            if opts.get("group") is not None:
                group_support(queue.backend)  # refused where the backend has no group gate
            parent = opts.get("parent")
            if opts.get("deduplication"):
                if children:
                    raise InvalidJobOptions("deduplication cannot be used on flow nodes with children")
                if parent:
                    raise InvalidJobOptions("options deduplication and parent cannot be used together")
            job_id = opts.get("jobId") or (str(uuid.uuid4()) if self._id_generator is None
                                           else self._id_generator(spec["name"], spec.get("data")))
            trace_context = None
            if node_spans is not None:
                trace_context = self._traced_node(opts, queue_name, spec["name"], job_id, node_spans, trace_parent)
            parent_key = link = None
            if parent:
                parent_key = f"{parent['queue']}:{parent['id']}"
                link = {"id": parent["id"], "queueKey": parent["queue"]}
                for flag, short in _POLICY_FLAGS:
                    if opts.get(flag):
                        link[short] = True
            new_job = NewJob(name=spec["name"], data=spec.get("data"), opts=opts, job_id=job_id,
                             timestamp=int(opts.get("timestamp") or time.time() * 1000), queue_name=queue_name)
            prepared = queue.backend.prepare_flow_node(new_job, parent_key=parent_key, parent_link=link,
                                                       has_children=bool(children))
        except InvalidArgument as err:
            label = f"{path} ({spec.get('name')!r} in queue {spec.get('queue_name', spec.get('queueName'))!r})"
            raise type(err)(f"{label}: {err}") from None
        job = queue._job_from(prepared, job_id)
        job.parent = link
        return _Entry(prepared, JobNode(job), parent_key), list(children), trace_context

    # -- reading --------------------------------------------------------------------------------
    async def get_flow(self, opts: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> Optional[JobNode]:
        """The tree below a job: ``get_flow({"id": ..., "queue_name": ...})`` (also keywords), with
        ``depth`` (levels, default 10), ``max_children`` (per parent and state, default 20) and
        ``prefix``. None when the job does not exist; children that no longer exist are left out."""
        given = {**(opts or {}), **kwargs}
        unknown = set(given) - {"id", "queue_name", "queueName", "depth", "max_children", "maxChildren", "prefix"}
        if unknown:
            raise InvalidArgument(f"get_flow got unknown options {sorted(unknown)}")
        job_id = given.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise InvalidArgument(f"get_flow needs the job's id (a str), got {job_id!r}")
        queue_name = check_queue_name(given.get("queue_name", given.get("queueName")))
        depth = given.get("depth", 10)
        max_children = given.get("max_children", given.get("maxChildren", 20))
        for label, value in (("depth", depth), ("max_children", max_children)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"get_flow {label}={value!r} must be an int >= 1")
        if self.closing:
            raise self._closed_error()
        await self.wait_until_ready()
        return await self._get_node(given.get("prefix") or self.prefix, queue_name, job_id, depth, max_children)

    async def _get_node(self, prefix: Optional[str], queue_name: str, job_id: str, depth: int,
                        max_children: int) -> Optional[JobNode]:
        job = await self.queue(queue_name, prefix).get_job(job_id)
        if job is None:
            return None
        page = {"cursor": 0, "count": max_children}
        deps = await job.get_dependencies(processed=page, unprocessed=page, failed=page, ignored=page)
        keys = [*deps["processed"], *deps["unprocessed"], *deps["failed"], *deps["ignored"]]
        if not keys or depth <= 1:
            return JobNode(job)
        children = await asyncio.gather(*(
            self._get_node(*self._backend.split_job_key(key), depth - 1, max_children) for key in keys))
        return JobNode(job, [child for child in children if child is not None])

    def __repr__(self) -> str:
        return f"<FlowProducer prefix={self.prefix!r} {self._backend.description}>"
