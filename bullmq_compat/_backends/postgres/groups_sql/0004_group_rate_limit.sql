-- bullmq-compat's per-group gate on PostgreSQL, version 4: group rate limits (BullMQ Pro's
-- group.limit, rateLimitGroup, getGroupRateLimitTtl; docs/groups.md, "Group rate limits").
--
-- At most rate_max jobs of a group start in any window of rate_duration_ms (a sliding window).
-- Starts happen in upstream's move_to_active (a Node worker's too), which we do not touch, so the
-- gate decides when a job becomes available instead: a group's next job is released due at a time
-- d such that the group's starts in (d - duration, d], plus its released jobs not started yet (each
-- may start at any moment), plus itself, are at most max; a job due later is released to 'delayed'
-- with process_at_ms d (upstream's move_to_active promotes it then, whichever worker calls it), as
-- an ordering delay does. A start is the job's processed_at_ms; the starts of jobs whose turn has
-- ended are kept in bullmq_compat_group_start (written by the release, in the transaction that ends
-- the turn; trimmed there). Jobs started before the group had a limit do not count.
--
-- The manual limit (Worker.rate_limit_group -> bullmq_compat_rate_limit_job) stores rate_until_ms
-- on the group's row: nothing of the group is due before it; the active job that asked goes back to
-- 'delayed' until then, keeping its group's slot, and so do the group's released jobs not started.
--
-- Upgrading a version-3 schema adds columns and a table, and replaces bullmq_compat_release_locked,
-- bullmq_compat_gate_insert, bullmq_compat_set_group and bullmq_compat_take_group_jobs in place (same
-- signatures; triggers and jobs are left as they are).

ALTER TABLE bullmq_compat_group
  ADD COLUMN rate_max integer,           -- NULL: the queue's default (if any)
  ADD COLUMN rate_duration_ms bigint,
  ADD COLUMN rate_until_ms bigint;       -- the manual limit's end (ms), NULL: none
ALTER TABLE bullmq_compat_group_queue
  ADD COLUMN rate_max integer,           -- the default of the queue's groups (NULL: none)
  ADD COLUMN rate_duration_ms bigint;

-- The starts of a rate-limited group's jobs whose turn has ended (its running jobs are read from job).
CREATE TABLE bullmq_compat_group_start (
  queue         text   NOT NULL,
  gid           text   NOT NULL,
  id            text   NOT NULL,
  started_at_ms bigint NOT NULL,
  PRIMARY KEY (queue, gid, id)
);
CREATE INDEX bullmq_compat_group_start_time_idx ON bullmq_compat_group_start (queue, gid, started_at_ms);

-- A group's rate limit in force: (max, duration ms: its own, else the queue's; NULL: none) and the
-- end of its manual limit (0: none).
CREATE FUNCTION bullmq_compat_rate_limit(p_queue text, p_gid text,
                                         OUT max integer, OUT duration_ms bigint, OUT until_ms bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  SELECT CASE WHEN g.rate_max IS NOT NULL THEN g.rate_max ELSE q.rate_max END,
         CASE WHEN g.rate_max IS NOT NULL THEN g.rate_duration_ms ELSE q.rate_duration_ms END,
         COALESCE(g.rate_until_ms, 0)
    INTO max, duration_ms, until_ms
    FROM (SELECT 1) AS one
    LEFT JOIN bullmq_compat_group g ON g.queue = p_queue AND g.gid = p_gid
    LEFT JOIN bullmq_compat_group_queue q ON q.queue = p_queue;
END;
$$;

-- When the group's next job may be due by its rate limits (ms, >= p_now), or NULL when none may be
-- released now (its released jobs not started yet fill the limit: the next finish looks again).
-- Also keeps the start log: the starts of the group's released jobs are logged (the job whose turn
-- ends in this transaction is still one of them for a BEFORE UPDATE trigger), old ones trimmed.
-- The caller holds the group lock.
CREATE FUNCTION bullmq_compat_rate_due(p_queue text, p_gid text, p_now bigint, p_max integer,
                                       p_duration_ms bigint, p_until_ms bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
  v_unstarted integer;
  v_known integer;
  v_allowed integer;
  v_due bigint := p_now;
  v_t bigint;
BEGIN
  IF p_max IS NOT NULL THEN
    INSERT INTO bullmq_compat_group_start (queue, gid, id, started_at_ms)
    SELECT queue, p_gid, id, processed_at_ms FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state IN ('waiting', 'active', 'delayed') AND processed_at_ms IS NOT NULL
    ON CONFLICT DO NOTHING;
    DELETE FROM bullmq_compat_group_start
     WHERE queue = p_queue AND gid = p_gid AND started_at_ms <= p_now - p_duration_ms;
    SELECT count(*)::integer INTO v_unstarted FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state IN ('waiting', 'active', 'delayed') AND processed_at_ms IS NULL;
    v_allowed := p_max - v_unstarted - 1;
    IF v_allowed < 0 THEN
      RETURN NULL;
    END IF;
    SELECT count(*)::integer INTO v_known FROM bullmq_compat_group_start WHERE queue = p_queue AND gid = p_gid;
    IF v_known > v_allowed THEN
      SELECT started_at_ms INTO v_t FROM bullmq_compat_group_start
       WHERE queue = p_queue AND gid = p_gid
       ORDER BY started_at_ms OFFSET v_known - v_allowed - 1 LIMIT 1;
      v_due := GREATEST(v_due, v_t + p_duration_ms);
    END IF;
  END IF;
  RETURN GREATEST(v_due, COALESCE(p_until_ms, 0));
END;
$$;

-- Release the group's next held jobs while it has free slots (version 1's, with the rate limit: a
-- job not due yet by it goes to 'delayed'); returns how many were released. The caller holds the
-- group lock.
CREATE OR REPLACE FUNCTION bullmq_compat_release_locked(p_queue text, p_gid text, p_now bigint,
                                                        p_leaving integer DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
  v_concurrency integer;
  v_paused boolean;
  v_ordering_delay_ms bigint;
  v_rate_max integer;
  v_rate_duration_ms bigint;
  v_rate_until_ms bigint;
  v_rated boolean;
  v_rate_due bigint;
  v_running integer;
  v_job record;
  v_due bigint;
  v_seq bigint;
  v_released integer := 0;
  v_misses integer := 0;
BEGIN
  -- (the settings and the count written out here, not called: this runs on every group job's finish)
  SELECT COALESCE(g.concurrency, q.concurrency, 1), COALESCE(g.paused, false),
         COALESCE(g.ordering_delay_ms, q.ordering_delay_ms, 0),
         CASE WHEN g.rate_max IS NOT NULL THEN g.rate_max ELSE q.rate_max END,
         CASE WHEN g.rate_max IS NOT NULL THEN g.rate_duration_ms ELSE q.rate_duration_ms END,
         g.rate_until_ms
    INTO v_concurrency, v_paused, v_ordering_delay_ms, v_rate_max, v_rate_duration_ms, v_rate_until_ms
    FROM (SELECT 1) AS one
    LEFT JOIN bullmq_compat_group g ON g.queue = p_queue AND g.gid = p_gid
    LEFT JOIN bullmq_compat_group_queue q ON q.queue = p_queue;
  v_rated := v_rate_max IS NOT NULL OR v_rate_until_ms > p_now;
  IF v_rate_max IS NOT NULL AND (v_paused OR p_leaving > 0) THEN
    PERFORM bullmq_compat_rate_due(p_queue, p_gid, p_now, v_rate_max, v_rate_duration_ms, v_rate_until_ms);
  END IF;
  IF v_paused THEN
    RETURN 0; -- (the start of a job whose turn ends is logged above all the same)
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
    IF v_rated THEN
      -- (the leaving job is still 'active' here: counted among the group's starts, never as unstarted)
      v_rate_due := bullmq_compat_rate_due(p_queue, p_gid, p_now, v_rate_max, v_rate_duration_ms, v_rate_until_ms);
      EXIT WHEN v_rate_due IS NULL;
      v_due := GREATEST(v_due, v_rate_due);
    END IF;
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
  -- Wake listening workers as upstream's add does, coalesced (see version 1)
  IF v_released > 0 AND pg_try_advisory_xact_lock(hashtext('bullmq_compat:jobs-notify:' || p_queue)) THEN
    PERFORM pg_notify('bullmq_jobs', p_queue);
  END IF;
  RETURN v_released;
END;
$$;

-- BEFORE INSERT: a new group job (version 2's, with the rate limit: a job that may pass but is not
-- due yet by its group's rate limit is added 'delayed'; one that may not be released now is held).
CREATE OR REPLACE FUNCTION bullmq_compat_gate_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text := bullmq_compat_gid(NEW.opts);
  v_set record;
  v_rate record;
  v_rate_due bigint;
  v_order bigint;
  v_due bigint;
  v_max bigint;
  v_now bigint;
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
  v_max := bullmq_compat_max_size(NEW.opts);
  IF v_max IS NOT NULL AND bullmq_compat_group_is_full(NEW.queue, v_gid, v_max) THEN
    RAISE EXCEPTION 'bullmq-compat: group % of queue % already holds maxSize=% jobs not started yet: the job was not added',
                    quote_literal(v_gid), quote_literal(NEW.queue), v_max
      USING ERRCODE = 'BQG01',
            DETAIL = jsonb_build_object('queue', NEW.queue, 'group', v_gid, 'maxSize', v_max)::text,
            HINT = 'the group counts its held jobs and its released jobs not yet active; retry once it has run some';
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
  v_now := bullmq_compat_now();
  v_due := bullmq_compat_due(NEW.opts, NEW.added_at_ms, NEW.delay_ms, v_set.ordering_delay_ms);
  SELECT * INTO v_rate FROM bullmq_compat_rate_limit(NEW.queue, v_gid);
  IF v_rate.max IS NOT NULL OR v_rate.until_ms > v_now THEN
    v_rate_due := bullmq_compat_rate_due(NEW.queue, v_gid, v_now, v_rate.max, v_rate.duration_ms, v_rate.until_ms);
    IF v_rate_due IS NULL THEN -- its group's released jobs not started yet fill the rate limit
      NEW.state := 'waiting-children';
      NEW.process_at_ms := NULL;
      PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
      RETURN NEW;
    END IF;
    v_due := GREATEST(v_due, v_rate_due);
  END IF;
  IF v_due > v_now AND v_due > COALESCE(NEW.process_at_ms, 0) THEN
    NEW.state := 'delayed'; -- its ordering window, or its group's rate limit
    NEW.process_at_ms := v_due;
    PERFORM bullmq_compat_note_gated(NEW.queue, NEW.id);
  END IF;
  RETURN NEW;
END;
$$;

-- Settings (version 1's; a group's row also goes once its rate settings are gone).
CREATE OR REPLACE FUNCTION bullmq_compat_set_group(p_queue text, p_gid text, p_field text, p_value bigint, p_now bigint)
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
  PERFORM bullmq_compat_forget_default_group(p_queue, p_gid);
  RETURN bullmq_compat_release_locked(p_queue, p_gid, p_now);
END;
$$;

-- A group back to all defaults needs no row.
CREATE FUNCTION bullmq_compat_forget_default_group(p_queue text, p_gid text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  DELETE FROM bullmq_compat_group
   WHERE queue = p_queue AND gid = p_gid AND concurrency IS NULL AND NOT paused AND ordering_delay_ms IS NULL
     AND rate_max IS NULL AND rate_until_ms IS NULL;
END;
$$;

-- A group's rate limit (p_gid NULL: the queue's default); p_max NULL removes the setting. Releases
-- what a looser limit lets go now (a job already in 'delayed' keeps its due time).
CREATE FUNCTION bullmq_compat_set_group_rate_limit(p_queue text, p_gid text, p_max integer, p_duration_ms bigint,
                                                   p_now bigint)
RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF (p_max IS NULL) <> (p_duration_ms IS NULL) OR p_max < 1 OR p_duration_ms < 1 THEN
    RAISE EXCEPTION 'bullmq-compat: a group rate limit needs max >= 1 and duration >= 1 (ms), got % / %',
                    p_max, p_duration_ms;
  END IF;
  IF p_gid IS NULL THEN
    INSERT INTO bullmq_compat_group_queue (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    UPDATE bullmq_compat_group_queue SET rate_max = p_max, rate_duration_ms = p_duration_ms WHERE queue = p_queue;
    RETURN 0;
  END IF;
  PERFORM bullmq_compat_lock_group(p_queue, p_gid);
  INSERT INTO bullmq_compat_group (queue, gid) VALUES (p_queue, p_gid) ON CONFLICT DO NOTHING;
  UPDATE bullmq_compat_group SET rate_max = p_max, rate_duration_ms = p_duration_ms
   WHERE queue = p_queue AND gid = p_gid;
  PERFORM bullmq_compat_forget_default_group(p_queue, p_gid);
  RETURN bullmq_compat_release_locked(p_queue, p_gid, p_now);
END;
$$;

-- Ms before the group may start another job by its rate limits (0: now; its duration when its
-- released jobs not started yet fill the limit).
CREATE FUNCTION bullmq_compat_group_rate_ttl(p_queue text, p_gid text, p_now bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_rate record;
  v_due bigint;
BEGIN
  SELECT * INTO v_rate FROM bullmq_compat_rate_limit(p_queue, p_gid);
  IF v_rate.max IS NULL AND v_rate.until_ms <= p_now THEN
    RETURN 0;
  END IF;
  -- (the start log is written under the group's lock, as by the releases: no two writers interleave)
  PERFORM bullmq_compat_lock_group(p_queue, p_gid);
  v_due := bullmq_compat_rate_due(p_queue, p_gid, p_now, v_rate.max, v_rate.duration_ms, v_rate.until_ms);
  IF v_due IS NULL THEN
    RETURN v_rate.duration_ms;
  END IF;
  RETURN GREATEST(0, v_due - p_now);
END;
$$;

-- The manual group rate limit (Worker.rate_limit_group): the active job p_id (lock p_token, checked
-- as upstream's move_to_delayed checks it: BM001 -1 missing, -3 not active, -6 lock mismatch; -9 not
-- a group job) goes back to 'delayed' until p_now + p_ms, not started (processed_at_ms cleared) and
-- keeping its group's slot; its group starts nothing before then: its released jobs not started
-- yet are delayed until then too. Returns p_ms.
CREATE FUNCTION bullmq_compat_rate_limit_job(p_queue text, p_id text, p_token text, p_ms bigint, p_now bigint)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text;
  v_state job_state;
  v_lock text;
  v_until bigint := p_now + p_ms;
  v_id text;
BEGIN
  IF p_ms IS NULL OR p_ms < 1 THEN
    RAISE EXCEPTION 'bullmq-compat: a group rate limit needs ms >= 1, got %', p_ms;
  END IF;
  SELECT bullmq_compat_gid(opts), state, lock_token INTO v_gid, v_state, v_lock
    FROM job WHERE queue = p_queue AND id = p_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'bullmq: missing job %', p_id USING ERRCODE = 'BM001', DETAIL = '-1';
  END IF;
  IF v_gid IS NULL THEN
    RAISE EXCEPTION 'bullmq-compat: job % is not a group job', p_id USING ERRCODE = 'BM001', DETAIL = '-9';
  END IF;
  PERFORM bullmq_compat_lock_group(p_queue, v_gid);
  SELECT state, lock_token INTO v_state, v_lock FROM job WHERE queue = p_queue AND id = p_id FOR UPDATE;
  IF v_state <> 'active' THEN
    RAISE EXCEPTION 'bullmq: job % not active', p_id USING ERRCODE = 'BM001', DETAIL = '-3';
  END IF;
  IF v_lock IS DISTINCT FROM p_token THEN
    RAISE EXCEPTION 'bullmq: job % lock mismatch', p_id USING ERRCODE = 'BM001', DETAIL = '-6';
  END IF;
  INSERT INTO bullmq_compat_group (queue, gid) VALUES (p_queue, v_gid) ON CONFLICT DO NOTHING;
  UPDATE bullmq_compat_group SET rate_until_ms = GREATEST(COALESCE(rate_until_ms, 0), v_until)
   WHERE queue = p_queue AND gid = v_gid;
  UPDATE job SET state = 'delayed', process_at_ms = v_until, lock_token = NULL, locked_until_ms = NULL,
                 processed_at_ms = NULL
   WHERE queue = p_queue AND id = p_id;
  DELETE FROM bullmq_compat_group_start WHERE queue = p_queue AND gid = v_gid AND id = p_id; -- (not started after all)
  PERFORM publish_event(p_queue, 'delayed', jsonb_build_object('jobId', p_id, 'delay', v_until));
  FOR v_id IN
    UPDATE job SET state = 'delayed', process_at_ms = v_until
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = v_gid AND id <> p_id
       AND processed_at_ms IS NULL
       AND (state = 'waiting' OR (state = 'delayed' AND process_at_ms < v_until))
    RETURNING id
  LOOP
    PERFORM publish_event(p_queue, 'delayed', jsonb_build_object('jobId', v_id, 'delay', v_until));
  END LOOP;
  PERFORM pg_notify('bullmq_jobs', p_queue);
  RETURN p_ms;
END;
$$;

-- Group affinity of a batch (version 1's, with the rate limit: it stops at a job its group's rate
-- limit would make due later; the gate releases that one, delayed, when its turn comes).
CREATE OR REPLACE FUNCTION bullmq_compat_take_group_jobs(p_queue text, p_gid text, p_tokens text[], p_lock_ms bigint,
                                                         p_now bigint, p_name text)
RETURNS SETOF job
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_set record;
  v_rate record;
  v_rate_due bigint;
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
  SELECT * INTO v_rate FROM bullmq_compat_rate_limit(p_queue, p_gid);
  FOREACH v_token IN ARRAY p_tokens LOOP
    SELECT * INTO v_job FROM job
     WHERE queue = p_queue AND opts ? 'group' AND bullmq_compat_gid(opts) = p_gid
       AND state = 'waiting-children' AND pending_deps = 0
     ORDER BY bullmq_compat_group_order(opts, added_at_ms), abs(seq)
     LIMIT 1
     FOR UPDATE;
    EXIT WHEN NOT FOUND;
    EXIT WHEN bullmq_compat_due(v_job.opts, v_job.added_at_ms, v_job.delay_ms, v_set.ordering_delay_ms) > p_now;
    IF v_rate.max IS NOT NULL OR v_rate.until_ms > p_now THEN
      v_rate_due := bullmq_compat_rate_due(p_queue, p_gid, p_now, v_rate.max, v_rate.duration_ms, v_rate.until_ms);
      EXIT WHEN v_rate_due IS NULL OR v_rate_due > p_now;
    END IF;
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

-- Every group of the queue with its rate-limit state: (gid, rate max, rate duration ms, ttl ms);
-- only groups with a limit in force (set, or a manual one not over).
CREATE FUNCTION bullmq_compat_list_group_rates(p_queue text, p_now bigint)
RETURNS TABLE (gid text, rate_max integer, rate_duration_ms bigint, ttl bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_gid text;
  v_rate record;
BEGIN
  FOR v_gid IN SELECT l.gid FROM bullmq_compat_list_groups(p_queue) l LOOP
    SELECT * INTO v_rate FROM bullmq_compat_rate_limit(p_queue, v_gid);
    IF v_rate.max IS NOT NULL OR v_rate.until_ms > p_now THEN
      gid := v_gid;
      rate_max := v_rate.max;
      rate_duration_ms := v_rate.duration_ms;
      ttl := bullmq_compat_group_rate_ttl(p_queue, v_gid, p_now);
      RETURN NEXT;
    END IF;
  END LOOP;
END;
$$;
