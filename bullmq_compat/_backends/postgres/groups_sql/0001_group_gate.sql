-- bullmq-compat's per-group gate on PostgreSQL (docs/groups.md), version 1.
--
-- Ours, not upstream's: every object is named bullmq_compat_*, installed by our own migration
-- (bullmq_compat/_backends/postgres/groups.py) with a ledger of its own (bullmq_compat_migration);
-- upstream's tables, functions and ledger are not changed. Run with search_path set to the queue
-- schema, after upstream's migrations.
--
-- The model. A group job is a row of upstream's `job` whose opts hold {"group": {"id": <gid>}}
-- (BullMQ Pro's shape; {"orderMs": n} beside "id" orders it by a producer's clock). Its state says
-- where it is in its group's turn, so there is no bookkeeping of ours to drift:
--   held      state 'waiting-children' with pending_deps 0 (Node's getters and Bull-Board show it
--             under "Waiting children", as on Redis);
--   released  'waiting', 'delayed' or 'active': the group's current job(s), at most the group's
--             concurrency (default 1);
--   done      'completed' / 'failed' (or the row deleted): the turn is over.
-- Triggers on `job` keep that true whoever calls upstream's functions (a Python worker, a Node
-- worker, Bull-Board):
--   bullmq_compat_gate_insert      BEFORE INSERT: a new group job with no free slot, or with
--                                  held jobs ahead of it, is held instead of added to wait.
--   bullmq_compat_gate_update      BEFORE UPDATE: a released job that leaves the running states
--                                  for good frees its slot, and the group's next held job is
--                                  released (NOTIFY as upstream's add) in the same transaction as
--                                  the finish; a done or held group job moved to wait/delayed by
--                                  someone else than the gate (Node's job.retry(),
--                                  queue.retryJobs(), Bull-Board's Retry) goes back behind the
--                                  gate when its group has no free slot. (One trigger for both:
--                                  each trigger on `job` costs every UPDATE of any job.)
--   bullmq_compat_release_delete   AFTER DELETE: a released job removed frees its slot likewise.
--   bullmq_compat_gated_events     (deferred, on our own bullmq_compat_gated): at commit, the
--                                  'waiting' event upstream's add (or retry) published for a job
--                                  the gate held reads 'waiting-children', as the Redis gate's
--                                  does. No trigger of ours is on `event`.
-- Each trigger on `job` has one WHEN test, the group option's key (a longer WHEN is compiled again
-- on every statement and cost ungrouped jobs about 7 us per update): the rest of the test is in the
-- functions, which only group jobs reach.
--
-- Locks (bullmq_compat_lock_group). Transaction-scoped advisory locks (two int4 keys, a space
-- upstream's single-key locks do not use): a one-job call of upstream's takes its queue's gate
-- shared and its group's lock, waited for in one (queue, group id) order only; any other statement
-- takes the queue's gate exclusively. They are always taken while the job row that fired the
-- trigger is locked, and before any held row is locked. Nothing that locks a held row waits for
-- a gate lock (deleting or changing a held job fires no trigger of ours that locks).

CREATE TABLE bullmq_compat_group (
  queue             text    NOT NULL,
  gid               text    NOT NULL,
  concurrency       integer,            -- NULL: the queue's default, else 1
  paused            boolean NOT NULL DEFAULT false,
  ordering_delay_ms bigint,             -- NULL: the queue's default, else 0
  PRIMARY KEY (queue, gid)
);

CREATE TABLE bullmq_compat_group_queue (
  queue             text    PRIMARY KEY,
  concurrency       integer,            -- the default of the queue's groups (NULL: 1)
  ordering_delay_ms bigint              -- NULL: 0
);

-- The group id of a job's options (NULL: not a group job; ->> gives NULL unless "group" is an object).
CREATE FUNCTION bullmq_compat_gid(p_opts jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT p_opts -> 'group' ->> 'id' $$;

-- A producer's order (opts.group.orderMs), NULL when it gave none.
CREATE FUNCTION bullmq_compat_order_ms(p_opts jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN jsonb_typeof(p_opts -> 'group' -> 'orderMs') = 'number'
              THEN LEAST(GREATEST(floor((p_opts -> 'group' ->> 'orderMs')::numeric), 0), 9e15)::bigint END
$$;

-- A group job's place in its group: its order_ms, else its add time (ties: add sequence).
-- (self-contained: index expressions must not resolve names through search_path. PL/pgSQL, so that
-- the index below holds a call, not the inlined expression: every statement on `job`, a plain
-- job's too, prepares each index expression and predicate it may have to evaluate)
CREATE FUNCTION bullmq_compat_group_order(p_opts jsonb, p_added_at_ms bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
  IF jsonb_typeof(p_opts -> 'group' -> 'orderMs') = 'number' THEN
    RETURN LEAST(GREATEST(floor((p_opts -> 'group' ->> 'orderMs')::numeric), 0), 9e15)::bigint;
  END IF;
  RETURN p_added_at_ms;
END;
$$;

-- A group's released jobs (counted per gate decision), and its held jobs in group order. Their
-- predicates are false for a plain job, so each costs a plain job one jsonb key test per row
-- written. (The held index repeats upstream's job_waiting_children_idx predicate, so the planner
-- weighs the two on their columns alone: a wider predicate had it scan all of a queue's held jobs.)
CREATE INDEX bullmq_compat_group_running_idx
  ON job (queue, bullmq_compat_gid(opts))
  WHERE opts ? 'group' AND state IN ('waiting', 'active', 'delayed');

CREATE INDEX bullmq_compat_group_held_idx
  ON job (queue, bullmq_compat_gid(opts), bullmq_compat_group_order(opts, added_at_ms), abs(seq))
  WHERE opts ? 'group' AND state = 'waiting-children';

-- (Helpers that run a query are PL/pgSQL, whose plans are kept per session: a LANGUAGE sql function
-- that is not inlined plans its query again on every call.)
CREATE FUNCTION bullmq_compat_now() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$ BEGIN RETURN (extract(epoch FROM clock_timestamp()) * 1000)::bigint; END $$;

-- Is the running top-level statement one of upstream's calls that change one job (an add, a
-- finish, a retry)? Such a statement takes the gate per group; any other (add_jobs_bulk, add_flow,
-- retry_jobs, drain, clean, obliterate, our API functions, a statement of the application's own)
-- takes the queue's whole gate.
CREATE FUNCTION bullmq_compat_one_job_statement() RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  q text := current_query();
BEGIN
  -- (each of these calls is in upstream's command of that name only; a search for a fixed string,
  -- not a regular expression, which cost about 40 us over a command's comment lines)
  RETURN strpos(q, 'SELECT add_job(') > 0 OR strpos(q, 'FROM move_to_completed_fetch(') > 0
      OR strpos(q, 'SELECT move_to_completed(') > 0 OR strpos(q, 'FROM move_to_failed_fetch(') > 0
      OR strpos(q, 'SELECT move_to_failed(') > 0 OR strpos(q, 'SELECT retry_job(') > 0
      OR strpos(q, 'SELECT move_to_delayed(') > 0 OR strpos(q, 'SELECT move_active_to_wait(') > 0
      OR strpos(q, 'SELECT reprocess_job(') > 0;
END;
$$;

-- Take the gate for a decision about group p_gid of p_queue, until the transaction ends.
--   A one-job statement (and each statement of a transaction whose first gate decision was one):
--   the queue's gate shared, then the group's lock. Locks are waited for in one order only, by
--   (queue, group id) as bytes: a lock that would come before one this transaction holds is only
--   tried, and when it is busy the statement fails with deadlock_detected (SQLSTATE 40P01, before
--   any wait: our client then runs the calls of its batch one by one). So different groups'
--   finishes commit in parallel, and no cycle of waits can form.
--   Any other statement: the queue's gate exclusively, which waits for every group decision of the
--   queue to commit and then needs no group lock (add_bulk and batched retries touch groups in an
--   order of their own).
CREATE FUNCTION bullmq_compat_lock_group(p_queue text, p_gid text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  v_mode text := current_setting('bullmq_compat.gate_mode', true);
  v_key text;
  v_last text;
BEGIN
  IF v_mode IS NULL OR v_mode = '' THEN
    v_mode := CASE WHEN bullmq_compat_one_job_statement() THEN 'group' ELSE 'queue' END;
    PERFORM set_config('bullmq_compat.gate_mode', v_mode, true);
  END IF;
  IF v_mode = 'queue' THEN
    PERFORM pg_advisory_xact_lock(hashtext('bullmq_compat:gate'), hashtext(p_queue));
    RETURN;
  END IF;
  v_key := p_queue || chr(1) || COALESCE(p_gid, '');
  v_last := COALESCE(current_setting('bullmq_compat.gate_last', true), '');
  IF v_key COLLATE "C" > v_last COLLATE "C" THEN
    PERFORM pg_advisory_xact_lock_shared(hashtext('bullmq_compat:gate'), hashtext(p_queue));
    PERFORM pg_advisory_xact_lock(hashtext('bullmq_compat:group:' || p_queue), hashtext(COALESCE(p_gid, '')));
    PERFORM set_config('bullmq_compat.gate_last', v_key, true);
  ELSIF NOT (pg_try_advisory_xact_lock_shared(hashtext('bullmq_compat:gate'), hashtext(p_queue))
             AND pg_try_advisory_xact_lock(hashtext('bullmq_compat:group:' || p_queue), hashtext(COALESCE(p_gid, '')))) THEN
    RAISE EXCEPTION 'bullmq-compat group gate: group % of queue % is busy and comes before a group this transaction holds',
                    quote_literal(COALESCE(p_gid, '')), quote_literal(p_queue)
      USING ERRCODE = 'deadlock_detected',
            HINT = 'run the calls one per transaction (bullmq-compat does so by itself)';
  END IF;
END;
$$;

-- A group's settings: (concurrency, paused, ordering delay ms).
-- (Internal helpers have no SET search_path: they run inside our entry points -- the trigger and
-- API functions -- which set it, and a SET clause costs a configuration change per call.)
CREATE FUNCTION bullmq_compat_group_settings(
  p_queue text, p_gid text, OUT concurrency integer, OUT paused boolean, OUT ordering_delay_ms bigint
)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  SELECT COALESCE(g.concurrency, q.concurrency, 1), COALESCE(g.paused, false),
         COALESCE(g.ordering_delay_ms, q.ordering_delay_ms, 0)
    INTO concurrency, paused, ordering_delay_ms
    FROM (SELECT 1) AS one
    LEFT JOIN bullmq_compat_group g ON g.queue = p_queue AND g.gid = p_gid
    LEFT JOIN bullmq_compat_group_queue q ON q.queue = p_queue;
END;
$$;

-- How many of the group's jobs are released (wait, delayed, active) now.
CREATE FUNCTION bullmq_compat_running(p_queue text, p_gid text) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  RETURN (SELECT count(*)::integer FROM job
           WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
             AND state IN ('waiting', 'active', 'delayed'));
END;
$$;

-- When a job the gate releases now is due (ms; <= p_now: at once): its own delay counts from its
-- add time (as upstream's add), the ordering delay from its order_ms.
CREATE FUNCTION bullmq_compat_due(p_opts jsonb, p_added_at_ms bigint, p_delay_ms bigint, p_ordering_delay_ms bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$
  SELECT GREATEST(
    CASE WHEN p_delay_ms > 0 THEN p_added_at_ms + p_delay_ms ELSE 0 END,
    CASE WHEN p_ordering_delay_ms > 0 AND bullmq_compat_order_ms(p_opts) IS NOT NULL
         THEN bullmq_compat_order_ms(p_opts) + p_ordering_delay_ms ELSE 0 END)
$$;

-- With an ordering delay: take back behind the gate the group's released jobs that have not started
-- and wait out their window in delayed, when they come after order `p_order` (a job with an
-- earlier order_ms arrived late: it goes first). Rows locked by someone else are left alone.
CREATE FUNCTION bullmq_compat_reclaim(p_queue text, p_gid text, p_order bigint) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
  v_id text;
  v_n integer := 0;
BEGIN
  -- only the latest one, so that the job arriving with an earlier order gets one slot
  FOR v_id IN
    SELECT id FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state = 'delayed' AND processed_at_ms IS NULL
       AND bullmq_compat_order_ms(opts) IS NOT NULL
       AND bullmq_compat_group_order(opts, added_at_ms) > p_order
     ORDER BY bullmq_compat_group_order(opts, added_at_ms) DESC, abs(seq) DESC
     LIMIT 1
     FOR UPDATE SKIP LOCKED
  LOOP
    UPDATE job SET state = 'waiting-children', process_at_ms = NULL WHERE queue = p_queue AND id = v_id;
    PERFORM publish_event(p_queue, 'waiting-children', jsonb_build_object('jobId', v_id, 'prev', 'delayed'));
    v_n := v_n + 1;
  END LOOP;
  RETURN v_n;
END;
$$;

-- Release the group's next held jobs while it has free slots; returns how many were released.
-- The caller holds the group lock.
CREATE FUNCTION bullmq_compat_release_locked(p_queue text, p_gid text, p_now bigint, p_leaving integer DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
  v_concurrency integer;
  v_paused boolean;
  v_ordering_delay_ms bigint;
  v_running integer;
  v_job record;
  v_due bigint;
  v_seq bigint;
  v_released integer := 0;
  v_misses integer := 0;
BEGIN
  -- (the settings and the count written out here, not called: this runs on every group job's finish)
  SELECT COALESCE(g.concurrency, q.concurrency, 1), COALESCE(g.paused, false),
         COALESCE(g.ordering_delay_ms, q.ordering_delay_ms, 0)
    INTO v_concurrency, v_paused, v_ordering_delay_ms
    FROM (SELECT 1) AS one
    LEFT JOIN bullmq_compat_group g ON g.queue = p_queue AND g.gid = p_gid
    LEFT JOIN bullmq_compat_group_queue q ON q.queue = p_queue;
  IF v_paused THEN
    RETURN 0;
  END IF;
  -- (p_leaving: the finishing job, still counted, from the BEFORE UPDATE trigger)
  SELECT count(*)::integer - p_leaving INTO v_running FROM job
   WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
     AND state IN ('waiting', 'active', 'delayed');
  WHILE v_running < v_concurrency LOOP
    -- (not FOR UPDATE, which writes the row once more: the UPDATE below finds this very version by
    -- its ctid, and a head someone removed or changed meanwhile is not found, and looked for again)
    SELECT ctid AS head_ctid, id, opts, added_at_ms, delay_ms INTO v_job FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state = 'waiting-children' AND pending_deps = 0
     ORDER BY bullmq_compat_group_order(opts, added_at_ms), abs(seq)
     LIMIT 1;
    EXIT WHEN NOT FOUND;
    v_due := bullmq_compat_due(v_job.opts, v_job.added_at_ms, v_job.delay_ms, v_ordering_delay_ms);
    v_seq := nextval('job_seq');
    IF v_job.opts ->> 'lifo' = 'true' THEN
      v_seq := -v_seq;
    END IF;
    UPDATE job SET state = CASE WHEN v_due > p_now THEN 'delayed'::job_state ELSE 'waiting'::job_state END,
                   process_at_ms = CASE WHEN v_due > p_now THEN v_due END, seq = v_seq
     WHERE ctid = v_job.head_ctid AND state = 'waiting-children' AND pending_deps = 0;
    IF NOT FOUND THEN -- (removed or changed meanwhile: look again, a few times)
      v_misses := v_misses + 1;
      EXIT WHEN v_misses > 3;
      CONTINUE;
    END IF;
    IF v_due > p_now THEN
      PERFORM publish_event(p_queue, 'delayed', jsonb_build_object('jobId', v_job.id, 'delay', v_due));
    ELSE
      PERFORM publish_event(p_queue, 'waiting',
        jsonb_build_object('jobId', v_job.id, 'prev', 'waiting-children'));
    END IF;
    v_running := v_running + 1;
    v_released := v_released + 1;
  END LOOP;
  -- Wake listening workers as upstream's add does, but coalesced as upstream's publish_event
  -- coalesces its wake-ups: PostgreSQL serialises the commits of every transaction that NOTIFYs
  -- (one database-wide lock, held through the commit's flush), which would put the finishes of
  -- all groups single file. Only one releasing transaction of the queue at a time notifies; one
  -- that skips is concurrent with it, and its released job is claimed by its own worker's fetch
  -- (upstream's finish-and-fetch runs after this trigger in the same transaction), by the next
  -- wake-up, or at a listener's block timeout.
  IF v_released > 0 AND pg_try_advisory_xact_lock(hashtext('bullmq_compat:jobs-notify:' || p_queue)) THEN
    PERFORM pg_notify('bullmq_jobs', p_queue);
  END IF;
  RETURN v_released;
END;
$$;

CREATE FUNCTION bullmq_compat_release(p_queue text, p_gid text, p_now bigint) RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM bullmq_compat_lock_group(p_queue, p_gid);
  RETURN bullmq_compat_release_locked(p_queue, p_gid, p_now);
END;
$$;

-- The gate's decision for a group job arriving in wait/delayed (added, or moved there from done or
-- held by someone else than the gate): true when it may go, false when it must be held. Holds the
-- group lock from here on. p_seq: its add sequence (its place among equal orders).
CREATE FUNCTION bullmq_compat_may_pass(p_queue text, p_gid text, p_order bigint, p_seq bigint,
                                       p_ordered boolean, p_ordering_delay_ms bigint, p_paused boolean,
                                       p_concurrency integer)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
  -- with an ordering delay, a full group gives the slot of its latest not-yet-started job to this
  -- earlier one
  IF p_ordered AND p_ordering_delay_ms > 0 AND NOT p_paused
     AND bullmq_compat_running(p_queue, p_gid) >= p_concurrency THEN
    PERFORM bullmq_compat_reclaim(p_queue, p_gid, p_order);
  END IF;
  IF p_paused OR bullmq_compat_running(p_queue, p_gid) >= p_concurrency THEN
    RETURN false;
  END IF;
  RETURN NOT EXISTS (
    SELECT 1 FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state = 'waiting-children' AND pending_deps = 0
       AND (bullmq_compat_group_order(opts, added_at_ms), abs(seq)) < (p_order, abs(p_seq)));
END;
$$;

-- BEFORE INSERT: a new group job.
CREATE FUNCTION bullmq_compat_gate_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text := bullmq_compat_gid(NEW.opts);
  v_set record;
  v_order bigint;
  v_due bigint;
BEGIN
  IF v_gid IS NULL OR NEW.state NOT IN ('waiting', 'delayed') THEN
    RETURN NEW; -- not a group job, or a flow parent (refused by the clients; left to upstream)
  END IF;
  PERFORM bullmq_compat_lock_group(NEW.queue, v_gid);
  -- upstream's add is INSERT ... ON CONFLICT DO NOTHING, and a BEFORE trigger fires before the
  -- conflict is found: an id that exists will not be inserted, so the gate must change nothing
  -- (checked under the lock: a concurrent add of the id has committed by now)
  IF EXISTS (SELECT 1 FROM job WHERE queue = NEW.queue AND id = NEW.id) THEN
    RETURN NEW;
  END IF;
  SELECT * INTO v_set FROM bullmq_compat_group_settings(NEW.queue, v_gid);
  v_order := bullmq_compat_group_order(NEW.opts, NEW.added_at_ms);
  IF NOT bullmq_compat_may_pass(NEW.queue, v_gid, v_order, NEW.seq, bullmq_compat_order_ms(NEW.opts) IS NOT NULL,
                                v_set.ordering_delay_ms, v_set.paused, v_set.concurrency) THEN
    NEW.state := 'waiting-children';
    NEW.process_at_ms := NULL;
    PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
    RETURN NEW;
  END IF;
  v_due := bullmq_compat_due(NEW.opts, NEW.added_at_ms, NEW.delay_ms, v_set.ordering_delay_ms);
  IF v_due > bullmq_compat_now() AND v_due > COALESCE(NEW.process_at_ms, 0) THEN
    NEW.state := 'delayed'; -- its ordering window
    NEW.process_at_ms := v_due;
    PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
  END IF;
  RETURN NEW;
END;
$$;

-- BEFORE UPDATE OF state: a released group job whose turn ends, or a done or held group job moved
-- to wait/delayed by an upstream function.
CREATE FUNCTION bullmq_compat_gate_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text := bullmq_compat_gid(NEW.opts);
  v_parent_gid text;
  v_set record;
BEGIN
  IF v_gid IS NULL OR pg_trigger_depth() > 1 THEN
    RETURN NEW; -- not a group job, or our own release (a statement run by a trigger of ours)
  END IF;
  IF OLD.state IN ('waiting', 'active', 'delayed') AND NEW.state IN ('completed', 'failed', 'waiting-children') THEN
    -- a released job whose turn ends: the group's next job goes (this one is still counted)
    IF NEW.parent_id IS NOT NULL THEN
      -- upstream may move its parent in this transaction: a parent of a group that comes first is
      -- locked first, so that its lock is not taken out of order then
      SELECT bullmq_compat_gid(opts) INTO v_parent_gid FROM job WHERE queue = NEW.parent_queue AND id = NEW.parent_id;
      IF v_parent_gid IS NOT NULL
         AND (NEW.parent_queue || chr(1) || v_parent_gid) COLLATE "C" < (NEW.queue || chr(1) || v_gid) COLLATE "C" THEN
        PERFORM bullmq_compat_lock_group(NEW.parent_queue, v_parent_gid);
      END IF;
    END IF;
    PERFORM bullmq_compat_lock_group(NEW.queue, v_gid);
    PERFORM bullmq_compat_release_locked(NEW.queue, v_gid, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 1);
    RETURN NEW;
  END IF;
  IF OLD.state NOT IN ('completed', 'failed', 'waiting-children') OR NEW.state NOT IN ('waiting', 'delayed') THEN
    RETURN NEW; -- not an arrival
  END IF;
  PERFORM bullmq_compat_lock_group(NEW.queue, v_gid);
  SELECT * INTO v_set FROM bullmq_compat_group_settings(NEW.queue, v_gid);
  -- (its place among equal orders is its seq before the move: our own release, from an API function,
  -- gives the job a fresh one, and passes here as the group's head)
  IF bullmq_compat_may_pass(NEW.queue, v_gid, bullmq_compat_group_order(NEW.opts, NEW.added_at_ms), OLD.seq,
                            false, 0, v_set.paused, v_set.concurrency) THEN
    RETURN NEW;
  END IF;
  NEW.state := 'waiting-children';
  NEW.process_at_ms := NULL;
  PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
  RETURN NEW;
END;
$$;

-- AFTER DELETE: a released group job removed.
CREATE FUNCTION bullmq_compat_release_trigger() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text;
BEGIN
  IF pg_trigger_depth() > 1 OR OLD.state NOT IN ('waiting', 'active', 'delayed') THEN
    RETURN NULL; -- our own release, or a job that was not running
  END IF;
  v_gid := bullmq_compat_gid(OLD.opts);
  IF v_gid IS NOT NULL THEN
    PERFORM bullmq_compat_lock_group(OLD.queue, v_gid);
    PERFORM bullmq_compat_release_locked(OLD.queue, v_gid, (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
  END IF;
  RETURN NULL;
END;
$$;

-- The jobs the gate held (or sent to delayed) in the running transaction, with the event id
-- upstream's events about them will be above. Unlogged: a row lives only until its commit.
CREATE UNLOGGED TABLE bullmq_compat_gated (
  txid   xid8   NOT NULL DEFAULT pg_current_xact_id(),
  queue  text   NOT NULL,
  job_id text   NOT NULL,
  mark   bigint NOT NULL
);
CREATE INDEX bullmq_compat_gated_txid_idx ON bullmq_compat_gated (txid);

CREATE FUNCTION bullmq_compat_note_gated(p_queue text, p_id text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  -- (event ids handed out from now on are at least the sequence's last value)
  INSERT INTO bullmq_compat_gated (queue, job_id, mark) SELECT p_queue, p_id, last_value FROM event_seq;
END;
$$;

-- At commit (a deferred constraint trigger on bullmq_compat_gated; the first of the transaction's
-- notes does them all, in one pass over the transaction's events): an add's (or a retry's)
-- 'waiting' event, published by upstream's function after the gate held the job, says
-- 'waiting-children'; for a job the gate sent to delayed (its ordering window), 'delayed' with its
-- due time.
CREATE FUNCTION bullmq_compat_gated_events() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  r record;
  v_state job_state;
  v_due bigint;
  v_queues text[] := '{}';
  v_ids text[] := '{}';
  v_held jsonb[] := '{}';
  v_marks bigint[] := '{}';
  v_queue text;
  v_mark bigint;
  v_map jsonb;
BEGIN
  IF current_setting('bullmq_compat.gated_done', true) = '1' THEN
    RETURN NULL; -- (a setting of this transaction only)
  END IF;
  PERFORM set_config('bullmq_compat.gated_done', '1', true);
  -- (one lookup per note by primary key, then one pass over the transaction's events: no join
  -- left to the planner, whose estimates for these fresh rows are far off)
  FOR r IN DELETE FROM bullmq_compat_gated WHERE txid = pg_current_xact_id() RETURNING queue, job_id, mark LOOP
    SELECT state, process_at_ms INTO v_state, v_due FROM job
     WHERE queue = r.queue AND id = r.job_id AND opts ? 'group';
    IF v_state IN ('waiting-children', 'delayed') THEN
      v_queues := v_queues || r.queue;
      v_ids := v_ids || r.job_id;
      v_held := v_held || jsonb_build_array(v_state, v_due);
      v_marks := v_marks || r.mark;
    END IF;
  END LOOP;
  FOR v_queue, v_mark IN SELECT q, min(m) FROM unnest(v_queues, v_marks) AS t(q, m) GROUP BY q LOOP
    SELECT jsonb_object_agg(i, h) INTO v_map FROM unnest(v_queues, v_ids, v_held) AS t(q, i, h) WHERE q = v_queue;
    UPDATE event
       SET event = v_map -> (data ->> 'jobId') ->> 0,
           data = CASE WHEN v_map -> (data ->> 'jobId') ->> 0 = 'waiting-children' THEN data - 'delay'
                       ELSE jsonb_build_object('jobId', data ->> 'jobId', 'delay', v_map -> (data ->> 'jobId') -> 1) END
     WHERE queue = v_queue AND id >= v_mark AND xmin = pg_current_xact_id()::xid
       AND event IN ('waiting', 'delayed') AND v_map ? (data ->> 'jobId')
       AND (event = 'waiting' OR v_map -> (data ->> 'jobId') ->> 0 = 'waiting-children');
  END LOOP;
  RETURN NULL;
END;
$$;

CREATE TRIGGER bullmq_compat_gate_insert
  BEFORE INSERT ON job
  FOR EACH ROW WHEN (NEW.opts ? 'group')
  EXECUTE FUNCTION bullmq_compat_gate_insert();

CREATE TRIGGER bullmq_compat_gate_update
  BEFORE UPDATE OF state ON job
  FOR EACH ROW WHEN (NEW.opts ? 'group')
  EXECUTE FUNCTION bullmq_compat_gate_update();

CREATE TRIGGER bullmq_compat_release_delete
  AFTER DELETE ON job
  FOR EACH ROW WHEN (OLD.opts ? 'group')
  EXECUTE FUNCTION bullmq_compat_release_trigger();

CREATE CONSTRAINT TRIGGER bullmq_compat_gated_events
  AFTER INSERT ON bullmq_compat_gated DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION bullmq_compat_gated_events();

-- ── The group API (Queue's methods; bullmq_compat/_backends/postgres/groups.py) ──────────────

-- Settings. p_gid NULL: the queue's default. Releases what the new setting lets go.
CREATE FUNCTION bullmq_compat_set_group(p_queue text, p_gid text, p_field text, p_value bigint, p_now bigint)
RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text;
  v_n integer := 0;
BEGIN
  IF p_gid IS NULL THEN
    INSERT INTO bullmq_compat_group_queue (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    IF p_field = 'concurrency' THEN
      UPDATE bullmq_compat_group_queue SET concurrency = p_value WHERE queue = p_queue;
    ELSIF p_field = 'ordering_delay_ms' THEN
      UPDATE bullmq_compat_group_queue SET ordering_delay_ms = p_value WHERE queue = p_queue;
    ELSE
      RAISE EXCEPTION 'bullmq-compat: unknown queue group setting %', p_field;
    END IF;
    IF p_field = 'concurrency' THEN -- every group with held jobs may have slots now
      FOR v_gid IN SELECT DISTINCT bullmq_compat_gid(opts) FROM job
                    WHERE queue = p_queue AND opts ? 'group' AND state = 'waiting-children' LOOP
        v_n := v_n + bullmq_compat_release(p_queue, v_gid, p_now);
      END LOOP;
    END IF;
    RETURN v_n;
  END IF;
  PERFORM bullmq_compat_lock_group(p_queue, p_gid);
  INSERT INTO bullmq_compat_group (queue, gid) VALUES (p_queue, p_gid) ON CONFLICT DO NOTHING;
  IF p_field = 'concurrency' THEN
    UPDATE bullmq_compat_group SET concurrency = p_value WHERE queue = p_queue AND gid = p_gid;
  ELSIF p_field = 'ordering_delay_ms' THEN
    UPDATE bullmq_compat_group SET ordering_delay_ms = p_value WHERE queue = p_queue AND gid = p_gid;
  ELSIF p_field = 'paused' THEN
    UPDATE bullmq_compat_group SET paused = p_value <> 0 WHERE queue = p_queue AND gid = p_gid;
  ELSE
    RAISE EXCEPTION 'bullmq-compat: unknown group setting %', p_field;
  END IF;
  -- a group back to all defaults needs no row
  DELETE FROM bullmq_compat_group
   WHERE queue = p_queue AND gid = p_gid AND concurrency IS NULL AND NOT paused AND ordering_delay_ms IS NULL;
  RETURN bullmq_compat_release_locked(p_queue, p_gid, p_now);
END;
$$;

-- Remove the group's held jobs (released ones are left) with upstream's remove; returns how many.
CREATE FUNCTION bullmq_compat_delete_group_jobs(p_queue text, p_gid text) RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_id text;
  v_n integer := 0;
BEGIN
  PERFORM bullmq_compat_lock_group(p_queue, p_gid);
  FOR v_id IN SELECT id FROM job
               WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
                 AND state = 'waiting-children' AND pending_deps = 0 LOOP
    v_n := v_n + remove(p_queue, v_id, true);
  END LOOP;
  RETURN v_n;
END;
$$;

-- Every group of the queue: (gid, held, running, paused, concurrency), by gid.
CREATE FUNCTION bullmq_compat_list_groups(p_queue text)
RETURNS TABLE (gid text, waiting integer, running integer, paused boolean, concurrency integer)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
  WITH counts AS (
    SELECT bullmq_compat_gid(opts) AS gid,
           count(*) FILTER (WHERE state = 'waiting-children' AND pending_deps = 0)::integer AS waiting,
           count(*) FILTER (WHERE state IN ('waiting', 'active', 'delayed'))::integer AS running
      FROM job
     WHERE queue = p_queue AND opts ? 'group' AND state IN ('waiting', 'active', 'delayed', 'waiting-children')
     GROUP BY 1
  ), gids AS (
    SELECT gid FROM counts WHERE gid IS NOT NULL AND (waiting > 0 OR running > 0)
    UNION SELECT gid FROM bullmq_compat_group WHERE queue = p_queue AND paused
  )
  SELECT g.gid, COALESCE(c.waiting, 0), COALESCE(c.running, 0), s.paused, s.concurrency
    FROM gids g
    LEFT JOIN counts c ON c.gid = g.gid
    CROSS JOIN LATERAL bullmq_compat_group_settings(p_queue, g.gid) s
   ORDER BY g.gid
$$;

-- Group affinity of a batch: the group's next held jobs straight into active, one per token, as
-- upstream's move_to_active prepares a job ('waiting' then 'active' events). Stops at: no held job
-- left, the group or the queue paused, or a held job not due yet.
CREATE FUNCTION bullmq_compat_take_group_jobs(p_queue text, p_gid text, p_tokens text[], p_lock_ms bigint,
                                              p_now bigint, p_name text)
RETURNS SETOF job
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_set record;
  v_job job;
  v_token text;
BEGIN
  IF EXISTS (SELECT 1 FROM meta WHERE queue = p_queue AND field = 'paused' AND value = '1') THEN
    RETURN;
  END IF;
  PERFORM bullmq_compat_lock_group(p_queue, p_gid);
  SELECT * INTO v_set FROM bullmq_compat_group_settings(p_queue, p_gid);
  IF v_set.paused THEN
    RETURN;
  END IF;
  FOREACH v_token IN ARRAY p_tokens LOOP
    SELECT * INTO v_job FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state = 'waiting-children' AND pending_deps = 0
     ORDER BY bullmq_compat_group_order(opts, added_at_ms), abs(seq)
     LIMIT 1
     FOR UPDATE;
    EXIT WHEN NOT FOUND;
    EXIT WHEN bullmq_compat_due(v_job.opts, v_job.added_at_ms, v_job.delay_ms, v_set.ordering_delay_ms) > p_now;
    UPDATE job
       SET state = 'active', seq = nextval('job_seq'), process_at_ms = NULL, delay_ms = 0,
           lock_token = v_token, locked_until_ms = p_now + p_lock_ms, processed_at_ms = p_now,
           processed_by = p_name, attempts_started = attempts_started + 1
     WHERE queue = p_queue AND id = v_job.id
    RETURNING * INTO v_job;
    PERFORM publish_event(p_queue, 'waiting', jsonb_build_object('jobId', v_job.id, 'prev', 'waiting-children'));
    PERFORM publish_event(p_queue, 'active', jsonb_build_object('jobId', v_job.id, 'prev', 'waiting'));
    RETURN NEXT v_job;
  END LOOP;
END;
$$;

-- Repair: release every group of the queue that has held jobs and free slots (needed only for jobs
-- added before the gate was installed, or held by an interrupted drop/install); returns how many.
CREATE FUNCTION bullmq_compat_sweep_groups(p_queue text, p_now bigint) RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text;
  v_n integer := 0;
BEGIN
  FOR v_gid IN SELECT DISTINCT bullmq_compat_gid(opts) FROM job
                WHERE queue = p_queue AND opts ? 'group' AND state = 'waiting-children'
                  AND bullmq_compat_gid(opts) IS NOT NULL LOOP
    v_n := v_n + bullmq_compat_release(p_queue, v_gid, p_now);
  END LOOP;
  RETURN v_n;
END;
$$;
