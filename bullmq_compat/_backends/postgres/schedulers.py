"""Job schedulers on PostgreSQL: Node's addJobScheduler ... getJobSchedulersCount, Python-named.

A mixin of `PostgresBackend` (``name`` and ``_run`` come from it); these calls are not in the
backend contract yet.
"""
from __future__ import annotations

import abc
from typing import Any, Mapping, Optional, Sequence

from bullmq_compat._backends.postgres import rows, sql
from bullmq_compat._wire.options import wire_to_node


class JobSchedulerCalls(abc.ABC):
    """Upstream's scheduler functions, with the parameters and answers of Node's PostgreSQL backend."""

    name: str

    @abc.abstractmethod
    async def _run(self, command: str, params: Sequence[Any] = (), *, job_id: Optional[str] = None,
                   op: str = "", state: str = "", parent_key: Optional[str] = None) -> sql.Result: ...

    # -- the backend contract's scheduler calls (options in upstream's stored, short-key form) --------
    async def add_job_scheduler(self, scheduler_id: str, next_millis: Optional[int], scheduler_opts: Mapping[str, Any],
                                template_data_json: str, template_opts: Mapping[str, Any],
                                delayed_job_opts: Mapping[str, Any], now: int,
                                producer_id: Optional[str]) -> tuple[str, int]:
        return await self.add_job_scheduler_node(
            scheduler_id, next_millis, template_data_json, wire_to_node(template_opts), dict(scheduler_opts),
            wire_to_node(delayed_job_opts), producer_id, now=now)

    async def update_job_scheduler(self, scheduler_id: str, next_millis: Optional[int], template_data_json: str,
                                   delayed_job_opts: Mapping[str, Any], now: int, producer_id: str) -> Optional[str]:
        return await self.update_job_scheduler_next_millis(
            scheduler_id, next_millis, template_data_json, wire_to_node(delayed_job_opts), producer_id, now=now)

    async def remove_job_scheduler(self, scheduler_id: str) -> bool:
        return await self.remove_job_scheduler_node(scheduler_id) == 0

    async def get_job_scheduler(self, scheduler_id: str) -> tuple[dict[str, str], Optional[int]]:
        fields, next_run = await self.get_job_scheduler_node(scheduler_id)
        return fields or {}, int(float(next_run)) if next_run is not None else None

    async def get_job_schedulers(self, start: int, end: int, asc: bool
                                 ) -> list[tuple[str, dict[str, str], Optional[int]]]:
        out: list[tuple[str, dict[str, str], Optional[int]]] = []
        for scheduler_id, next_run in await self.get_job_schedulers_range(start, end, asc):
            fields, _ = await self.get_job_scheduler_node(scheduler_id)  # one query each, as Node
            out.append((scheduler_id, fields or {}, int(float(next_run)) if next_run is not None else None))
        return out

    # -- Node's PostgreSQL backend's calls, as it makes them --------------------------------------
    async def add_job_scheduler_node(self, job_scheduler_id: str, next_millis: Optional[int], template_data: str,
                                     template_opts: Optional[Mapping[str, Any]], opts: Optional[Mapping[str, Any]],
                                     delayed_job_opts: Optional[Mapping[str, Any]], producer_id: Optional[str] = None,
                                     *, now: Optional[int] = None) -> tuple[str, int]:
        """Register or update a scheduler and enqueue its next iteration (Node's addJobScheduler).

        ``template_data`` is JSON text ("" = ``{}``); ``template_opts`` the job template's options,
        ``opts`` the repeat options (``pattern``/``every``/``limit``/``startDate``/``endDate``/
        ``tz``/``offset``, Node's names), ``delayed_job_opts`` the options of the iteration job;
        ``producer_id`` the iteration that asks (Node passes the processed job's id); ``now``
        defaults to the clock. None values are sent as JSON null: leave a key out to omit it, as
        JSON.stringify drops undefined. Returns ``(iteration job id, its delay in ms)``; upstream's
        refusals raise (-10 an iteration id already taken, -11 both time slots busy).
        """
        scheduler_id = rows.text_param(job_scheduler_id, what="job scheduler id")
        data = rows.json_text_param(template_data or "{}", what="template data")
        row = (await self._run("add_job_scheduler", [
            self.name, scheduler_id, next_millis, data, rows.json_param(dict(template_opts or {}), what="options"),
            rows.json_param(dict(opts or {}), what="repeat options"),
            rows.json_param(dict(delayed_job_opts or {}), what="options"),
            rows.now_ms() if now is None else int(now), producer_id,
        ], op="addJobScheduler")).rows[0]
        return str(row["job_id"]), int(row["delay"])

    async def update_job_scheduler_next_millis(self, job_scheduler_id: str, next_millis: Optional[int],
                                               template_data: str, delayed_job_opts: Optional[Mapping[str, Any]],
                                               producer_id: Optional[str] = None, *, now: Optional[int] = None
                                               ) -> Optional[str]:
        """Advance a scheduler to its next iteration without changing its template (Node's
        updateJobSchedulerNextMillis). ``producer_id`` is the id of the iteration whose processing
        asks for the next one: only the current iteration's producer may advance the scheduler.
        Returns the new iteration's id; None when the scheduler is gone, the producer is not the
        current iteration, or the next iteration exists already (a ``duplicated`` event)."""
        row = (await self._run("update_job_scheduler", [
            self.name, rows.text_param(job_scheduler_id, what="job scheduler id"), next_millis,
            rows.json_text_param(template_data or "{}", what="template data"),
            rows.json_param(dict(delayed_job_opts or {}), what="options"),
            rows.now_ms() if now is None else int(now), producer_id,
        ])).first()
        return rows.optional_str(row["job_id"]) if row else None

    async def remove_job_scheduler_node(self, job_scheduler_id: str) -> int:
        """Remove a scheduler and its still-delayed iteration. Upstream's answer as Node passes it on:
        0 when it was removed, 1 when there was none (Node's Queue.removeJobScheduler negates it)."""
        row = (await self._run("remove_job_scheduler", [self.name, job_scheduler_id])).first()
        return int(row["removed"] or 0) if row else 0

    async def get_job_scheduler_node(self, job_scheduler_id: str) -> tuple[Optional[dict[str, str]], Optional[str]]:
        """``(fields, next run ms as text)`` as the Redis scheduler hash and score (Node returns the
        fields as a flat list), ``(None, None)`` when there is no such scheduler."""
        row = (await self._run("get_job_scheduler", [self.name, job_scheduler_id])).first()
        if row is None:
            return None, None
        return rows.scheduler_fields(row), rows.optional_str(row["next_run_ms"])

    async def is_job_scheduler(self, job_scheduler_id: str) -> bool:
        row = (await self._run("is_job_scheduler", [self.name, job_scheduler_id])).first()
        return bool(row and row["exists"])

    async def get_job_schedulers_range(self, start: int, end: int, asc: bool) -> list[tuple[str, str]]:
        """Schedulers ``start..end`` (``end`` < 0: all the rest) ordered by next run, as
        ``(id, next run ms)`` pairs (Node: the same pairs flattened)."""
        count = None if end < 0 else end - start + 1
        result = await self._run("get_job_schedulers_range", [self.name, bool(asc), start, count])
        return [(str(r["scheduler_id"]), str(r["next_run_ms"])) for r in result.rows]

    async def get_job_schedulers_count(self) -> int:
        row = (await self._run("get_job_schedulers_count", [self.name])).first()
        return int(row["count"]) if row else 0
